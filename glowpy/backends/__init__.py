"""Backends by name. A backend compiles an IR graph into an Executable."""

from __future__ import annotations

from collections.abc import Callable

from glowpy.backends.base import Backend, Executable
from glowpy.errors import GlowpyError, UnsupportedAttribute


def _interpreter() -> Backend:
    from glowpy.backends.interpreter import InterpreterBackend

    return InterpreterBackend()


def _cpu() -> Backend:
    from glowpy.backends.cpu import CpuBackend

    return CpuBackend()


# Factories, so importing glowpy does not pull in llvmlite until the CPU backend is asked for.
BACKENDS: dict[str, Callable[[], Backend]] = {"cpu": _cpu, "interpreter": _interpreter}
DEFAULT_BACKEND = "cpu"


_FOUND: dict[str, Backend | None] = {}


def find_backend(name: str | Backend | None) -> Backend | None:
    """The backend `name` names, created once per process, or None when it cannot be created here
    (the compatibility check then decides from the op table alone). An unknown name raises."""
    if name is None or isinstance(name, Backend):
        return name
    if name not in BACKENDS:
        raise UnsupportedAttribute(f"unknown backend '{name}'", expected=sorted(BACKENDS), found=name)
    if name not in _FOUND:
        try:
            _FOUND[name] = BACKENDS[name]()
        except GlowpyError:
            _FOUND[name] = None
    return _FOUND[name]


def get_backend(name: str | Backend) -> Backend:
    if isinstance(name, Backend):
        return name
    factory = BACKENDS.get(name)
    if factory is None:
        raise UnsupportedAttribute(f"unknown backend '{name}'", expected=sorted(BACKENDS), found=name)
    return factory()


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "Executable", "find_backend", "get_backend"]
