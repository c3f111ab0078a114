"""Build `libonnxifi-glowpy.so`, the C ABI library around `glowpy.onnxifi.api` (cffi embedding mode).

The library exports the 15 core ONNXIFI functions and the two extension functions under their
spec names (prototypes from `include/onnxifi.h`, which the C source includes, so header and
library cannot disagree). Three things make it work under any host (DESIGN.md, known pitfalls):

* a constructor promotes libpython to global symbol scope (dlopen of sysconfig's INSTSONAME in
  LIBDIR with RTLD_NOW | RTLD_GLOBAL): hosts dlopen backends RTLD_LOCAL, and extension modules
  (_cffi_backend, numpy, llvmlite) would otherwise not find libpython's symbols;
* the constructor also points the embedded interpreter at the Python it was built with (its home)
  unless the host set PYTHONHOME, and the init code puts that Python's site-packages and the glowpy
  source root on sys.path, so a bare host (`env -i ./host`) finds everything;
* loaded into a running Python (ctypes), libpython is already there and cffi uses that interpreter.

cffi takes the GIL around each exported call, so host threads may call any function.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import site
import sys
import sysconfig
import tempfile
from pathlib import Path

LIBRARY_NAME = "libonnxifi-glowpy.so"
MODULE_NAME = "_glowpy_onnxifi"
INCLUDE_DIR = Path(__file__).resolve().parent / "include"
HEADER = INCLUDE_DIR / "onnxifi.h"
SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the glowpy package

# Types the embedding API needs; the structs stay opaque here (the C source has the real header).
_CDEF = """
typedef void* onnxBackendID;
typedef void* onnxBackend;
typedef void* onnxGraph;
typedef void* onnxEvent;
typedef int32_t onnxStatus;
typedef int32_t onnxBackendInfo;
typedef int32_t onnxEventState;
typedef struct onnxTensorDescriptorV1 onnxTensorDescriptorV1;
typedef struct onnxMemoryFenceV1 onnxMemoryFenceV1;
typedef onnxStatus (*onnxExtensionFunctionPointer)(void);
uintptr_t glowpy_onnxifi_symbol(int which);
"""

# The 17 functions (onnxifi-spec §6.1), parameters as (C type, name). From this one table come the
# cffi entry points (`glowpy_onnxifi_<name>`, Python behind them) and the exported C functions.
SIGNATURES: dict[str, list[tuple[str, str]]] = {
    "onnxGetBackendIDs": [("onnxBackendID*", "backendIDs"), ("size_t*", "numBackends")],
    "onnxReleaseBackendID": [("onnxBackendID", "backendID")],
    "onnxGetBackendInfo": [("onnxBackendID", "backendID"), ("onnxBackendInfo", "infoType"), ("void*", "infoValue"),
                           ("size_t*", "infoValueSize")],
    "onnxGetBackendCompatibility": [("onnxBackendID", "backendID"), ("size_t", "onnxModelSize"),
                                    ("const void*", "onnxModel")],
    "onnxInitBackend": [("onnxBackendID", "backendID"), ("const uint64_t*", "auxPropertiesList"),
                        ("onnxBackend*", "backend")],
    "onnxReleaseBackend": [("onnxBackend", "backend")],
    "onnxInitEvent": [("onnxBackend", "backend"), ("onnxEvent*", "event")],
    "onnxSignalEvent": [("onnxEvent", "event")],
    "onnxGetEventState": [("onnxEvent", "event"), ("onnxEventState*", "state")],
    "onnxWaitEvent": [("onnxEvent", "event")],
    "onnxReleaseEvent": [("onnxEvent", "event")],
    "onnxInitGraph": [("onnxBackend", "backend"), ("const uint64_t*", "auxPropertiesList"), ("size_t", "onnxModelSize"),
                      ("const void*", "onnxModel"), ("uint32_t", "weightsCount"),
                      ("const onnxTensorDescriptorV1*", "weightDescriptors"), ("onnxGraph*", "graph")],
    "onnxSetGraphIO": [("onnxGraph", "graph"), ("uint32_t", "inputsCount"),
                       ("const onnxTensorDescriptorV1*", "inputDescriptors"), ("uint32_t", "outputsCount"),
                       ("const onnxTensorDescriptorV1*", "outputDescriptors")],
    "onnxRunGraph": [("onnxGraph", "graph"), ("const onnxMemoryFenceV1*", "inputFence"),
                     ("onnxMemoryFenceV1*", "outputFence")],
    "onnxReleaseGraph": [("onnxGraph", "graph")],
    "onnxGetExtensionFunctionAddress": [("onnxBackendID", "backendID"), ("const char*", "name"),
                                        ("onnxExtensionFunctionPointer*", "function")],
    "onnxSetIOAndRunGraph": [("onnxGraph", "graph"), ("uint32_t", "inputsCount"),
                             ("const onnxTensorDescriptorV1*", "inputDescriptors"), ("uint32_t", "outputsCount"),
                             ("const onnxTensorDescriptorV1*", "outputDescriptors"),
                             ("onnxMemoryFenceV1*", "outputFence")],
}
ENTRY_PREFIX = "glowpy_onnxifi_"


def _params(name: str) -> str:
    return ", ".join(f"{t} {n}" for t, n in SIGNATURES[name])


def _entry_points() -> str:
    """cffi `extern "Python"` functions. They return status + 1, so the 0 that cffi returns when its
    Python side could not start (failed init, nothing attached) is told apart from SUCCESS."""
    return "\n".join(f"int32_t {ENTRY_PREFIX}{name}({_params(name)});" for name in SIGNATURES)


def _exports() -> str:
    out = []
    for name, params in SIGNATURES.items():
        args = ", ".join(n for _, n in params)
        out.append(f"ONNXIFI_PUBLIC onnxStatus ONNXIFI_ABI {name}({_params(name)}) {{\n"
                   f"    int32_t status = {ENTRY_PREFIX}{name}({args});\n"
                   f"    return status == 0 ? ONNXIFI_STATUS_INTERNAL_ERROR : status - 1;\n}}\n")
    return "\n".join(out)


_C_SOURCE = r"""
#define ONNXIFI_BUILD_LIBRARY 1
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <wchar.h>
#include "onnxifi.h"

