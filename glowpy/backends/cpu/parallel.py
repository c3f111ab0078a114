"""A cold compile in pieces: every kernel is its own LLVM module, compiled on all cores, once per
distinct kernel, and kept in a per-kernel cache shared across models.

A program's kernels are printed definitions (codegen.Program.kernel_defs) that the entry calls by name.
Each kernel called by the entry becomes a unit: its definition made external, the helpers it calls
(made internal copies) and the declarations it uses. A unit is named by its content: the kernel is
renamed `glowpy.k.<digest>` (the digest of the unit with the kernel's own name blanked), so identical
kernels (ViT's twelve identical layers, two models with ResNet's conv shapes) are one unit, compiled
once, and its object is stored under `k-<key>` (key: the unit, the target fingerprint, the glowpy
version and the CPU backend's source). The entry module (glowpy_run, the worker, the barrier) calls the
renamed kernels and is compiled as one more unit. MCJIT links the objects when they are loaded.

Each task has its own LLVM context, module, pass builder and target machine, and runs the two long
calls (the pass pipeline, code generation) outside llvmlite's global lock and the GIL (raw ctypes
calls), so threads compile in parallel. A bundle (all objects of one model) is what the
whole-model object cache stores.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import llvmlite.binding as llvm
from llvmlite.binding import ffi

from glowpy.backends.cpu.cache import ObjectCache, source_digest
from glowpy.backends.cpu.module_text import _GLOBAL_NAME, split_module_text
from glowpy.backends.cpu.target import HostTarget, dispose_pass_manager, new_machine, pass_pipeline

BUNDLE_MAGIC = b"GLOWPY-BUNDLE-1\n"
_DEFINE = re.compile(r"^define (?:(?:internal|private|linkonce_odr|weak_odr|external|dso_local) )*")
BLANK = "glowpy.k.self"


@dataclass
class Unit:
    name: str  # the kernel's name in every object (glowpy.k.<digest>), or "" for the entry
    text: str  # a whole module
    key: str  # the per-kernel cache key ("" for the entry: it is model-specific)


def _refs(text: str) -> set[str]:
    return {m.group(1) or m.group(2) for m in _GLOBAL_NAME.finditer(text)}


def _rename(text: str, names: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        new = names.get(name)
        return m.group(0) if new is None else f'@"{new}"'

    return _GLOBAL_NAME.sub(sub, text)


_LOCAL = re.compile(r'%(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._0-9]+))')
_LABEL = re.compile(r'^(?:"((?:[^"\\]|\\.)*)"|([-a-zA-Z$._0-9]+)):', re.MULTILINE)


def canonical_locals(text: str) -> str:
    """Local value and block names renumbered by first appearance: kernels that differ only in the
    names their generator gave (after the node they serve) become the same text. (Kernel modules hold
    no named types, so every %name is a local.)"""
    names: dict[str, str] = {}

    def new(m: re.Match) -> str:
        old = m.group(1) if m.group(1) is not None else m.group(2)
        return names.setdefault(old, f"l{len(names)}")

    text = _LOCAL.sub(lambda m: "%" + new(m), text)
    return _LABEL.sub(lambda m: new(m) + ":", text)


def _linkage(text: str, internal: bool) -> str:
    first, _, rest = text.partition("\n")
    first = _DEFINE.sub("define internal " if internal else "define ", first, count=1)
    return first + "\n" + rest


def split_units(entry_text: str, defs: dict[str, str], decls: dict[str, str], salt: str) -> tuple[Unit, list[Unit]]:
    """(the entry unit, the distinct kernel units) of a program; `salt` goes into every kernel key."""
    entry_items = split_module_text("\n".join(ln for ln in entry_text.splitlines()
                                              if not ln.startswith(("target ", "source_filename", "; "))))
    roots = [name for kind, name, _ in entry_items if kind == "declare" and name in defs]
    callees = {name: _refs(text) & defs.keys() - {name} for name, text in defs.items()}
    renames: dict[str, str] = {}
    units: dict[str, Unit] = {}
    for root in roots:
        closure, todo = [], list(callees[root])
        while todo:
            d = todo.pop()
            if d not in closure:
                closure.append(d)
                todo.extend(callees[d] - {root})
        closure.sort()
        body = [_linkage(defs[root], internal=False)] + [_linkage(defs[d], internal=True) for d in closure]
        used = set().union(*(_refs(t) for t in body)) - defs.keys()
        text = "\n\n".join([decls[n] for n in sorted(used) if n in decls] + body) + "\n"
        canonical = canonical_locals(_rename(text, {root: BLANK}))
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        name = f"glowpy.k.{digest[:24]}"
        renames[root] = name
        if name not in units:
            key = hashlib.sha256(f"{salt}\0{canonical}".encode()).hexdigest()
            units[name] = Unit(name, _rename(canonical, {BLANK: name}), key)
    # The entry: its own definitions and declarations, kernels declared under their new names (once each).
    out, declared = [], set()
    for kind, name, text in entry_items:
        if kind == "declare" and name in renames:
            if renames[name] in declared:
                continue
            declared.add(renames[name])
        out.append(_rename(text, renames))
    have = {n for k, n, _ in entry_items}
    used = set().union(*(_refs(t) for t in out)) if out else set()
    out = [decls[n] for n in sorted(used - have) if n in decls] + out
    return Unit("", "\n\n".join(out) + "\n", ""), list(units.values())


def _unlocked(name: str):
    """A libllvmlite entry point without llvmlite's process-wide lock (which serializes every LLVM call,
    so threads alone would compile one module at a time). Only for the long calls on objects a task
    owns outright: its own context, module, pass builder and target machine."""
    fn = getattr(ffi.lib, name)
    return getattr(fn, "_cfn", fn)


def _emit_object(machine: llvm.TargetMachine, module: llvm.ModuleRef) -> bytes:
    """targets.TargetMachine.emit_object, the code generation itself outside the lock."""
    with ffi.OutputString() as err:
        buf = _unlocked("LLVMPY_TargetMachineEmitToMemory")(machine, module, 1, err)
        if not buf:
            raise RuntimeError(str(err))
    try:
        return ctypes.string_at(ffi.lib.LLVMPY_GetBufferStart(buf), ffi.lib.LLVMPY_GetBufferSize(buf))
    finally:
        ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)


def compile_unit(text: str, target: HostTarget, speed_level: int = 3) -> bytes:
    """One module -> object code, in a context, pass builder and target machine of its own: the
    optimization pipeline and code generation run outside llvmlite's lock, in parallel with other units."""
    context = llvm.create_context()
    module = llvm.parse_assembly(text, context=context)
    module.triple = target.triple
    module.data_layout = target.data_layout
    module.verify()
    machine = new_machine(target)
    builder, manager = pass_pipeline(target, speed_level, machine)
    try:
        _unlocked("LLVMPY_RunNewModulePassManager")(manager, module, builder)
    finally:
        dispose_pass_manager(manager)  # 7.5 MiB per ResNet-50 compile otherwise
    return _emit_object(machine, module)


