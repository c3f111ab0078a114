"""Rewrite tests/zoo/expected.json from a run: each zoo skeleton realized and compiled with glowpy.

    python tools/zoo/expect.py [-j N] [--check]

Each model is recorded as "pass" when glowpy compiles it, or as the error class and the op it names when
glowpy refuses it. A compiled model that differs from onnxruntime is printed and makes the exit status 1
(the zoo test fails on it; it is still recorded as "pass", the outcome of its compile). `--check` writes
nothing and exits 1 when the file would change. `--table` runs nothing and prints the model x exporter
table of docs/ZOO.md from tools/zoo/export_status.json and expected.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.zoo.harness import (  # noqa: E402
    EXPECTED_PATH,
    compile_outcome,
    load_expected,
    mismatches,
    realized,
    skeleton_names,
)

STATUS_PATH = ROOT / "tools" / "zoo" / "export_status.json"
EXPORTERS = ("dynamo", "torchscript")


def table() -> str:
    """Markdown: one row per model, per exporter the export result and glowpy's outcome."""
    status, expected = json.loads(STATUS_PATH.read_text()), load_expected()
    rows = ["| model | " + " | ".join(f"{e} export | {e} glowpy" for e in EXPORTERS) + " |",
            "| --- |" + " --- | --- |" * len(EXPORTERS)]
    for model in sorted({key.rsplit(".", 1)[0] for key in status}):
        cells = []
        for exporter in EXPORTERS:
            key = f"{model}.{exporter}"
            export = status.get(key, {"status": "not run"})
            outcome = expected.get(key, "-")
            cells += ["ok" if export["status"] == "ok" else f"failed: {export.get('error', '')}",
                      outcome if isinstance(outcome, str) else f"{outcome['error']} {outcome['op']}"]
        rows.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def run(name: str) -> tuple[str, object, list[str], float]:
    start = time.perf_counter()
    model = realized(name)
    compiled, outcome = compile_outcome(model)
    problems = mismatches(model, compiled, name) if compiled is not None else []
    return name, outcome, problems, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=1, help="models run in parallel (default: 1)")
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if expected.json would change")
    ap.add_argument("--table", action="store_true", help="print the status table of docs/ZOO.md and exit")
    ap.add_argument("names", nargs="*", help="only these MODEL.EXPORTER entries (the rest are kept as recorded)")
    args = ap.parse_args(argv)
    if args.table:
        print(table())
        return 0
    names = args.names or skeleton_names()
    outcomes = {k: v for k, v in load_expected().items() if args.names} if EXPECTED_PATH.exists() else {}
    failed = False
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        for name, outcome, problems, seconds in pool.imap_unordered(run, names):
            outcomes[name] = outcome
            verdict = "pass" if outcome == "pass" else f"{outcome['error']} {outcome['op']}"
            if problems:
                failed = True
                verdict = "MISMATCH " + problems[0].splitlines()[0]
            print(f"{name:40s} {verdict}  ({seconds:.1f} s)", flush=True)
    text = json.dumps(dict(sorted(outcomes.items())), indent=1) + "\n"
    if args.check:
        return int(failed or not EXPECTED_PATH.exists() or EXPECTED_PATH.read_text() != text)
    EXPECTED_PATH.write_text(text)
    print(f"wrote {EXPECTED_PATH.relative_to(ROOT)}: {sum(v == 'pass' for v in outcomes.values())} of "
          f"{len(outcomes)} compile")
    return int(failed)


if __name__ == "__main__":
    sys.exit(main())
