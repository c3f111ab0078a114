"""Ahead-of-time bundles: a compiled model as files a C program builds and runs without Python.

`write_bundle(model, "out/")` (`glowpy bundle MODEL -o out/`) writes, for a bundle NAME:

    NAME_model.o   the generated module (position-independent; two global symbols, NAME_entry and
                   NAME_release)
    NAME.weights   the weights table's arrays, each 64-byte aligned, behind a 64-byte header
    NAME.h         the entry, the runtime (load / run / free) and each input and output tensor
    NAME.c         the runtime: reads the weights file, points the table at it, owns the arena
    main.c         an example: inputs from raw files or a seeded pattern, outputs to raw files
    Makefile       `make` -> libNAME.a and NAME_main (cc, -lpthread -lm)

The code is what the cpu backend JIT-compiles for the same options (the same kernels, weights table
and arena plan), so a bundle's outputs equal `glowpy.compile(model, threads=T)`'s bit for bit on the
same host. The thread count is fixed at bundle time: the first run on an arena starts the generated
code's own thread pool (kept in the arena, parked between runs), and NAME_free joins it
(NAME_release) before it frees the arena.

The seeded pattern of main.c is `pattern()` here: a 64-bit LCG per input, 24 bits per element.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llvmlite.binding as llvm
import numpy as np
from onnx import helper

from glowpy import __version__, pipeline
from glowpy.backends.cpu import CpuBackend, codegen
from glowpy.backends.cpu.target import optimize as optimize_module
from glowpy.backends.cpu.target import parse
from glowpy.backends.cpu.threads import RELEASE
from glowpy.errors import UnsupportedAttribute, UnsupportedDatatype
from glowpy.ir.graph import Value

WEIGHTS_MAGIC = b"GLOWPYW1"
HEADER_BYTES = 64
ALIGN = 64
LCG_MUL, LCG_ADD, SEED_MUL = 6364136223846793005, 1442695040888963407, 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
PATTERN_DTYPES = frozenset("float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 uint64 bool".split())


@dataclass
class Bundle:
    """What write_bundle wrote."""

    name: str
    directory: Path
    files: list[Path]
    inputs: list[tuple[str, str, tuple[int, ...]]]
    outputs: list[tuple[str, str, tuple[int, ...]]]
    threads: int
    arena_bytes: int
    weights_bytes: int
    object_bytes: int


def c_name(text: str) -> str:
    """A C identifier from a model name: `light_squeezenet`, `resnet_18`."""
    name = re.sub(r"\W", "_", text).strip("_") or "model"
    return f"m_{name}" if name[0].isdigit() else name


def pattern(dtype: np.dtype | str, shape: tuple[int, ...], seed: int = 0, index: int = 0) -> np.ndarray:
    """The input main.c makes for input `index` without an input file (the same numbers, bit for bit)."""
    dtype = np.dtype(dtype)
    if dtype.name not in PATTERN_DTYPES:
        raise UnsupportedDatatype("the bundle's seeded pattern has no rule for this element type",
                                  expected=sorted(PATTERN_DTYPES), found=dtype.name)
    n = int(np.prod(shape, dtype=np.int64))
    state = (((seed + 1) * SEED_MUL) & MASK64) ^ index
    bits = np.empty(n, np.int64)
    for i in range(n):
        state = (state * LCG_MUL + LCG_ADD) & MASK64
        bits[i] = state >> 40
    if dtype.kind == "f":
        out = bits.astype(np.float64) / 8388608.0 - 1.0
    elif dtype.kind == "b":
        out = (bits & 1).astype(bool)
    else:
        out = bits % 10
    return out.astype(dtype).reshape(shape)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _tensors(values: list[Value]) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(v.name, np.dtype(v.dtype).name, tuple(int(d) for d in v.shape)) for v in values]


def _object(ir_text: str, name: str, isa: str) -> bytes:
    """Optimized position-independent object code with NAME_entry and NAME_release the only global
    definitions."""
    target = CpuBackend().target_for({"isa": isa})
    module = parse(ir_text, target)
    for fn in module.functions:
        if fn.is_declaration:
            continue
        if fn.name == codegen.ENTRY:
            fn.name = f"{name}_entry"
        elif fn.name == RELEASE:
            fn.name = f"{name}_release"
        else:
            fn.linkage = "internal"
    for gv in module.global_variables:
        if not gv.is_declaration:
            gv.linkage = "internal"
    optimize_module(module, target)
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="default")
    return machine.emit_object(module)


def write_bundle(model: Any, directory: str | Path, *, name: str | None = None, threads: int = 1,
                 shapes: Mapping[str, tuple[int, ...]] | None = None, optimize: bool = True,
                 isa: str = "host") -> Bundle:
    """Compile `model` for the cpu backend and write its bundle into `directory` (created if needed)."""
    if name is not None and c_name(name) != name:
        raise UnsupportedAttribute("a bundle name must be a C identifier", expected=c_name(name), found=name)
    graph = pipeline.optimized_graph(model, "cpu", shapes, optimize=optimize)
    if name is None:
        stem = Path(model).stem if isinstance(model, (str, Path)) else graph.name
        name = c_name(stem)
    program = CpuBackend().build(graph, threads=threads, isa=isa)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)

    digest = hashlib.sha256(program.ir_text.encode())
    offsets, at = [], HEADER_BYTES
    for w in program.weights:
        offsets.append(at)
        at = _align(at + w.nbytes)
        digest.update(np.ascontiguousarray(w).reshape(-1).view(np.uint8).data)
    file_bytes = at
    bundle_id = int.from_bytes(digest.digest()[:8], "little") & ((1 << 63) - 1)

    obj = _object(program.ir_text, name, isa)
    files = {f"{name}_model.o": obj}
    weights_path = out / f"{name}.weights"
    with open(weights_path, "wb") as f:
        f.write(WEIGHTS_MAGIC + struct.pack("<QQQ", bundle_id, len(program.weights), file_bytes).ljust(
            HEADER_BYTES - len(WEIGHTS_MAGIC), b"\0"))
        for w, off in zip(program.weights, offsets):
            f.seek(off)
            f.write(np.ascontiguousarray(w).reshape(-1).view(np.uint8).data)
        f.truncate(file_bytes)
    inputs, outputs = _tensors(graph.inputs), _tensors(graph.outputs)
    nthreads = program.nthreads if program.threaded else 1
    info = dict(name=name, model=str(model) if isinstance(model, (str, Path)) else graph.name, inputs=inputs,
                outputs=outputs, threads=nthreads, arena=program.arena_size, weights=file_bytes,
                nweights=len(program.weights), offsets=offsets, bundle_id=bundle_id,
                cpu=CpuBackend().target_for({"isa": isa}).cpu)
    files[f"{name}.h"] = _header(info).encode()
    files[f"{name}.c"] = _runtime(info).encode()
    files["main.c"] = _main(info).encode()
    files["Makefile"] = _makefile(name).encode()
    for fname, data in files.items():
        (out / fname).write_bytes(data)
    paths = [out / f for f in files] + [weights_path]
    return Bundle(name, out, sorted(paths), inputs, outputs, nthreads, program.arena_size, file_bytes, len(obj))


# --- the C sources -----------------------------------------------------------------------------------


def _c_string(s: str) -> str:
    """A C string literal of `s` (UTF-8; octal escapes for quotes, backslashes and non-printable bytes)."""
    return '"' + "".join(chr(c) if 32 <= c < 127 and c not in (34, 63, 92) else f"\\{c:03o}"
                         for c in s.encode()) + '"'


def _comment(s: str) -> str:
    """`s` safe inside a C block comment, on one line."""
    return "".join(ch if ch.isprintable() else "?" for ch in s).replace("*/", "*?/")


def _tensor_table(name: str, kind: str, tensors: list[tuple[str, str, tuple[int, ...]]]) -> str:
    lines = []
    for j, (_, _, shape) in enumerate(tensors):
        dims = ", ".join(str(d) for d in shape) or "1"
        lines.append(f"static const int64_t {name}_{kind}{j}_shape[] = {{{dims}}};")
    rows = []
    for j, (tname, dtype, shape) in enumerate(tensors):
        code = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        size = int(np.prod(shape, dtype=np.int64))
        item = np.dtype(dtype).itemsize
        rows.append(f"    {{{_c_string(tname)}, {code}, \"{dtype}\", {item}, {len(shape)}, {name}_{kind}{j}_shape, "
                    f"{size}, {size * item}}},")
    lines.append(f"const glowpy_tensor_info {name}_{kind}s[] = {{\n" + "\n".join(rows) + "\n};")
    return "\n".join(lines)


def _header(i: dict[str, Any]) -> str:
    n = i["name"]
    guard = f"GLOWPY_BUNDLE_{n.upper()}_H"

    def describe(tensors: list[tuple[str, str, tuple[int, ...]]]) -> str:
        return "\n".join(f" *   [{j}] {_comment(t[0])}: {t[1]} [{', '.join(map(str, t[2]))}]"
                         for j, t in enumerate(tensors))

    return f"""/* {n}: a glowpy {__version__} bundle of {_comment(i['model'])}
 * (generated code for {i['cpu']}, {i['threads']} thread{'s' if i['threads'] > 1 else ''}).
 * Inputs:
{describe(i['inputs'])}
 * Outputs:
{describe(i['outputs'])}
 * Tensors are dense, row-major (C order), in native byte order.
 */
