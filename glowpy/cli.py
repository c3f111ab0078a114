"""The `glowpy` command line.

Each subcommand is a pair: `add_<name>(subparsers)` declares its arguments, `cmd_<name>(args)`
does the work and returns the exit code. Errors a user can cause (bad path, bad file, unknown
input, wrong shape) print one line and exit 2; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from glowpy.optimizer import OptimizeStats

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # the shell's codes for SIGINT and SIGPIPE
EXIT_CODES = ("exit codes: 0 success; 1 the model is not supported (check) or a command failed; 2 an error in "
              "the input (model, file, flag, shape, memory limit); 3 an internal error in glowpy (a bug: please "
              "report it); 130 interrupted; 141 output pipe closed.")


class UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with errors in one line (exit 2), like every other glowpy error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# --- argument parsing helpers -----------------------------------------------------------------------


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.lower().replace(",", "x").split("x") if d != "")
    except ValueError:
        raise UsageError(f"bad shape '{text}': expected dims like 1x3x224x224") from None
    if not dims or any(d <= 0 for d in dims):
        raise UsageError(f"bad shape '{text}': dims must be positive integers")
    return dims


def _name_value(text: str, flag: str) -> tuple[str, str]:
    if "=" not in text:
        raise UsageError(f"{flag} {text}: expected NAME=VALUE")
    name, value = text.rsplit("=", 1)
    return name, value


def load_array(path: str) -> np.ndarray:
    """Read a .npy file or an ONNX TensorProto (.pb)."""
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"input file '{path}' does not exist")
    try:
        if p.suffix == ".npy":
            return np.load(p, allow_pickle=False)
        if p.suffix == ".pb":
            import onnx
            from onnx import numpy_helper

            return numpy_helper.to_array(onnx.load_tensor(str(p)))
    except Exception as e:  # noqa: BLE001  (any decode failure is the user's file)
        raise UsageError(f"cannot read input file '{path}': {e}") from None
    raise UsageError(f"input file '{path}': expected .npy or .pb")


def _positive_int(text: str, flag: str) -> int:
    try:
        n = int(text)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise UsageError(f"{flag} {text}: expected a positive integer")
    return n


def add_model_arg(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """The MODEL argument every subcommand takes (read it with `_model_arg`)."""
    text = "path of an .onnx file, or the name of one of onnx's light models (e.g. resnet50)"
    if optional:
        p.add_argument("model", nargs="?", help=text + "; default: the light ResNet-50")
    else:
        p.add_argument("model", help=text)


def _model_arg(text: str) -> str:
    """MODEL as a path: a file, a path the importer will report as missing (it has a directory or
    a suffix), or a light model's name."""
    from glowpy.models import LIGHT_MODELS, light_model_path

    p = Path(text)
    if p.exists():
        return text
    if text in LIGHT_MODELS:
        return str(light_model_path(text))
    if p.suffix or p.parent != Path("."):
        return text
    raise UsageError(f"model '{text}' is neither a file nor a light model ({', '.join(LIGHT_MODELS)})")


def _backend_options(name: str) -> tuple[str, ...]:
    from glowpy.backends import get_backend

    return get_backend(name).options


def _threads_option(args: argparse.Namespace) -> dict[str, int]:
    """--threads N as the backend's compile option ({} when not given)."""
    if args.threads is None:
        return {}
    threads = _positive_int(args.threads, "--threads")
    if "threads" not in _backend_options(args.backend):
        raise UsageError(f"--threads: the {args.backend} backend has no thread count")
    return {"threads": threads}


def _fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def _human_count(n: int) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _human_bytes(n: int) -> str:
    from glowpy.limits import human_bytes

    return human_bytes(n)


# --- glowpy run ------------------------------------------------------------------------------------


