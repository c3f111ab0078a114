"""Kernel modules as text: every kernel is built in an llvmlite module of its own, printed, and dropped,
so the Python objects of a large model's IR (tens of MB) never exist all at once. The entry's module
only declares the kernels; codegen.Program.ir_text splices the printed definitions in."""

from __future__ import annotations

import re

from llvmlite import ir

from glowpy.errors import InternalError


def ident(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]", "_", text)


_GLOBAL_NAME = re.compile(r'@"((?:[^"\\]|\\.)*)"|@([-a-zA-Z$._][-a-zA-Z$._0-9]*)')


def split_module_text(text: str) -> list[tuple[str, str, str]]:
    """Top-level items of a printed llvmlite module: ("define" | "declare", name, text). Anything else
    (globals, metadata, attribute groups) is refused: kernels must not use module-level state."""
    items: list[tuple[str, str, str]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("define "):
            j = i
            while lines[j] != "}":
                j += 1
            m = _GLOBAL_NAME.search(line)
            items.append(("define", m.group(1) or m.group(2), "\n".join(lines[i:j + 1])))
            i = j + 1
            continue
        if line.startswith("declare "):
            m = _GLOBAL_NAME.search(line)
            items.append(("declare", m.group(1) or m.group(2), line))
        elif line.strip() and not line.startswith((";", "target ", "source_filename")):
            raise InternalError("a kernel module holds more than functions", found=line[:80])
        i += 1
    return items


class KernelTexts:
    """The printed kernel definitions and declarations of one entry module."""

    def __init__(self, module: ir.Module) -> None:
        self.module = module
        self._sealed: dict[str, ir.Function] = {}
        self.defs: dict[str, str] = {}  # name -> printed definition
        self.decls: dict[str, str] = {}  # name -> printed declaration (intrinsics, libm, libc)

    def kmod(self) -> ir.Module:
        m = ir.Module(name="glowpy.kernel")
        m.triple, m.data_layout = self.module.triple, self.module.data_layout
        return m

    def seal(self, fn: ir.Function) -> ir.Function:
        """Print fn's module into the kernel texts; return fn's declaration in the entry's module."""
        if fn.module is self.module:
            return fn
        decl = self._sealed.get(fn.name)
        if decl is not None:
            return decl
        for kind, name, text in split_module_text(str(fn.module)):
            if kind == "define":
                seen = self.defs.get(name)
                if seen is not None and seen != text:
                    raise InternalError(f"two kernels define different functions named '{name}'")
                self.defs[name] = text
            else:
                self.decls.setdefault(name, text)
        decl = ir.Function(self.module, fn.function_type, name=fn.name)
        self._sealed[fn.name] = decl
        return decl
