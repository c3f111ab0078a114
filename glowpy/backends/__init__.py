"""Backends by name. A backend compiles an IR graph into an Executable."""

from __future__ import annotations

from collections.abc import Callable

from glowpy.backends.base import Backend, Executable
from glowpy.errors import UnsupportedAttribute


def _interpreter() -> Backend:
    from glowpy.backends.interpreter import InterpreterBackend

    return InterpreterBackend()


def _cpu() -> Backend:
    from glowpy.backends.cpu import CpuBackend

    return CpuBackend()


# Factories, so importing glowpy does not pull in llvmlite until the CPU backend is asked for.
BACKENDS: dict[str, Callable[[], Backend]] = {"cpu": _cpu, "interpreter": _interpreter}
DEFAULT_BACKEND = "cpu"


def get_backend(name: str | Backend) -> Backend:
    if isinstance(name, Backend):
        return name
    factory = BACKENDS.get(name)
    if factory is None:
        raise UnsupportedAttribute(f"unknown backend '{name}'", expected=sorted(BACKENDS), found=name)
    return factory()


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "Executable", "get_backend"]