def add_run(sub: argparse._SubParsersAction) -> None:
    from glowpy.backends import BACKENDS, DEFAULT_BACKEND

    p = sub.add_parser("run", help="compile a model and run it", description=(
        "Compile an ONNX model and run it. Without MODEL, runs the ResNet-50 that the installed onnx package "
        "ships, on a deterministic input."))
    add_model_arg(p, optional=True)
    p.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE",
                   help="feed input NAME from FILE (.npy or TensorProto .pb); repeatable")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=DIMS",
                   help="bind the shape of input NAME (e.g. data=1x3x224x224), or a symbolic dim (batch=4)")
    p.add_argument("--backend", "-b", default=DEFAULT_BACKEND, choices=sorted(BACKENDS), help="default: %(default)s")
    p.add_argument("--iterations", "-n", type=int, default=10, help="timed runs after one warm-up (default: 10)")
    p.add_argument("--output", "-o", metavar="FILE.npz", help="save the outputs to an .npz file")
    p.add_argument("--no-opt", action="store_true", help="compile the graph as imported (skip the optimizer)")
    p.add_argument("--threads", "-t", metavar="N", help="cpu backend threads (default: $GLOWPY_NUM_THREADS, "
                   "else all cores)")
    p.add_argument("--profile", metavar="TRACE.json", help="time every kernel inside the timed runs (code compiled "
                   "with timers; without this flag there are none), write a Chrome trace (chrome://tracing, "
                   "Perfetto) and print the slowest kernels")
    p.add_argument("--top", metavar="N", default="10", help="kernels in the --profile table (default: 10)")
    p.set_defaults(func=cmd_run)


