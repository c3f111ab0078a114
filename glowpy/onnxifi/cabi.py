"""The glue the C library runs at its first call: each exported symbol becomes a call into `api`.

`install(ffi, lib)` is called by the library's embedding init code (see `build.py`) inside the
interpreter that serves the library: the host's own when a Python process loaded it through ctypes,
an embedded one otherwise. cffi takes the GIL around every call (from any host thread) and returns
INTERNAL_ERROR if something still escaped the API's own exception barrier. The Python side returns
status + 1 (see `build._entry_points`).
"""

from __future__ import annotations

import logging
from typing import Any

from glowpy.errors import Status
from glowpy.onnxifi import api
from glowpy.onnxifi import constants as C
from glowpy.onnxifi.build import ENTRY_PREFIX

log = logging.getLogger("glowpy.onnxifi")

# glowpy_onnxifi_symbol(i) in the C source returns the address of EXTENSION_FUNCTIONS[i].
_SYMBOL_INDEX = {name: i for i, name in enumerate(C.EXTENSION_FUNCTIONS)}


def _on_error(exc_type: Any, exc: Any, tb: Any) -> None:
    log.error("ONNXIFI call raised past the API barrier: %s: %s", getattr(exc_type, "__name__", exc_type), exc)


def install(ffi: Any, lib: Any) -> None:
    """Attach every exported function to its Python implementation."""
    cdata = ffi.CData

    def plain(value: Any) -> Any:
        return int(ffi.cast("uintptr_t", value)) if isinstance(value, cdata) else value

    for name in C.ALL_FUNCTIONS:
        impl = getattr(api, name)

        def call(*args: Any, _impl: Any = impl) -> int:
            return int(_impl(*[plain(a) for a in args])) + 1  # the C export subtracts it again

        ffi.def_extern(name=ENTRY_PREFIX + name, error=int(Status.INTERNAL_ERROR) + 1, onerror=_on_error)(call)

    for name, index in _SYMBOL_INDEX.items():
        api.EXTENSION_ADDRESSES[name] = int(lib.glowpy_onnxifi_symbol(index))