#ifndef {guard}
#define {guard}

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#ifndef GLOWPY_TENSOR_INFO
#define GLOWPY_TENSOR_INFO
typedef struct {{
    const char *name;
    int dtype;              /* ONNX TensorProto.DataType: 1 float32, 2 uint8, 3 int8, 6 int32, 7 int64, 9 bool, ... */
    const char *dtype_name; /* numpy's name: "float32", ... */
    size_t element_size;    /* bytes */
    int rank;
    const int64_t *shape;   /* rank dims */
    size_t size;            /* elements */
    size_t nbytes;
}} glowpy_tensor_info;
#endif

#define {n.upper()}_NUM_INPUTS {len(i['inputs'])}
#define {n.upper()}_NUM_OUTPUTS {len(i['outputs'])}
#define {n.upper()}_THREADS {i['threads']}
#define {n.upper()}_ARENA_BYTES {i['arena']}u
#define {n.upper()}_WEIGHTS_FILE_BYTES {i['weights']}u
extern const glowpy_tensor_info {n}_inputs[];
extern const glowpy_tensor_info {n}_outputs[];

/* The generated entry (NAME_model.o): the weights table, a 64-byte aligned arena of ARENA_BYTES, and
 * one pointer per input and per output (outputs are written in place). One run per arena at a time. */