def _shape_bindings(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """--shape NAME=DIMS: a full shape for an input, or one number for a symbolic dim (batch=4)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, dims = _name_value(item, "--shape")
        shapes[name] = parse_shape(dims)
    return shapes


def cmd_run(args: argparse.Namespace) -> int:
    import glowpy
    from glowpy.bench import deterministic_input, latency_stats, time_runs
    from glowpy.models import default_model_path

    if args.iterations < 1:
        raise UsageError("--iterations must be at least 1")
    model_path = _model_arg(args.model) if args.model else str(default_model_path())
    shapes = _shape_bindings(args.shape)
    top_kernels = _positive_int(args.top, "--top")
    options: dict[str, object] = dict(_threads_option(args))
    if args.profile:
        if "profile" not in _backend_options(args.backend):
            raise UsageError(f"--profile: the {args.backend} backend has no kernel timers (use --backend cpu)")
        options["profile"] = True
    compiled = glowpy.compile(model_path, backend=args.backend, shapes=shapes or None, optimize=not args.no_opt,
                              **options)
    src = compiled.imported
    print(f"model     {model_path}" + ("  (default: onnx's light ResNet-50)" if not args.model else ""))
    for name, t in compiled.input_types.items():
        print(f"input     {name}: {t}")
    for name, t in compiled.output_types.items():
        print(f"output    {name}: {t}")
    after = f" ({len(compiled.graph.nodes)} after optimization)" if not args.no_opt else ""
    print(f"graph     {src.nodes} nodes{after}, {_human_count(src.parameters)} parameters "
          f"({_human_bytes(src.parameter_bytes)})")
    cache = " (cached)" if compiled.cached else ""
    print(f"compile   {args.backend}: import {_fmt_ms(src.seconds)}, compile {_fmt_ms(compiled.compile_seconds)}{cache}"
          + (f", arena {_human_bytes(compiled.arena_size)}" if compiled.arena_size else ""))

    feeds: dict[str, np.ndarray] = {}
    for item in args.input:
        name, path = _name_value(item, "--input")
        feeds[name] = load_array(path)
    for name, t in compiled.input_types.items():
        if name not in feeds:
            feeds[name] = deterministic_input(t.dtype, t.shape)

    outputs = compiled.run(feeds)  # warm-up, and the outputs we report
    runs = []
    if args.profile:
        from glowpy import profile

        runs = profile.record(compiled, feeds, args.iterations)
        times = [r.wall for r in runs]
    else:
        times = time_runs(lambda: compiled.run(feeds), args.iterations)
    for name, arr in outputs.items():
        print(f"result    {name}: shape {list(arr.shape)} {arr.dtype}")
        flat = arr.reshape(arr.shape[0], -1) if arr.ndim >= 2 else arr.reshape(1, -1)
        if arr.dtype.kind == "f" and flat.shape[1] >= 5 and flat.shape[1] == arr.size // arr.shape[0]:
            top = np.argsort(-flat[0], kind="stable")[:5]
            print("top-5     " + "  ".join(f"{int(i)}:{flat[0, i]:.4f}" for i in top))
    lat = latency_stats(times)
    print(f"latency   p50 {_fmt_ms(lat['p50'])}  p90 {_fmt_ms(lat['p90'])}  over {args.iterations} runs")
    if args.profile:
        profile.write_trace(runs, args.profile, name=f"glowpy {Path(model_path).name}")
        print(f"profile   {args.profile}: {sum(len(r.spans) for r in runs)} kernel events over {len(runs)} runs, "
              f"{runs[-1].threads} thread{'s' if runs[-1].threads > 1 else ''}")
        print()
        print(profile.format_table(runs, top_kernels))
    if args.output:
        np.savez(args.output, **outputs)
        print(f"saved     {args.output}")
    return EXIT_OK


# --- glowpy dump -----------------------------------------------------------------------------------


def add_dump(sub: argparse._SubParsersAction) -> None:
    from glowpy.backends import BACKENDS, DEFAULT_BACKEND
    from glowpy.optimizer import pass_names

    p = sub.add_parser("dump", help="print the graph after an optimizer stage, or optimizer statistics",
                       description="Print a model's IR graph after any stage or pass of the optimizer, as SSA "
                       "text or Graphviz DOT, or (--stats) node counts by op before and after and what each "
                       "pass changed.",
                       epilog="stages and passes, in pipeline order: " + ", ".join(pass_names()))
    add_model_arg(p)
    p.add_argument("--after", default="all", metavar="PASS",
                   help="a stage or pass name (stop after its first run), 'all' (default) or 'none' (as imported)")
    p.add_argument("--format", "-f", choices=("text", "dot", "svg", "png", "llvm", "asm"), default="text",
                   help="IR as SSA text or DOT, or rendered by Graphviz (svg, png: needs its `dot` program); or the "
                        "backend's generated LLVM IR / assembly for the optimized graph (cpu backend). "
                        "Default: %(default)s")
    p.add_argument("--output", "-o", metavar="FILE",
                   help="write here instead of stdout (svg, png: default MODEL.svg / MODEL.png in the current "
                        "directory, MODEL's name without its suffix)")
    p.add_argument("--stats", action="store_true", help="print op counts before/after and per-pass changes instead")
    p.add_argument("--verify", action="store_true", help="verify the graph after every pass")
    p.add_argument("--backend", "-b", default=DEFAULT_BACKEND, choices=sorted(BACKENDS),
                   help="optimize for this backend's lowering choices (default: %(default)s)")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=DIMS",
                   help="bind the shape of input NAME, or a symbolic dim (batch=4)")
    p.set_defaults(func=cmd_dump)


def format_stats(stats: OptimizeStats) -> str:
    """Node counts by op before / after, then one line per pass."""
    ops = sorted(set(stats.before) | set(stats.after))
    width = max([len(o) for o in ops] + [8])
    lines = [f"{'op':<{width}}  {'before':>6}  {'after':>6}"]
    for o in ops:
        b, a = stats.before.get(o, 0), stats.after.get(o, 0)
        lines.append(f"{o:<{width}}  {b or '-':>6}  {a or '-':>6}")
    lines.append(f"{'total':<{width}}  {sum(stats.before.values()):>6}  {sum(stats.after.values()):>6}")
    if stats.passes:
        pw = max(len(r.name) for r in stats.passes)
        sw = max(len(r.stage) for r in stats.passes)
        lines += ["", f"{'stage':<{sw}}  {'pass':<{pw}}  {'runs':>4}  {'changed':>7}  {'nodes':>6}  {'weights':>7}  "
                  f"{'ms':>8}"]
        for r in stats.passes:
            lines.append(f"{r.stage:<{sw}}  {r.name:<{pw}}  {r.runs:>4}  {r.changed:>7}  {r.nodes:>+6}  "
                         f"{r.constants:>+7}  {r.seconds * 1e3:>8.2f}")
        lines.append(f"optimizer {stats.seconds * 1e3:.1f} ms"
                     + (f"; did not settle: {', '.join(stats.unsettled)}" if stats.unsettled else ""))
    return "\n".join(lines)


def cmd_dump(args: argparse.Namespace) -> int:
    from glowpy.ir import to_dot
    from glowpy.optimizer import OptimizeStats, pass_names
    from glowpy.pipeline import optimized_graph

    dot_exe = graphviz_dot() if args.format in ("svg", "png") and not args.stats else None
    names = pass_names()
    if args.after not in ("all", "none", *names):
        raise UsageError(f"--after {args.after}: unknown pass; choose all, none, or one of {', '.join(names)}")
    stats = OptimizeStats()
    graph = optimized_graph(_model_arg(args.model), args.backend, _shape_bindings(args.shape) or None,
                            optimize=args.after != "none", verify=args.verify or None, stats=stats,
                            stop_after=None if args.after == "all" else args.after)
    if args.after == "none":
        stats.before = stats.after = graph.count_ops()
    if args.stats:
        _emit(format_stats(stats) + "\n", args.output)
    elif args.format in ("llvm", "asm"):
        from glowpy.backends import get_backend

        backend = get_backend(args.backend)
        emit = getattr(backend, "emit_llvm" if args.format == "llvm" else "emit_assembly", None)
        if emit is None:
            raise UsageError(f"--format {args.format}: the {args.backend} backend generates no code")
        _emit(emit(graph), args.output)
    elif dot_exe is not None:
        out = Path(args.output or f"{Path(args.model).stem}.{args.format}")
        render_graphviz(dot_exe, to_dot(graph), args.format, out)
        print(out)
    else:
        _emit(to_dot(graph) if args.format == "dot" else f"{graph}\n", args.output)
    return EXIT_OK


def _emit(text: str, path: str | None) -> None:
    """Text to stdout, or to the file --output names."""
    if path is None:
        print(text, end="")
        sys.stdout.flush()  # a reader that has gone (| head) shows here, inside main, not at exit
        return
    try:
        Path(path).write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write '{path}': {e.strerror}") from None


def graphviz_dot() -> str:
    """The path of Graphviz's `dot` program."""
    import shutil

    exe = shutil.which("dot")
    if exe is None:
        raise UsageError("Graphviz 'dot' is not installed: apt-get install graphviz, or use -f dot")
    return exe


def render_graphviz(exe: str, dot: str, fmt: str, out: Path) -> None:
    """Render DOT text to `out` (format `fmt`: svg, png) with Graphviz's `dot` program `exe`."""
    import subprocess

    proc = subprocess.run([exe, f"-T{fmt}", "-o", str(out)], input=dot, capture_output=True, text=True)
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines()
        raise UsageError(f"Graphviz 'dot' failed writing '{out}': {lines[-1] if lines else proc.returncode}")


# --- glowpy check ----------------------------------------------------------------------------------


def add_check(sub: argparse._SubParsersAction) -> None:
    from glowpy.backends import BACKENDS

    p = sub.add_parser("check", help="which nodes of a model a backend supports (no weights needed)", description=(
        "Report, node by node, whether a backend can run a model: op, opset, attributes and declared types only "
        "(weights are never read and may be absent). Exit 0 when every node is supported, 1 when some node is "
        "not, 2 when the model cannot be read."))
    add_model_arg(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--partition", action="store_true",
                   help="also print the offloadable subgraphs and the nodes left to the host")
    p.add_argument("--backend", "-b", default="cpu", choices=sorted(BACKENDS), help="default: %(default)s")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=DIMS",
                   help="bind the shape of input NAME, or a symbolic dim (batch=4)")
    p.set_defaults(func=cmd_check)


