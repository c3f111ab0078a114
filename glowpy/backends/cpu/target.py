"""The host target: llvmlite initialization, the target machine, vector width, the -O3 pipeline.

Nothing is compiled for a CPU that is not there: the triple, CPU name and feature string all come
from the host (`llvm.get_host_cpu_name()` / `get_host_cpu_features()`). `host_target("avx2")` takes
the host's AVX-512 features away (8 float lanes), so that an AVX-512 host builds and runs the code an
AVX2-only host (AMD Zen 3) would get.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import llvmlite
import llvmlite.binding as llvm
from llvmlite.binding import ffi

from glowpy.errors import UnsupportedAttribute


@dataclass(frozen=True)
class HostTarget:
    machine: llvm.TargetMachine
    triple: str
    cpu: str
    features: str
    vector_width: int  # float32 lanes of the widest vector unit the host has
    data_layout: str  # read once: llvmlite's TargetData handle must not be re-fetched per module

    def has(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    def fingerprint(self) -> str:
        """What compiled code depends on besides the IR (part of the cache key)."""
        return f"{self.triple}|{self.cpu}|{self.features}|llvmlite {llvmlite.__version__}|llvm {llvm.llvm_version_info}"


def vector_width_for(features: str) -> int:
    flags = set(features.split(","))
    if "+avx512f" in flags:
        return 16
    if "+avx2" in flags or "+avx" in flags:
        return 8
    return 4


# The compile option `isa`: "host" (everything the host has) or a narrower instruction set.
ISAS = ("host", "avx2")


def _without_avx512(features: str) -> str:
    return ",".join("-" + f[1:] if f.startswith("+avx512") else f for f in features.split(",") if f)


def isa_available(isa: str) -> bool:
    """Whether code built for `isa` runs on this host."""
    return isa == "host" or (isa == "avx2" and host_target().has("avx2") and host_target().has("fma"))


@functools.cache
def host_target(isa: str = "host") -> HostTarget:
    """The host's target machine, or the host's without AVX-512 for isa="avx2" (created once per
    process; LLVM target machines are reusable)."""
    if isa not in ISAS:
        raise UnsupportedAttribute("unknown instruction set", expected=list(ISAS), found=isa)
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    if isa == "avx2":
        features = _without_avx512(features)
    machine = llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault")
    return HostTarget(machine, triple, cpu, features, vector_width_for(features), str(machine.target_data))


def new_machine(target: HostTarget | None = None) -> llvm.TargetMachine:
    """A fresh target machine for the host (an MCJIT engine takes ownership of the one it is given)."""
    target = target or host_target()
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="default", codemodel="jitdefault")


def optimize(module: llvm.ModuleRef, target: HostTarget | None = None, speed_level: int = 3,
             machine: llvm.TargetMachine | None = None) -> None:
    """Run LLVM's new-pass-manager O3 pipeline (or `speed_level`), tuned for the host, over `module` in
    place; `machine` is the target machine to tune for (a thread's own; default the shared one)."""
    builder, manager = pass_pipeline(target, speed_level, machine)
    try:
        manager.run(module, builder)
    finally:
        dispose_pass_manager(manager)


def dispose_pass_manager(manager: llvm.ModulePassManager) -> None:
    """Free a module pass manager: llvmlite's never frees itself (its _dispose resolves to ObjectRef's
    no-op), and with it went every pass's tables: ~0.6 MiB per large kernel at O3."""
    ffi.lib.LLVMPY_DisposeNewModulePassManger(manager)
    manager.detach()


def pass_pipeline(target: HostTarget | None = None, speed_level: int = 3,
                  machine: llvm.TargetMachine | None = None) -> tuple[llvm.PassBuilder, llvm.ModulePassManager]:
    """The pass builder and module pass manager `optimize` runs (O3: loop and SLP vectorization, unrolling)."""
    target = target or host_target()
    options = llvm.create_pipeline_tuning_options(speed_level=speed_level)
    options.loop_vectorization = speed_level >= 2
    options.slp_vectorization = speed_level >= 2
    options.loop_unrolling = speed_level >= 2
    builder = llvm.create_pass_builder(machine or target.machine, options)
    return builder, builder.getModulePassManager()


def parse(ir_text: str, target: HostTarget | None = None) -> llvm.ModuleRef:
    """Parse and verify LLVM IR text, stamped with the host triple and data layout."""
    target = target or host_target()
    module = llvm.parse_assembly(ir_text)
    module.triple = target.triple
    module.data_layout = target.data_layout
    module.verify()
    return module


def compile_object(ir_text: str, target: HostTarget | None = None) -> bytes:
    """IR text -> optimized native object code for the host."""
    target = target or host_target()
    module = parse(ir_text, target)
    optimize(module, target)
    return target.machine.emit_object(module)


def assembly(ir_text: str, target: HostTarget | None = None) -> str:
    """Optimized host assembly of IR text (to see what the kernels became)."""
    target = target or host_target()
    module = parse(ir_text, target)
    optimize(module, target)
    return target.machine.emit_assembly(module)