/* Before any ONNXIFI call starts the interpreter: make libpython's symbols global, and give an
   embedded interpreter the home of the Python this library was built against. */
__attribute__((constructor)) static void glowpy_onnxifi_preload(void) {
    void* self = dlopen(NULL, RTLD_NOW);
    int python_host = self != NULL && dlsym(self, "Py_IsInitialized") != NULL && Py_IsInitialized();
    if (dlopen(GLOWPY_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == NULL)
        dlopen(GLOWPY_LIBPYTHON, RTLD_NOW | RTLD_GLOBAL);
    if (!python_host && !Py_IsInitialized() && getenv("PYTHONHOME") == NULL) {
#if PY_VERSION_HEX < 0x030D0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
        Py_SetPythonHome(GLOWPY_PYTHONHOME_W);
#pragma GCC diagnostic pop
#else
        setenv("PYTHONHOME", GLOWPY_PYTHONHOME, 0);
#endif
    }
}

/* The Python entry points cffi defines below, and the exported spec functions over them. */
GLOWPY_ENTRY_POINTS
GLOWPY_EXPORTS

/* Addresses handed out by onnxGetExtensionFunctionAddress (order of constants.EXTENSION_FUNCTIONS). */
static uintptr_t glowpy_onnxifi_symbol(int which) {
    switch (which) {
    case 0: return (uintptr_t)&onnxGetExtensionFunctionAddress;
    case 1: return (uintptr_t)&onnxSetIOAndRunGraph;
    default: return 0;
    }
}
"""

_INIT_CODE = """
import sys
import site

# Put the Python this library was built against and the glowpy it was built from on sys.path.
for _dir in {sites!r}:
    if _dir not in sys.path:
        site.addsitedir(_dir)
if "glowpy" not in sys.modules and {root!r} not in sys.path:
    sys.path.insert(0, {root!r})

from {module} import ffi, lib
from glowpy.onnxifi.cabi import install

install(ffi, lib)
"""


def _c_source() -> str:
    return _C_SOURCE.replace("GLOWPY_ENTRY_POINTS", _entry_points()).replace("GLOWPY_EXPORTS", _exports())


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def libpython_path() -> str:
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY") or ""
    return os.path.join(libdir, name)


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    user = site.getusersitepackages()
    if isinstance(user, str) and os.path.isdir(user):
        dirs.append(user)
    return [d for d in dirs if os.path.isdir(d)]


def _init_code() -> str:
    return _INIT_CODE.format(sites=_site_dirs(), root=str(SOURCE_ROOT), module=MODULE_NAME)


def _fingerprint() -> str:
    import cffi

    h = hashlib.sha256()
    for part in (_CDEF, _entry_points(), _c_source(), _init_code(), HEADER.read_text(), sys.version, libpython_path(),
                 sys.base_prefix, cffi.__version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def default_output_dir() -> Path:
    base = os.environ.get("GLOWPY_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "glowpy")
    return Path(base) / "onnxifi"


def library_path(output_dir: str | os.PathLike | None = None) -> Path:
    return Path(output_dir or default_output_dir()) / LIBRARY_NAME


def is_current(output_dir: str | os.PathLike | None = None) -> bool:
    """Is a library built from these sources for this Python already there?"""
    lib = library_path(output_dir)
    stamp = lib.with_suffix(".so.stamp")
    return lib.is_file() and stamp.is_file() and stamp.read_text().strip() == _fingerprint()


def build(output_dir: str | os.PathLike | None = None, verbose: bool = False) -> Path:
    """Compile the library into `output_dir` (default: the user cache) and return its path.

    The .so is compiled in a scratch directory and moved into place atomically, so a process
    loading it never sees a half-written file."""
    from cffi import FFI

    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        from glowpy.errors import InternalError

        raise InternalError("this Python has no shared libpython; the ONNXIFI library cannot embed it",
                            expected="Py_ENABLE_SHARED=1", found=sysconfig.get_config_var("Py_ENABLE_SHARED"))
    out = Path(output_dir or default_output_dir())
    out.mkdir(parents=True, exist_ok=True)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ffi = FFI()
    ffi.cdef(_CDEF)
    ffi.embedding_api(_entry_points())
    ffi.set_source(
        MODULE_NAME,
        _c_source(),
        include_dirs=[str(INCLUDE_DIR)],
        define_macros=[("GLOWPY_LIBPYTHON", _c_string(libpython_path())),
                       ("GLOWPY_PYTHONHOME", _c_string(sys.base_prefix)),
                       ("GLOWPY_PYTHONHOME_W", "L" + _c_string(sys.base_prefix))],
        libraries=["dl"],
        library_dirs=[libdir],
        extra_link_args=[f"-Wl,-rpath,{libdir}"],
    )
    ffi.embedding_init_code(_init_code())
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        built = Path(ffi.compile(tmpdir=str(scratch), target=LIBRARY_NAME, verbose=verbose))
        final = out / LIBRARY_NAME
        os.replace(built, final)
        stamp = final.with_suffix(".so.stamp")
        tmp_stamp = scratch / "stamp"
        tmp_stamp.write_text(_fingerprint() + "\n")
        os.replace(tmp_stamp, stamp)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def ensure_built(output_dir: str | os.PathLike | None = None) -> Path:
    """The library's path, building it first if it is missing or stale."""
    if is_current(output_dir):
        return library_path(output_dir)
    return build(output_dir)


__all__ = ["HEADER", "INCLUDE_DIR", "LIBRARY_NAME", "build", "default_output_dir", "ensure_built", "is_current",
           "libpython_path", "library_path"]