def _short_reason(name: str, reason: str) -> str:
    """The reason without its "node 'x' (Op, opset n): " prefix (the table has those columns)."""
    head = f"node '{name}' ("
    if reason.startswith(head) and "): " in reason:
        return reason.split("): ", 1)[1]
    return reason


def cmd_check(args: argparse.Namespace) -> int:
    import json

    import glowpy
    from glowpy.pipeline import partition

    model = _model_arg(args.model)
    shapes = _shape_bindings(args.shape) or None
    part = None
    if args.partition:
        try:
            part = partition(model, backend=args.backend, shapes=shapes)
        except glowpy.GlowpyError:
            part = None  # unreadable: the check below reports it
    report = part.report if part is not None else glowpy.check(model, backend=args.backend, shapes=shapes)
    if args.json:
        out = report.to_dict()
        if part is not None:
            out["partition"] = part.to_dict()
        print(json.dumps(out, indent=2))
    if not report.readable:
        if not args.json:
            print(f"glowpy check: error: {report.reason}", file=sys.stderr)
        return EXIT_USAGE
    if not args.json:
        names = [n.name if len(n.name) <= 40 else n.name[:37] + "..." for n in report.nodes]
        nw = max([len(x) for x in names] + [4])
        ow = max([len(n.op) for n in report.nodes] + [2])
        vw = max([len(n.status.name) for n in report.nodes] + [7])
        be = args.backend + ("" if report.backend_consulted else " (not available: op table only)")
        print(f"model    {model}\nbackend  {be}\n")
        print(f"{'node':<{nw}}  {'op':<{ow}}  {'verdict':<{vw}}  reason")
        for name, n in zip(names, report.nodes):
            print(f"{name:<{nw}}  {n.op:<{ow}}  {n.status.name:<{vw}}  {_short_reason(n.name, n.reason)}")
        for issue in report.issues:
            print(f"model: {issue.status.name}: {issue.reason}")
        for text in report.assumes:
            print(f"model: {text}")
        if part is not None:
            print()
            print("\n".join(part.describe()) or "no nodes")
        print(f"\nsummary: {report.summary()}")
    return EXIT_OK if report.supported else EXIT_FAIL