void {n}_entry(void **weights, void *arena, void **inputs, void **outputs);
/* Joins the threads the entry started for this arena (none with one thread); the next run on it
 * starts them again. Call it, with no run in flight, before the arena is freed. */
void {n}_release(void *arena);

/* The runtime ({n}.c). */
typedef struct {n}_model {n}_model;
/* Reads the weights file and allocates the arena; NULL (with a message on stderr) on failure. */
{n}_model *{n}_load(const char *weights_path);
void {n}_run({n}_model *model, const void *const *inputs, void *const *outputs);
void {n}_free({n}_model *model);

#ifdef __cplusplus
}}
#endif
#endif
"""


def _runtime(i: dict[str, Any]) -> str:
    n = i["name"]
    items = [f"{o}u" for o in i["offsets"]] or ["0u"]
    offsets = ",\n    ".join(", ".join(items[k:k + 8]) for k in range(0, len(items), 8))
    return f"""/* The runtime of the {n} bundle: weights from {n}.weights, an arena, the entry. */
#include "{n}.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

{_tensor_table(n, "input", i['inputs'])}
{_tensor_table(n, "output", i['outputs'])}

#define NUM_WEIGHTS {i['nweights']}
#define BUNDLE_ID {i['bundle_id']}ull
static const uint64_t weight_offsets[] = {{
    {offsets}
}};

struct {n}_model {{
    unsigned char *blob;  /* the weights file, 64-byte aligned */
    void *table[NUM_WEIGHTS + 1];
    void *arena;
}};

static void *aligned_block(size_t nbytes) {{
    size_t size = (nbytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, size ? size : 64);
    if (p) memset(p, 0, size ? size : 64);
    return p;
}}

{n}_model *{n}_load(const char *weights_path) {{
    {n}_model *m = calloc(1, sizeof *m);
    FILE *f = fopen(weights_path, "rb");
    if (!m || !f) {{
        fprintf(stderr, "{n}: cannot open %s\\n", weights_path);
        goto fail;
    }}
    m->blob = aligned_block({n.upper()}_WEIGHTS_FILE_BYTES);
    m->arena = aligned_block({n.upper()}_ARENA_BYTES);
    if (!m->blob || !m->arena) {{
        fprintf(stderr, "{n}: out of memory\\n");
        goto fail;
    }}
    size_t got = fread(m->blob, 1, {n.upper()}_WEIGHTS_FILE_BYTES, f);
    int extra = fgetc(f);
    uint64_t head[3];
    memcpy(head, m->blob + 8, sizeof head);
    if (got != {n.upper()}_WEIGHTS_FILE_BYTES || extra != EOF || memcmp(m->blob, "{WEIGHTS_MAGIC.decode()}", 8) != 0 ||
        head[0] != BUNDLE_ID || head[1] != NUM_WEIGHTS || head[2] != {n.upper()}_WEIGHTS_FILE_BYTES) {{
        fprintf(stderr, "{n}: %s is not the weights file of this bundle\\n", weights_path);
        goto fail;
    }}
    fclose(f);
    for (int k = 0; k < NUM_WEIGHTS; k++) m->table[k] = m->blob + weight_offsets[k];
    return m;
fail:
    if (f) fclose(f);
    {n}_free(m);
    return NULL;
}}