def workers() -> int:
    """LLVM threads: $GLOWPY_COMPILE_THREADS (1: one unit at a time), else the machine's CPU count."""
    env = os.environ.get("GLOWPY_COMPILE_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, os.cpu_count() or 1)


def compile_program(entry_text: str, defs: dict[str, str], decls: dict[str, str], target: HostTarget,
                    store: ObjectCache | None, progress: Callable[[int, int], None] | None = None) -> bytes:
    """Every unit's object (from the per-kernel cache, or compiled in parallel), as one bundle."""
    from glowpy import __version__

    salt = f"glowpy {__version__}|{target.fingerprint()}|{source_digest()}"
    entry, units = split_units(entry_text, defs, decls, salt)
    objects: dict[str, bytes] = {}
    todo = []
    for u in units:
        obj = store.get(f"k-{u.key}") if store is not None else None
        if obj is not None:
            objects[u.name] = obj
        else:
            todo.append(u)
    total, done = len(todo) + 1, 0
    if progress is not None:
        progress(done, total)

    def work(u: Unit) -> tuple[Unit, bytes]:
        # The entry only sequences calls: O1 costs nothing at run time there.
        return u, compile_unit(u.text, target, 1 if not u.name else 3)

    # Largest first, so the longest kernel does not start last.
    order = sorted([*todo, entry], key=lambda u: -len(u.text))
    entry_obj = b""
    if len(order) == 1 or workers() == 1:
        results = map(work, order)
        pool = None
    else:
        pool = ThreadPoolExecutor(min(workers(), len(order)))
        results = pool.map(work, order)
    try:
        for u, obj in results:
            if u.name:
                objects[u.name] = obj
                if store is not None:
                    store.put(f"k-{u.key}", obj)
            else:
                entry_obj = obj
            done += 1
            if progress is not None:
                progress(done, total)
    finally:
        if pool is not None:
            pool.shutdown()
    return pack([entry_obj] + [objects[u.name] for u in units])


def pack(objects: list[bytes]) -> bytes:
    return BUNDLE_MAGIC + b"".join(struct.pack("<Q", len(o)) + o for o in objects)


def unpack(blob: bytes) -> list[bytes]:
    """The objects of a bundle; a plain object file is a bundle of one."""
    if not blob.startswith(BUNDLE_MAGIC):
        return [blob]
    out, at = [], len(BUNDLE_MAGIC)
    while at < len(blob):
        (n,) = struct.unpack_from("<Q", blob, at)
        at += 8
        if at + n > len(blob):
            raise ValueError("truncated bundle")
        out.append(blob[at:at + n])
        at += n
    return out