# --- glowpy bench ----------------------------------------------------------------------------------


def add_bench(sub: argparse._SubParsersAction) -> None:
    from glowpy.backends import BACKENDS, DEFAULT_BACKEND

    p = sub.add_parser("bench", help="measure compile time, latency, throughput and memory (--vs onnxruntime)",
                       description=(
        "Benchmark a model: compile time (and whether the code cache served it), latency p50/p90/p99/min, "
        "throughput and peak RSS; with --vs onnxruntime the same for onnxruntime, the latency ratio and the "
        "largest difference between the two engines' outputs. Each engine runs in its own fresh process, "
        "the engines alternate for --rounds rounds of --iterations timed runs, and figures are medians over "
        "the rounds. Inputs are deterministic (seeded), as for `glowpy run`."))
    add_model_arg(p)
    p.add_argument("--vs", metavar="ENGINE", help="also run this engine and compare: onnxruntime or openvino")
    p.add_argument("--threads", "-t", metavar="N", help="threads of each engine (default: $GLOWPY_NUM_THREADS, "
                   "else all cores)")
    p.add_argument("--iterations", "-n", metavar="K", default="30", help="timed runs per round (default: 30)")
    p.add_argument("--rounds", "-r", metavar="R", default="3", help="rounds per engine (default: 3)")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=DIMS",
                   help="bind the shape of input NAME, or a symbolic dim (batch=4)")
    p.add_argument("--backend", "-b", default=DEFAULT_BACKEND, choices=sorted(BACKENDS), help="default: %(default)s")
    p.add_argument("--no-opt", action="store_true", help="compile the graph as imported (skip the optimizer)")
    p.add_argument("--json", action="store_true", help="print every figure as one JSON object")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    from glowpy import bench

    model = _model_arg(args.model)
    iterations = _positive_int(args.iterations, "--iterations")
    rounds = _positive_int(args.rounds, "--rounds")
    shapes = _shape_bindings(args.shape)
    engines = ["glowpy"]
    if args.vs is not None:
        if args.vs not in bench.PEERS:
            raise UsageError(f"--vs {args.vs}: the engine to compare with must be one of {', '.join(bench.PEERS)}")
        if not bench.have_engine(args.vs):
            raise UsageError(f"--vs {args.vs}: {args.vs} is not installed (pip install {args.vs})")
        engines.append(args.vs)
    threads = _threads_option(args).get("threads")
    if threads is None and "threads" in _backend_options(args.backend):
        from glowpy.backends.cpu import resolve_threads

        threads = resolve_threads()  # the same count for onnxruntime
    try:
        result = bench.compare(model, engines=engines, backend=args.backend, threads=threads, iterations=iterations,
                               rounds=rounds, shapes=shapes, optimize=not args.no_opt)
    except bench.WorkerError as e:
        if e.model_error:
            raise UsageError(str(e)) from None
        print(f"glowpy bench: error: {e}", file=sys.stderr)
        return EXIT_FAIL
    result.update(backend=args.backend, shapes={k: list(v) for k, v in shapes.items()})
    if args.json:
        print(json.dumps(result, indent=2))
        return EXIT_OK
    print(f"model          {model}")
    counts = f"{threads} thread{'s' if threads > 1 else ''}" if threads else "default threads"
    print(f"settings       {args.backend} backend, {counts}, "
          f"{rounds} round{'s' if rounds > 1 else ''} x {iterations} runs per engine"
          + (f", shapes {' '.join(args.shape)}" if args.shape else ""))
    print()
    print(bench.table(result))
    return EXIT_OK