void {n}_run({n}_model *m, const void *const *inputs, void *const *outputs) {{
    {n}_entry(m->table, m->arena, (void **)inputs, (void **)outputs);
}}

void {n}_free({n}_model *m) {{
    if (!m) return;
    if (m->arena) {n}_release(m->arena);
    free(m->blob);
    free(m->arena);
    free(m);
}}
"""


def _main(i: dict[str, Any]) -> str:
    n = i["name"]
    N = n.upper()
    return f"""/* An example program for the {n} bundle:
 *
 *   ./{n}_main [-w WEIGHTS] [-i INPUT.bin]... [-s SEED] [-o DIR] [-n RUNS]
 *
 * Weights: {n}.weights beside the program unless -w names the file.
 * Inputs: one raw file per input (-i, in order; exactly the tensor's bytes), else a seeded pattern.
 * Outputs: DIR/output<j>.bin (raw), with -o DIR. Prints each output's shape and a checksum, and the
 * mean time of RUNS runs.
 */
#define _POSIX_C_SOURCE 200809L
#include "{n}.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The seeded pattern (glowpy.bundle.pattern): a 64-bit LCG, 24 bits per element. */
static void fill_pattern(const glowpy_tensor_info *t, void *data, uint64_t seed, uint64_t index) {{
    uint64_t s = ((seed + 1) * 0x9E3779B97F4A7C15ull) ^ index;
    for (size_t e = 0; e < t->size; e++) {{
        s = s * {LCG_MUL}ull + {LCG_ADD}ull;
        int64_t r = (int64_t)(s >> 40);
        double x = (double)r / 8388608.0 - 1.0;
        switch (t->dtype) {{
        case 1: ((float *)data)[e] = (float)x; break;
        case 11: ((double *)data)[e] = x; break;
        case 2: ((uint8_t *)data)[e] = (uint8_t)(r % 10); break;
        case 3: ((int8_t *)data)[e] = (int8_t)(r % 10); break;
        case 4: ((uint16_t *)data)[e] = (uint16_t)(r % 10); break;
        case 5: ((int16_t *)data)[e] = (int16_t)(r % 10); break;
        case 6: ((int32_t *)data)[e] = (int32_t)(r % 10); break;
        case 7: ((int64_t *)data)[e] = r % 10; break;
        case 9: ((uint8_t *)data)[e] = (uint8_t)(r & 1); break;
        case 12: ((uint32_t *)data)[e] = (uint32_t)(r % 10); break;
        case 13: ((uint64_t *)data)[e] = (uint64_t)(r % 10); break;
        default:
            fprintf(stderr, "input %s: no seeded pattern for %s; give -i FILE\\n", t->name, t->dtype_name);
            exit(2);
        }}
    }}
}}

static int read_raw(const char *path, void *data, size_t nbytes) {{
    FILE *f = fopen(path, "rb");
    if (!f) {{
        fprintf(stderr, "cannot open %s\\n", path);
        return -1;
    }}
    size_t got = fread(data, 1, nbytes, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != nbytes || extra != EOF) {{
        fprintf(stderr, "%s: expected exactly %zu bytes\\n", path, nbytes);
        return -1;
    }}
    return 0;
}}

static double checksum(const glowpy_tensor_info *t, const void *data) {{
    double sum = 0;
    for (size_t e = 0; e < t->size; e++) {{
        switch (t->dtype) {{
        case 1: sum += ((const float *)data)[e]; break;
        case 11: sum += ((const double *)data)[e]; break;
        case 6: sum += ((const int32_t *)data)[e]; break;
        case 7: sum += (double)((const int64_t *)data)[e]; break;
        default: sum += ((const unsigned char *)data)[e * t->element_size]; break;
        }}
    }}
    return sum;
}}

static double now(void) {{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}}