# --- glowpy bundle ----------------------------------------------------------------------------------


def add_bundle(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bundle", help="write an ahead-of-time bundle a C program runs without Python", description=(
        "Compile a model for the cpu backend and write, into DIR: NAME_model.o (the generated code), "
        "NAME.weights, NAME.h (entry point, runtime, each input and output tensor), NAME.c (the runtime), "
        "an example main.c and a Makefile: `make -C DIR` builds libNAME.a and NAME_main (cc, -lpthread -lm). "
        "Outputs equal glowpy's on this host for the same thread count."))
    add_model_arg(p)
    p.add_argument("--output", "-o", metavar="DIR", required=True, help="the bundle's directory (created if needed)")
    p.add_argument("--name", metavar="NAME", help="the C prefix of the bundle's symbols and files "
                   "(default: from the model's file name)")
    p.add_argument("--threads", "-t", metavar="N", default="1",
                   help="threads the generated code starts per run (default: 1)")
    p.add_argument("--shape", "-s", action="append", default=[], metavar="NAME=DIMS",
                   help="bind the shape of input NAME, or a symbolic dim (batch=4)")
    p.add_argument("--isa", choices=("host", "avx2"), default="host",
                   help="vector code for this host's CPU, or AVX2 only (default: %(default)s)")
    p.add_argument("--no-opt", action="store_true", help="compile the graph as imported (skip the optimizer)")
    p.set_defaults(func=cmd_bundle)


def cmd_bundle(args: argparse.Namespace) -> int:
    from glowpy.bundle import write_bundle

    model = _model_arg(args.model)
    threads = _positive_int(args.threads, "--threads")
    shapes = _shape_bindings(args.shape)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output '{out}' is not a directory")
    b = write_bundle(model, out, name=args.name, threads=threads, shapes=shapes or None, optimize=not args.no_opt,
                     isa=args.isa)
    print(f"bundle    {b.name}: {b.threads} thread{'s' if b.threads > 1 else ''}, arena {_human_bytes(b.arena_bytes)}, "
          f"weights {_human_bytes(b.weights_bytes)}, code {_human_bytes(b.object_bytes)}")
    for kind, tensors in (("input", b.inputs), ("output", b.outputs)):
        for name, dtype, shape in tensors:
            print(f"{kind:<9} {name}: {dtype} [{', '.join(map(str, shape))}]")
    for f in b.files:
        print(f"wrote     {f}")
    print(f"build     make -C {out}   (then: cd {out} && ./{b.name}_main -n 10)")
    return EXIT_OK


# --- glowpy onnxifi ---------------------------------------------------------------------------------


def add_onnxifi(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("onnxifi", help="build or locate libonnxifi-glowpy.so, the ONNXIFI C library", description=(
        "The ONNXIFI backend library hosts dlopen (cffi embedding mode; header in glowpy/onnxifi/include). "
        "Both actions print the library's path on their last line."))
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("build", "compile the library (about a second)"),
                       ("path", "print the library's path, building it first if it is missing or stale")):
        a = actions.add_parser(name, help=text, description=text)
        a.add_argument("--output", "-o", metavar="DIR", help="the library's directory (default: the user cache)")
    p.set_defaults(func=cmd_onnxifi)


def cmd_onnxifi(args: argparse.Namespace) -> int:
    from glowpy.onnxifi import build

    try:
        if args.action == "build" or not build.is_current(args.output):
            print(f"building  {build.library_path(args.output)} (header {build.HEADER})")
            lib = build.build(args.output)
        else:
            lib = build.library_path(args.output)
    except Exception as e:  # noqa: BLE001  (compiler and cffi failures: one line, no traceback)
        print(f"glowpy onnxifi: error: cannot build the library: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_FAIL
    print(lib)
    return EXIT_OK


# --- glowpy cache -----------------------------------------------------------------------------------


def add_cache(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="the compile cache: where it is, what it holds, empty it", description=(
        "The cpu backend's on-disk cache: object code, model entries (optimized graph and packed weights) and "
        "their indexes. Directory: $GLOWPY_CACHE_DIR, else $XDG_CACHE_HOME/glowpy, else ~/.cache/glowpy. Size cap: "
        "$GLOWPY_CACHE_MAX_BYTES (e.g. 2G; 0: no cap; default 4G), least recently used entries evicted first."))
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("info", "print the directory, the number of entries, their size and the cap"),
                       ("clear", "remove every entry (the onnxifi library directory is kept)"),
                       ("path", "print the cache directory")):
        actions.add_parser(name, help=text, description=text)
    p.set_defaults(func=cmd_cache)


def cmd_cache(args: argparse.Namespace) -> int:
    from glowpy.backends.cpu import cache

    directory = cache.cache_dir()
    if args.action == "path":
        print(directory)
    elif args.action == "clear":
        n, freed = cache.clear(directory)
        print(f"removed   {n} entries ({_human_bytes(freed)}) from {directory}")
    else:
        found = cache.entries(directory)
        kinds = {"model": 0, "code": 0, "kernels": 0, "index": 0}
        size = {k: 0 for k in kinds}
        for path, nbytes, _ in found:
            if path.suffix == ".tmp":
                continue
            kind = ("model" if path.name.startswith("model-") else "kernels" if path.name.startswith("k-") else
                    "index" if path.name.startswith(("idx-", "path-")) else "code")
            kinds[kind] += 1
            size[kind] += nbytes
        cap = cache.max_bytes()
        print(f"directory {directory}")
        for kind, label in (("model", "model entries (graph + weights files)"), ("code", "models' object code"),
                            ("kernels", "kernels' object code (shared across models)"), ("index", "indexes")):
            print(f"{kind:<9} {kinds[kind]} files, {_human_bytes(size[kind])}  {label}")
        print(f"total     {_human_bytes(sum(size.values()))} of {_human_bytes(cap) if cap else 'no'} cap "
              "(GLOWPY_CACHE_MAX_BYTES)")
    return EXIT_OK


# --- glowpy quantize --------------------------------------------------------------------------------


def add_quantize(sub: argparse._SubParsersAction) -> None:
    from glowpy.backends import BACKENDS

    p = sub.add_parser("quantize", help="profile a float model on calibration data and write its int8 QDQ model",
                       description=(
                           "Run the float model on calibration inputs, record the range of every Conv / MatMul / "
                           "Gemm input, and write a QDQ model: QuantizeLinear / DequantizeLinear around those "
                           "inputs, per-channel symmetric int8 weights, per-tensor activations. onnxruntime runs it."))
    add_model_arg(p)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--calibrate", "-c", metavar="DATA.npz",
                        help="one array per model input: one batch of its shape, or a stack (samples, *shape)")
    source.add_argument("--load-profile", metavar="PROFILE.json", help="ranges saved by --dump-profile instead")
    p.add_argument("--output", "-o", metavar="MODEL.int8.onnx", help="where to write the QDQ model")
    p.add_argument("--dump-profile", metavar="PROFILE.json", help="save the profiled ranges (JSON)")
    p.add_argument("--method", choices=("minmax", "percentile", "entropy", "mse"), default="minmax",
                   help="how a range is taken from the profile (default: %(default)s)")
    p.add_argument("--percentile", type=float, default=99.99,
                   help="with --method percentile: keep this central share of each histogram (default: %(default)s)")
    p.add_argument("--activations", choices=("uint8", "int8"), default="uint8",
                   help="activation type (default: %(default)s)")
    p.add_argument("--per-tensor-weights", action="store_true", help="one scale per weight instead of per channel")
    p.add_argument("--weight-range", choices=("max", "mse"), default="max",
                   help="int8 weight scale from each channel's max |w| or its least-squared-error clip "
                        "(default: %(default)s)")
    p.add_argument("--float-residual", action="store_true",
                   help="keep Adds of two activations (residual connections) and their operands in float")
    p.add_argument("--backend", "-b", default="interpreter", choices=sorted(BACKENDS),
                   help="the backend that runs the float model to profile it (default: %(default)s)")
    p.set_defaults(func=cmd_quantize)