int main(int argc, char **argv) {{
    char beside[4096];
    const char *slash = strrchr(argv[0], '/');
    if (slash) snprintf(beside, sizeof beside, "%.*s/{n}.weights", (int)(slash - argv[0]), argv[0]);
    else snprintf(beside, sizeof beside, "{n}.weights");
    const char *weights = beside, *outdir = NULL, *files[{N}_NUM_INPUTS + 1] = {{0}};
    int nfiles = 0, runs = 1;
    unsigned long long seed = 0;
    for (int a = 1; a < argc; a++) {{
        if (a + 1 >= argc) {{
            fprintf(stderr, "usage: %s [-w WEIGHTS] [-i INPUT.bin]... [-s SEED] [-o DIR] [-n RUNS]\\n", argv[0]);
            return 2;
        }}
        if (!strcmp(argv[a], "-w")) weights = argv[++a];
        else if (!strcmp(argv[a], "-o")) outdir = argv[++a];
        else if (!strcmp(argv[a], "-s")) seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "-n")) runs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "-i") && nfiles < {N}_NUM_INPUTS) files[nfiles++] = argv[++a];
        else {{
            fprintf(stderr, "%s: unexpected argument %s (the model has %d inputs)\\n", argv[0], argv[a],
                    {N}_NUM_INPUTS);
            return 2;
        }}
    }}
    if (nfiles != 0 && nfiles != {N}_NUM_INPUTS) {{
        fprintf(stderr, "give -i for all %d inputs, or none for the seeded pattern\\n", {N}_NUM_INPUTS);
        return 2;
    }}
    {n}_model *model = {n}_load(weights);
    if (!model) return 1;
    void *inputs[{N}_NUM_INPUTS + 1], *outputs[{N}_NUM_OUTPUTS + 1];
    for (int k = 0; k < {N}_NUM_INPUTS; k++) {{
        const glowpy_tensor_info *t = &{n}_inputs[k];
        inputs[k] = aligned_alloc(64, (t->nbytes + 63) / 64 * 64 + 64);
        if (nfiles ? read_raw(files[k], inputs[k], t->nbytes) : (fill_pattern(t, inputs[k], seed, k), 0)) return 2;
    }}
    for (int j = 0; j < {N}_NUM_OUTPUTS; j++)
        outputs[j] = aligned_alloc(64, ({n}_outputs[j].nbytes + 63) / 64 * 64 + 64);
    if (runs < 1) runs = 1;
    double start = now();
    for (int r = 0; r < runs; r++) {n}_run(model, (const void *const *)inputs, outputs);
    double mean = (now() - start) / runs;
    for (int j = 0; j < {N}_NUM_OUTPUTS; j++) {{
        const glowpy_tensor_info *t = &{n}_outputs[j];
        printf("output %d %s: %s [", j, t->name, t->dtype_name);
        for (int d = 0; d < t->rank; d++) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
        printf("] sum %.6g\\n", checksum(t, outputs[j]));
        if (outdir) {{
            char path[4096];
            snprintf(path, sizeof path, "%s/output%d.bin", outdir, j);
            FILE *f = fopen(path, "wb");
            if (!f || fwrite(outputs[j], 1, t->nbytes, f) != t->nbytes) {{
                fprintf(stderr, "cannot write %s\\n", path);
                return 1;
            }}
            fclose(f);
        }}
    }}
    printf("%d run%s, mean %.3f ms ({N}_THREADS = %d)\\n", runs, runs > 1 ? "s" : "", mean * 1e3, {N}_THREADS);
    for (int k = 0; k < {N}_NUM_INPUTS; k++) free(inputs[k]);
    for (int j = 0; j < {N}_NUM_OUTPUTS; j++) free(outputs[j]);
    {n}_free(model);
    return 0;
}}
"""


def _makefile(n: str) -> str:
    return f"""# Builds the {n} bundle: lib{n}.a (generated code + runtime) and the example {n}_main.
CC ?= cc
CFLAGS ?= -O2 -std=c11 -Wall
LDLIBS = -lpthread -lm

all: {n}_main

lib{n}.a: {n}_model.o {n}.o
\tar rcs $@ $^

{n}.o: {n}.c {n}.h
\t$(CC) $(CFLAGS) -c -o $@ {n}.c

main.o: main.c {n}.h
\t$(CC) $(CFLAGS) -c -o $@ main.c

{n}_main: main.o lib{n}.a
\t$(CC) $(LDFLAGS) -o $@ main.o lib{n}.a $(LDLIBS)

clean:
\trm -f main.o {n}.o lib{n}.a {n}_main

.PHONY: all clean
"""