def cmd_quantize(args: argparse.Namespace) -> int:
    import onnx

    from glowpy.quantize import load_profile, profile, quantize, save_profile

    model_path = _model_arg(args.model)
    if not args.output and not args.dump_profile:
        raise UsageError("nothing to write: give --output, --dump-profile or both")
    if args.load_profile and args.dump_profile:
        raise UsageError("--dump-profile needs --calibrate (a loaded profile is already on disk)")
    if args.load_profile:
        ranges = load_profile(args.load_profile)
        origin = f"{args.load_profile} (loaded)"
    else:
        ranges = profile(model_path, args.calibrate, method=args.method, percentile=args.percentile,
                         backend=args.backend)
        origin = f"{args.calibrate} ({args.method}" + (f" {args.percentile}" if args.method == "percentile" else "") \
            + f", {args.backend})"
    print(f"model     {args.model}")
    print(f"profile   {origin}: {len(ranges)} tensors")
    if args.dump_profile:
        save_profile(ranges, args.dump_profile)
        print(f"saved     {args.dump_profile}")
    if not args.output:
        return EXIT_OK
    model = quantize(model_path, ranges=ranges, activations=args.activations,
                     per_channel=not args.per_tensor_weights, weight_range=args.weight_range,
                     residual=not args.float_residual)
    counts: dict[str, int] = {}
    kinds = {t.name: t.data_type for t in model.graph.initializer}
    for n in model.graph.node:
        kind = n.op_type if n.op_type != "DequantizeLinear" or n.input[0] not in kinds else \
            "bias" if kinds[n.input[0]] == onnx.TensorProto.INT32 else "weight"
        counts[kind] = counts.get(kind, 0) + 1
    try:
        onnx.save(model, args.output)
    except OSError as e:
        raise UsageError(f"cannot write '{args.output}': {e.strerror}") from None
    print(f"quantized {counts.get('QuantizeLinear', 0)} activations ({args.activations}), "
          f"{counts.get('weight', 0)} weights (int8, {'per tensor' if args.per_tensor_weights else 'per channel'}), "
          f"{counts.get('bias', 0)} biases (int32)")
    print(f"saved     {args.output}")
    return EXIT_OK


# --- entry -----------------------------------------------------------------------------------------

COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [add_run, add_dump, add_check, add_bench, add_onnxifi,
                                                                add_quantize, add_cache, add_bundle]


def build_parser() -> argparse.ArgumentParser:
    from glowpy import __version__

    parser = _Parser(prog="glowpy", description="A Glow-style graph compiler for ONNX models.", epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"glowpy {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
    return parser


def _refuse_special_files(args: argparse.Namespace) -> None:
    """A model or input path naming a directory, fifo or device is refused before it is opened (a fifo
    would block the read forever). Missing paths are left to the command (dump takes model names)."""
    paths = [("model", args.model)] if isinstance(getattr(args, "model", None), str) else []
    paths += [("input", _name_value(item, "--input")[1]) for item in getattr(args, "input", None) or []]
    for what, path in paths:
        try:
            mode = Path(path).stat().st_mode
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(mode):
            kind = "a directory" if stat.S_ISDIR(mode) else "a fifo" if stat.S_ISFIFO(mode) else "not a regular file"
            raise UsageError(f"{what} '{path}' is {kind}: expected a file")


def _dispatch(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    from glowpy.errors import GlowpyError

    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        from glowpy.limits import memory_budget

        memory_budget()  # a malformed GLOWPY_MAX_MEMORY fails here, once, not node by node
        _refuse_special_files(args)
        return args.func(args)
    except (UsageError, GlowpyError) as e:
        print(f"glowpy {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except MemoryError:
        from glowpy.limits import ENV

        print(f"glowpy {args.command}: error: out of memory (lower the model's sizes, or set {ENV} to refuse "
              "such models before allocating)", file=sys.stderr)
        return EXIT_USAGE
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except OSError as e:  # a file the command writes or reads (-o to a directory, a full disk)
        print(f"glowpy {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """The entry point: every failure is one line on stderr and an exit code (EXIT_CODES), never a
    traceback."""
    try:
        return _dispatch(build_parser(), argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Whoever read stdout has gone (glowpy dump | head): nothing more can be said there, and
        # Python's final flush must not fail again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001  (a bug in glowpy: one line, not a traceback)
        print(f"glowpy: internal error: {type(e).__name__}: {_one_line(e)} (this is a bug in glowpy: please "
              "report it with the command line and the model)", file=sys.stderr)
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
