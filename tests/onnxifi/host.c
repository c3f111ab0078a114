/*
 * A C host for the ONNXIFI acceptance test: it loads a backend library the way frameworks do
 * (dlopen RTLD_NOW | RTLD_LOCAL, every symbol by its plain name) and drives it from a script the
 * Python test writes.
 *
 *   host LIBRARY SCRIPT
 *
 * Script lines (whitespace separated; dims are a count followed by the extents):
 *   backend SUBSTRING                 use the backend whose ONNXIFI_BACKEND_NAME contains SUBSTRING
 *   compat MODEL STATUS               onnxGetBackendCompatibility(MODEL) must return STATUS
 *   contract RELU_MODEL ADD_MODEL     the error contract (RELU: x[2,3] -> y; ADD: y = x[2,3] + w[2,3])
 *   model PATH                        the model to run
 *   weight NAME DTYPE RANK DIMS... BLOB OFFSET
 *   input NAME DTYPE RANK DIMS... FILE
 *   output NAME DTYPE RANK DIMS... EXPECTED_FILE      (float32 outputs are compared)
 *   tolerance ATOL RTOL
 *   run N                             init backend and graph, free the weights, run N times
 *
 * Prints one line per check and a summary "host: N checks, M failed"; exits 1 if any failed.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "host_util.h"
#include "onnxifi.h"

#define MAX_TENSORS 1024
#define MAX_RANK 8

static int checks = 0, failures = 0;

static void expect(const char* what, onnxStatus got, onnxStatus want) {
  checks++;
  if (got == want) {
    printf("ok    %-58s status 0x%04x\n", what, (unsigned)got);
  } else {
    failures++;
    printf("FAIL  %-58s status 0x%04x, expected 0x%04x\n", what, (unsigned)got, (unsigned)want);
  }
}

static void expect_true(const char* what, int cond) {
  checks++;
  if (!cond) failures++;
  printf("%s  %s\n", cond ? "ok  " : "FAIL", what);
}

static size_t elem_size(uint64_t dtype) {
  switch (dtype) {
  case ONNXIFI_DATATYPE_UINT8: case ONNXIFI_DATATYPE_INT8: return 1;
  case ONNXIFI_DATATYPE_UINT16: case ONNXIFI_DATATYPE_INT16: case ONNXIFI_DATATYPE_FLOAT16: return 2;
  case ONNXIFI_DATATYPE_FLOAT32: case ONNXIFI_DATATYPE_INT32: case ONNXIFI_DATATYPE_UINT32: return 4;
  default: return 8;
  }
}

typedef struct {
  char name[512];
  uint64_t dtype;
  uint32_t rank;
  uint64_t dims[MAX_RANK];
  char file[1024];
  long offset;
  size_t nbytes;
  void* data;
} Tensor;

static onnxTensorDescriptorV1 describe(const Tensor* t, const char* name, const uint64_t* shape, void* buffer) {
  return simple(name, t->dtype, t->rank, shape, buffer);
}

/* --- enumeration ------------------------------------------------------------------------------- */

static onnxBackendID ids[16];
static size_t num_ids = 0;
static char names[16][64];

static void enumerate(void) {
  size_t n = 0;
  expect("GetBackendIDs(NULL, &n) counts", F.GetBackendIDs(NULL, &n), ONNXIFI_STATUS_FALLBACK);
  expect_true("at least one backend", n >= 1 && n <= 16);
  num_ids = n;
  expect("GetBackendIDs(ids, &n) fills", F.GetBackendIDs(ids, &num_ids), ONNXIFI_STATUS_SUCCESS);
  for (size_t i = 0; i < num_ids; i++) {
    size_t size = 0;
    expect("GetBackendInfo(NAME, NULL) sizes", F.GetBackendInfo(ids[i], ONNXIFI_BACKEND_NAME, NULL, &size),
           ONNXIFI_STATUS_FALLBACK);
    char* buf = malloc(size);
    expect("GetBackendInfo(NAME, buf) reads", F.GetBackendInfo(ids[i], ONNXIFI_BACKEND_NAME, buf, &size),
           ONNXIFI_STATUS_SUCCESS);
    snprintf(names[i], sizeof names[i], "%s", buf);
    free(buf);
    uint64_t version = 0, device = 0;
    size = sizeof version;
    expect("GetBackendInfo(ONNXIFI_VERSION)", F.GetBackendInfo(ids[i], ONNXIFI_BACKEND_ONNXIFI_VERSION, &version, &size),
           ONNXIFI_STATUS_SUCCESS);
    size = sizeof device;
    expect("GetBackendInfo(DEVICE_TYPE)", F.GetBackendInfo(ids[i], ONNXIFI_BACKEND_DEVICE_TYPE, &device, &size),
           ONNXIFI_STATUS_SUCCESS);
    printf("backend %zu: \"%s\" onnxifi 0x%016llx device type %llu\n", i, names[i], (unsigned long long)version,
           (unsigned long long)device);
  }
}

/* --- the error contract ------------------------------------------------------------------------ */

static void contract(onnxBackendID id, const char* relu_path, const char* add_path) {
  size_t relu_size, add_size;
  void* relu = load_file(relu_path, &relu_size);
  void* add = load_file(add_path, &add_size);
  onnxBackendID bad_id = (onnxBackendID)(uintptr_t)0xdeadbeef0ULL;
  char garbage[64];
  for (int i = 0; i < 64; i++) garbage[i] = (char)(0xA5 ^ (i * 37));

  /* IDs, info, compatibility */
  expect("GetBackendIDs(ids, NULL)", F.GetBackendIDs(ids, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  size_t size = 64;
  char buf[64];
  expect("GetBackendInfo(bad id)", F.GetBackendInfo(bad_id, ONNXIFI_BACKEND_NAME, buf, &size), ONNXIFI_STATUS_INVALID_ID);
  expect("GetBackendInfo(size NULL)", F.GetBackendInfo(id, ONNXIFI_BACKEND_NAME, buf, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  size = 64;
  expect("GetBackendInfo(unknown info type 9)", F.GetBackendInfo(id, 9, buf, &size), ONNXIFI_STATUS_UNSUPPORTED_ATTRIBUTE);
  size = 2;
  expect("GetBackendInfo(buffer too small)", F.GetBackendInfo(id, ONNXIFI_BACKEND_NAME, buf, &size), ONNXIFI_STATUS_FALLBACK);
  expect_true("  ... and the size needed is written", size > 2);
  expect("GetBackendCompatibility(bad id)", F.GetBackendCompatibility(bad_id, relu_size, relu), ONNXIFI_STATUS_INVALID_ID);
  expect("GetBackendCompatibility(NULL model)", F.GetBackendCompatibility(id, relu_size, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  expect("GetBackendCompatibility(size 0)", F.GetBackendCompatibility(id, 0, relu), ONNXIFI_STATUS_INVALID_SIZE);
  expect("GetBackendCompatibility(garbage bytes)", F.GetBackendCompatibility(id, sizeof garbage, garbage),
         ONNXIFI_STATUS_INVALID_PROTOBUF);

  /* backends */
  onnxBackend backend = (onnxBackend)1;
  expect("InitBackend(bad id)", F.InitBackend(bad_id, NULL, &backend), ONNXIFI_STATUS_INVALID_ID);
  expect_true("  ... and *backend is NULL", backend == NULL);
  expect("InitBackend(out NULL)", F.InitBackend(id, NULL, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  uint64_t unknown_prop[] = {99, 1, ONNXIFI_BACKEND_PROPERTY_NONE};
  expect("InitBackend(unknown property)", F.InitBackend(id, unknown_prop, &backend), ONNXIFI_STATUS_UNSUPPORTED_PROPERTY);
  uint64_t bad_level[] = {ONNXIFI_BACKEND_PROPERTY_LOG_LEVEL, 77, ONNXIFI_BACKEND_PROPERTY_NONE};
  expect("InitBackend(bad log level)", F.InitBackend(id, bad_level, &backend), ONNXIFI_STATUS_INVALID_PROPERTY);
  uint64_t props[] = {ONNXIFI_BACKEND_PROPERTY_OPTIMIZATION, ONNXIFI_OPTIMIZATION_LOW_LATENCY,
                      ONNXIFI_BACKEND_PROPERTY_LOG_LEVEL, ONNXIFI_LOG_LEVEL_ERROR, ONNXIFI_BACKEND_PROPERTY_NONE};
  expect("InitBackend(properties)", F.InitBackend(id, props, &backend), ONNXIFI_STATUS_SUCCESS);

  /* events */
  onnxEvent ev = NULL;
  onnxEventState state = 1;
  expect("InitEvent(bad backend)", F.InitEvent((onnxBackend)bad_id, &ev), ONNXIFI_STATUS_INVALID_BACKEND);
  expect("InitEvent(out NULL)", F.InitEvent(backend, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  expect("InitEvent", F.InitEvent(backend, &ev), ONNXIFI_STATUS_SUCCESS);
  expect("GetEventState", F.GetEventState(ev, &state), ONNXIFI_STATUS_SUCCESS);
  expect_true("  ... NONSIGNALLED", state == ONNXIFI_EVENT_STATE_NONSIGNALLED);
  expect("SignalEvent", F.SignalEvent(ev), ONNXIFI_STATUS_SUCCESS);
  expect("SignalEvent twice", F.SignalEvent(ev), ONNXIFI_STATUS_INVALID_STATE);
  expect("WaitEvent(signalled)", F.WaitEvent(ev), ONNXIFI_STATUS_SUCCESS);
  expect("GetEventState(state NULL)", F.GetEventState(ev, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  expect("ReleaseEvent", F.ReleaseEvent(ev), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseEvent twice", F.ReleaseEvent(ev), ONNXIFI_STATUS_INVALID_EVENT);
  state = 1;
  expect("GetEventState(released)", F.GetEventState(ev, &state), ONNXIFI_STATUS_INVALID_EVENT);
  expect_true("  ... and *state is INVALID", state == ONNXIFI_EVENT_STATE_INVALID);
  expect("WaitEvent(released)", F.WaitEvent(ev), ONNXIFI_STATUS_INVALID_EVENT);
  expect("SignalEvent(NULL)", F.SignalEvent(NULL), ONNXIFI_STATUS_INVALID_EVENT);

  /* graphs */
  onnxGraph graph = (onnxGraph)1;
  expect("InitGraph(bad backend)", F.InitGraph((onnxBackend)bad_id, NULL, relu_size, relu, 0, NULL, &graph),
         ONNXIFI_STATUS_INVALID_BACKEND);
  expect_true("  ... and *graph is NULL", graph == NULL);
  expect("InitGraph(NULL model)", F.InitGraph(backend, NULL, relu_size, NULL, 0, NULL, &graph), ONNXIFI_STATUS_INVALID_POINTER);
  expect("InitGraph(graph NULL)", F.InitGraph(backend, NULL, relu_size, relu, 0, NULL, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  expect("InitGraph(weights NULL, count 1)", F.InitGraph(backend, NULL, add_size, add, 1, NULL, &graph),
         ONNXIFI_STATUS_INVALID_POINTER);
  expect("InitGraph(size 0)", F.InitGraph(backend, NULL, 0, relu, 0, NULL, &graph), ONNXIFI_STATUS_INVALID_SIZE);
  expect("InitGraph(garbage bytes)", F.InitGraph(backend, NULL, sizeof garbage, garbage, 0, NULL, &graph),
         ONNXIFI_STATUS_INVALID_PROTOBUF);
  uint64_t graph_prop[] = {5, 5, ONNXIFI_GRAPH_PROPERTY_NONE};
  expect("InitGraph(unknown graph property)", F.InitGraph(backend, graph_prop, relu_size, relu, 0, NULL, &graph),
         ONNXIFI_STATUS_UNSUPPORTED_PROPERTY);

  /* weight descriptors (ADD: y = x + w, w a [2,3] float weight) */
  uint64_t shape23[] = {2, 3}, shape32[] = {3, 2}, shape20[] = {2, 0};
  float w[6] = {1, 2, 3, 4, 5, 6};
  onnxTensorDescriptorV1 wd[2];
  struct { const char* what; onnxStatus want; } cases[] = {
      {"InitGraph(weight: wrong tag)", ONNXIFI_STATUS_UNSUPPORTED_TAG},
      {"InitGraph(weight: unknown name)", ONNXIFI_STATUS_INVALID_NAME},
      {"InitGraph(weight: repeated name)", ONNXIFI_STATUS_INVALID_NAME},
      {"InitGraph(weight: zero dim)", ONNXIFI_STATUS_INVALID_SHAPE},
      {"InitGraph(weight: unknown data type)", ONNXIFI_STATUS_INVALID_DATATYPE},
      {"InitGraph(weight: NULL buffer)", ONNXIFI_STATUS_INVALID_MEMORY_LOCATION},
      {"InitGraph(weight: unknown memory type)", ONNXIFI_STATUS_INVALID_MEMORY_TYPE},
      {"InitGraph(weight: CUDA memory)", ONNXIFI_STATUS_UNSUPPORTED_MEMORY_TYPE},
      {"InitGraph(weight: wrong shape)", ONNXIFI_STATUS_MISMATCHING_SHAPE},
      {"InitGraph(weight: wrong data type)", ONNXIFI_STATUS_MISMATCHING_DATATYPE},
  };
  for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
    uint32_t count = 1;
    wd[0] = simple("w", ONNXIFI_DATATYPE_FLOAT32, 2, shape23, w);
    switch (c) {
    case 0: wd[0].tag = 0x1234; break;
    case 1: wd[0].name = "nope"; break;
    case 2: wd[1] = wd[0]; count = 2; break;
    case 3: wd[0].shape = shape20; break;
    case 4: wd[0].dataType = 99; break;
    case 5: wd[0].buffer = 0; break;
    case 6: wd[0].memoryType = 3; break;
    case 7: wd[0].memoryType = ONNXIFI_MEMORY_TYPE_CUDA_BUFFER; break;
    case 8: wd[0].shape = shape32; wd[0].dimensions = 2; wd[0].shape = shape32; break;
    case 9: wd[0].dataType = ONNXIFI_DATATYPE_INT32; break;
    }
    graph = (onnxGraph)1;
    expect(cases[c].what, F.InitGraph(backend, NULL, add_size, add, count, wd, &graph), cases[c].want);
    if (graph != NULL) { failures++; printf("FAIL    ... *graph not NULL\n"); }
  }

  /* the ADD graph with its weight given, freed right after the call */
  float* wcopy = malloc(sizeof w);
  memcpy(wcopy, w, sizeof w);
  char* wname = strdup("w");
  uint64_t* wshape = malloc(2 * sizeof(uint64_t));
  wshape[0] = 2; wshape[1] = 3;
  wd[0] = simple(wname, ONNXIFI_DATATYPE_FLOAT32, 2, wshape, wcopy);
  onnxGraph add_graph = NULL;
  expect("InitGraph(ADD, weight by descriptor)", F.InitGraph(backend, NULL, add_size, add, 1, wd, &add_graph),
         ONNXIFI_STATUS_SUCCESS);
  memset(wcopy, 0xFF, sizeof w);
  wname[0] = '?';
  free(wcopy); free(wname); free(wshape);

  expect("InitGraph(RELU)", F.InitGraph(backend, NULL, relu_size, relu, 0, NULL, &graph), ONNXIFI_STATUS_SUCCESS);

  /* SetGraphIO */
  float x[6] = {-1, 2, -3, 4, -5, 6}, y[6] = {0};
  int32_t yi[6];
  onnxTensorDescriptorV1 in = simple("x", ONNXIFI_DATATYPE_FLOAT32, 2, shape23, x);
  onnxTensorDescriptorV1 out = simple("y", ONNXIFI_DATATYPE_FLOAT32, 2, shape23, y);
  onnxTensorDescriptorV1 t2[2], bad;
  expect("SetGraphIO(bad graph)", F.SetGraphIO((onnxGraph)bad_id, 1, &in, 1, &out), ONNXIFI_STATUS_INVALID_GRAPH);
  expect("SetGraphIO(outputs NULL)", F.SetGraphIO(graph, 1, &in, 1, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  expect("SetGraphIO(inputs NULL, count 1)", F.SetGraphIO(graph, 1, NULL, 1, &out), ONNXIFI_STATUS_INVALID_POINTER);
  bad = in; bad.tag = 0;
  expect("SetGraphIO(wrong tag)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_UNSUPPORTED_TAG);
  bad = in; bad.name = "z";
  expect("SetGraphIO(unknown name)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_INVALID_NAME);
  t2[0] = in; t2[1] = in;
  expect("SetGraphIO(repeated name)", F.SetGraphIO(graph, 2, t2, 1, &out), ONNXIFI_STATUS_INVALID_NAME);
  bad = in; bad.shape = shape32;
  expect("SetGraphIO(wrong shape)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_MISMATCHING_SHAPE);
  bad = out; bad.dataType = ONNXIFI_DATATYPE_INT32; bad.buffer = (onnxPointer)(uintptr_t)yi;
  expect("SetGraphIO(wrong data type)", F.SetGraphIO(graph, 1, &in, 1, &bad), ONNXIFI_STATUS_MISMATCHING_DATATYPE);
  bad = in; bad.shape = shape20;
  expect("SetGraphIO(zero dim)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_INVALID_SHAPE);
  bad = in; bad.dataType = 9;
  expect("SetGraphIO(BOOL is no ONNXIFI type)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_INVALID_DATATYPE);
  bad = in; bad.buffer = 0;
  expect("SetGraphIO(NULL buffer)", F.SetGraphIO(graph, 1, &bad, 1, &out), ONNXIFI_STATUS_INVALID_MEMORY_LOCATION);
  expect("SetGraphIO(input missing)", F.SetGraphIO(graph, 0, NULL, 1, &out), ONNXIFI_STATUS_UNIDENTIFIED_NAME);
  expect("SetGraphIO(output count 0)", F.SetGraphIO(graph, 1, &in, 0, &out), ONNXIFI_STATUS_UNIDENTIFIED_NAME);

  /* RunGraph after a failed SetGraphIO, then fences */
  onnxEvent in_ev = NULL;
  expect("InitEvent(input)", F.InitEvent(backend, &in_ev), ONNXIFI_STATUS_SUCCESS);
  onnxMemoryFenceV1 fin = fence(in_ev), fout = fence(NULL), fbad;
  expect("RunGraph(binding dropped by the failed SetGraphIO)", F.RunGraph(graph, &fin, &fout), ONNXIFI_STATUS_UNIDENTIFIED_NAME);
  expect("SetGraphIO", F.SetGraphIO(graph, 1, &in, 1, &out), ONNXIFI_STATUS_SUCCESS);
  expect("RunGraph(bad graph)", F.RunGraph((onnxGraph)bad_id, &fin, &fout), ONNXIFI_STATUS_INVALID_GRAPH);
  expect("RunGraph(input fence NULL)", F.RunGraph(graph, NULL, &fout), ONNXIFI_STATUS_INVALID_POINTER);
  expect("RunGraph(output fence NULL)", F.RunGraph(graph, &fin, NULL), ONNXIFI_STATUS_INVALID_POINTER);
  fbad = fin; fbad.tag = 7;
  expect("RunGraph(input fence wrong tag)", F.RunGraph(graph, &fbad, &fout), ONNXIFI_STATUS_UNSUPPORTED_TAG);
  fbad = fout; fbad.tag = 7;
  expect("RunGraph(output fence wrong tag)", F.RunGraph(graph, &fin, &fbad), ONNXIFI_STATUS_UNSUPPORTED_TAG);
  fbad = fin; fbad.type = ONNXIFI_SYNCHRONIZATION_IMPLICIT;
  expect("RunGraph(IMPLICIT fence)", F.RunGraph(graph, &fbad, &fout), ONNXIFI_STATUS_UNSUPPORTED_FENCE_TYPE);
  fbad = fin; fbad.type = 1;
  expect("RunGraph(fence type 1)", F.RunGraph(graph, &fbad, &fout), ONNXIFI_STATUS_INVALID_FENCE_TYPE);
  fbad = fin; fbad.event = NULL;
  expect("RunGraph(NULL input event)", F.RunGraph(graph, &fbad, &fout), ONNXIFI_STATUS_INVALID_EVENT);
  expect("RunGraph", F.RunGraph(graph, &fin, &fout), ONNXIFI_STATUS_SUCCESS);
  expect_true("  ... the backend made the output event", fout.event != NULL);
  expect("SignalEvent(input)", F.SignalEvent(in_ev), ONNXIFI_STATUS_SUCCESS);
  expect("WaitEvent(output)", F.WaitEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
  expect_true("  ... RELU output right", y[0] == 0 && y[1] == 2 && y[4] == 0 && y[5] == 6);
  expect("ReleaseEvent(output)", F.ReleaseEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseEvent(input)", F.ReleaseEvent(in_ev), ONNXIFI_STATUS_SUCCESS);

  /* the extension: onnxSetIOAndRunGraph through onnxGetExtensionFunctionAddress */
  onnxExtensionFunctionPointer fn = (onnxExtensionFunctionPointer)1;
  expect("GetExtensionFunctionAddress(unknown name)", F.GetExtensionFunctionAddress(id, "onnxNope", &fn),
         ONNXIFI_STATUS_UNIDENTIFIED_NAME);
  expect_true("  ... and *function is NULL", fn == NULL);
  expect("GetExtensionFunctionAddress(name NULL)", F.GetExtensionFunctionAddress(id, NULL, &fn), ONNXIFI_STATUS_INVALID_POINTER);
  expect("GetExtensionFunctionAddress(bad id)", F.GetExtensionFunctionAddress(bad_id, "onnxSetIOAndRunGraph", &fn),
         ONNXIFI_STATUS_INVALID_ID);
  expect("GetExtensionFunctionAddress(onnxSetIOAndRunGraph)",
         F.GetExtensionFunctionAddress(id, "onnxSetIOAndRunGraph", &fn), ONNXIFI_STATUS_SUCCESS);
  onnxSetIOAndRunGraphFunction set_and_run = (onnxSetIOAndRunGraphFunction)fn;
  float ya[6] = {0};
  onnxTensorDescriptorV1 outa = simple("y", ONNXIFI_DATATYPE_FLOAT32, 2, shape23, ya);
  onnxMemoryFenceV1 fa = fence(NULL);
  expect("SetIOAndRunGraph(ADD)", set_and_run(add_graph, 1, &in, 1, &outa, &fa), ONNXIFI_STATUS_SUCCESS);
  expect("WaitEvent(ADD output)", F.WaitEvent(fa.event), ONNXIFI_STATUS_SUCCESS);
  expect_true("  ... ADD used the weight copied at InitGraph", ya[0] == 0 && ya[1] == 4 && ya[5] == 12);
  expect("ReleaseEvent(ADD output)", F.ReleaseEvent(fa.event), ONNXIFI_STATUS_SUCCESS);

  /* releases */
  expect("ReleaseGraph", F.ReleaseGraph(graph), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseGraph twice", F.ReleaseGraph(graph), ONNXIFI_STATUS_INVALID_GRAPH);
  expect("SetGraphIO(released graph)", F.SetGraphIO(graph, 1, &in, 1, &out), ONNXIFI_STATUS_INVALID_GRAPH);
  expect("ReleaseGraph(ADD)", F.ReleaseGraph(add_graph), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseBackend", F.ReleaseBackend(backend), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseBackend twice", F.ReleaseBackend(backend), ONNXIFI_STATUS_INVALID_BACKEND);
  expect("ReleaseBackendID(bad id)", F.ReleaseBackendID(bad_id), ONNXIFI_STATUS_INVALID_ID);
  free(relu);
  free(add);
}

/* --- running a model -------------------------------------------------------------------------- */

typedef struct { onnxEvent input, output; onnxStatus signal_status; onnxEventState state_before; } Signaller;

static void* signal_later(void* arg) {
  Signaller* s = arg;
  struct timespec pause = {0, 20 * 1000 * 1000};
  nanosleep(&pause, NULL);
  s->state_before = ONNXIFI_EVENT_STATE_INVALID;
  (void)F.GetEventState(s->output, &s->state_before); /* from a host thread, before the input is ready */
  s->signal_status = F.SignalEvent(s->input);
  return NULL;
}

static void run_model(onnxBackendID id, const char* model_path, Tensor* weights, int nw, Tensor* inputs, int ni,
                      Tensor* outputs, int no, double atol, double rtol, int runs) {
  onnxBackend backend = NULL;
  expect("InitBackend", F.InitBackend(id, NULL, &backend), ONNXIFI_STATUS_SUCCESS);
  size_t model_size;
  void* model = load_file(model_path, &model_size);

  /* weights: host-owned buffers, names and shapes, all freed right after InitGraph */
  onnxTensorDescriptorV1* wd = calloc(nw > 0 ? nw : 1, sizeof *wd);
  size_t total = 0;
  for (int i = 0; i < nw; i++) {
    Tensor* t = &weights[i];
    size_t blob_size;
    static void* blob = NULL;
    static size_t blob_len = 0;
    static char blob_name[1024] = "";
    if (strcmp(blob_name, t->file) != 0) {
      free(blob);
      blob = load_file(t->file, &blob_size);
      blob_len = blob_size;
      snprintf(blob_name, sizeof blob_name, "%s", t->file);
    }
    if ((size_t)t->offset + t->nbytes > blob_len) { fprintf(stderr, "host: weight %s past blob end\n", t->name); exit(2); }
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    memcpy(t->data, (char*)blob + t->offset, t->nbytes);
    uint64_t* shape = malloc(sizeof(uint64_t) * (t->rank ? t->rank : 1));
    memcpy(shape, t->dims, sizeof(uint64_t) * t->rank);
    wd[i] = describe(t, strdup(t->name), shape, t->data);
    total += t->nbytes;
  }
  onnxGraph graph = NULL;
  struct timespec i0, i1;
  clock_gettime(CLOCK_MONOTONIC, &i0);
  onnxStatus st = F.InitGraph(backend, NULL, model_size, model, (uint32_t)nw, nw ? wd : NULL, &graph);
  clock_gettime(CLOCK_MONOTONIC, &i1);
  expect("InitGraph(model, weights as descriptors)", st, ONNXIFI_STATUS_SUCCESS);
  printf("InitGraph: %.1f ms\n", (i1.tv_sec - i0.tv_sec) * 1e3 + (i1.tv_nsec - i0.tv_nsec) / 1e6);
  /* The backend must have copied everything: overwrite, then free, the weights and the model. */
  for (int i = 0; i < nw; i++) {
    memset(weights[i].data, 0xFF, weights[i].nbytes);
    memset((void*)wd[i].name, '?', strlen(wd[i].name));
    memset((void*)wd[i].shape, 0, sizeof(uint64_t) * wd[i].dimensions);
    free(weights[i].data);
    free((void*)wd[i].name);
    free((void*)wd[i].shape);
  }
  free(wd);
  memset(model, 0, model_size);
  free(model);
  printf("weights: %d tensors, %zu bytes, overwritten and freed after InitGraph\n", nw, total);
  if (st != ONNXIFI_STATUS_SUCCESS) return;

  onnxTensorDescriptorV1 ind[MAX_TENSORS], outd[MAX_TENSORS];
  for (int i = 0; i < ni; i++) {
    size_t n;
    inputs[i].data = load_file(inputs[i].file, &n);
    if (n != inputs[i].nbytes) { fprintf(stderr, "host: input %s has %zu bytes\n", inputs[i].name, n); exit(2); }
    ind[i] = describe(&inputs[i], inputs[i].name, inputs[i].dims, inputs[i].data);
  }
  for (int i = 0; i < no; i++) {
    outputs[i].data = calloc(1, outputs[i].nbytes);
    outd[i] = describe(&outputs[i], outputs[i].name, outputs[i].dims, outputs[i].data);
  }
  expect("SetGraphIO", F.SetGraphIO(graph, (uint32_t)ni, ind, (uint32_t)no, outd), ONNXIFI_STATUS_SUCCESS);

  for (int r = 0; r < runs; r++) {
    for (int i = 0; i < no; i++) memset(outputs[i].data, 0, outputs[i].nbytes);
    onnxEvent in_ev = NULL;
    expect("InitEvent(input fence)", F.InitEvent(backend, &in_ev), ONNXIFI_STATUS_SUCCESS);
    onnxMemoryFenceV1 fin = fence(in_ev), fout = fence(NULL);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    expect("RunGraph (returns before the input is signalled)", F.RunGraph(graph, &fin, &fout), ONNXIFI_STATUS_SUCCESS);
    Signaller s = {in_ev, fout.event, -1, 0};
    pthread_t th;
    pthread_create(&th, NULL, signal_later, &s);
    expect("WaitEvent(output fence)", F.WaitEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
    pthread_join(th, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    expect("SignalEvent(input) from a host thread", s.signal_status, ONNXIFI_STATUS_SUCCESS);
    expect_true("  ... output NONSIGNALLED until the input was signalled", s.state_before == ONNXIFI_EVENT_STATE_NONSIGNALLED);
    onnxEventState state = 0;
    expect("GetEventState(output)", F.GetEventState(fout.event, &state), ONNXIFI_STATUS_SUCCESS);
    expect_true("  ... SIGNALLED", state == ONNXIFI_EVENT_STATE_SIGNALLED);
    expect("ReleaseEvent(output)", F.ReleaseEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
    expect("ReleaseEvent(input)", F.ReleaseEvent(in_ev), ONNXIFI_STATUS_SUCCESS);
    printf("run %d: %.1f ms\n", r + 1, (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);

    for (int i = 0; i < no; i++) {
      Tensor* t = &outputs[i];
      if (t->dtype != ONNXIFI_DATATYPE_FLOAT32) continue;
      size_t n;
      float* want = load_file(t->file, &n);
      float* got = t->data;
      size_t count = t->nbytes / 4, bad = 0, argmax_got = 0, argmax_want = 0;
      double max_err = 0;
      for (size_t k = 0; k < count; k++) {
        double err = fabs((double)got[k] - (double)want[k]);
        if (err > max_err || isnan(err)) max_err = isnan(err) ? INFINITY : err;
        if (!(err <= atol + rtol * fabs((double)want[k]))) bad++;
        if (got[k] > got[argmax_got]) argmax_got = k;
        if (want[k] > want[argmax_want]) argmax_want = k;
      }
      char what[256];
      snprintf(what, sizeof what, "output %s matches (%zu values, max abs err %.3g, argmax %zu vs %zu)", t->name, count,
               max_err, argmax_got, argmax_want);
      expect_true(what, n == t->nbytes && bad == 0);
      free(want);
    }
  }
  expect("ReleaseGraph", F.ReleaseGraph(graph), ONNXIFI_STATUS_SUCCESS);
  expect("ReleaseBackend", F.ReleaseBackend(backend), ONNXIFI_STATUS_SUCCESS);
  for (int i = 0; i < ni; i++) free(inputs[i].data);
  for (int i = 0; i < no; i++) free(outputs[i].data);
}

/* --- script ------------------------------------------------------------------------------------ */

static int read_tensor(FILE* f, Tensor* t, int with_offset) {
  unsigned long long dtype;
  if (fscanf(f, "%511s %llu %u", t->name, &dtype, &t->rank) != 3 || t->rank > MAX_RANK) return 0;
  t->dtype = dtype;
  size_t n = 1;
  for (uint32_t i = 0; i < t->rank; i++) {
    unsigned long long d;
    if (fscanf(f, "%llu", &d) != 1) return 0;
    t->dims[i] = d;
    n *= d;
  }
  if (fscanf(f, "%1023s", t->file) != 1) return 0;
  t->offset = 0;
  if (with_offset && fscanf(f, "%ld", &t->offset) != 1) return 0;
  t->nbytes = n * elem_size(t->dtype);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s LIBRARY SCRIPT\n", argv[0]); return 2; }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "host: dlopen: %s\n", dlerror()); return 2; }
  const char* missing = load_onnxifi(lib);
  if (missing) { fprintf(stderr, "host: missing symbol %s\n", missing); return 2; }
  printf("loaded %s (16 symbols)\n", argv[1]);
  enumerate();

  FILE* f = fopen(argv[2], "r");
  if (!f) { fprintf(stderr, "host: cannot open %s\n", argv[2]); return 2; }
  static Tensor weights[MAX_TENSORS], inputs[MAX_TENSORS], outputs[MAX_TENSORS];
  int nw = 0, ni = 0, no = 0;
  char cmd[64], model[1024] = "";
  double atol = 1e-5, rtol = 1e-5;
  onnxBackendID id = num_ids ? ids[0] : NULL;
  while (fscanf(f, "%63s", cmd) == 1) {
    if (!strcmp(cmd, "backend")) {
      char want[64];
      if (fscanf(f, "%63s", want) != 1) return 2;
      id = NULL;
      for (size_t i = 0; i < num_ids; i++)
        if (strstr(names[i], want)) { id = ids[i]; printf("using backend \"%s\"\n", names[i]); break; }
      if (!id) { fprintf(stderr, "host: no backend named like %s\n", want); return 2; }
    } else if (!strcmp(cmd, "compat")) {
      char path[1024];
      unsigned want;
      if (fscanf(f, "%1023s %x", path, &want) != 2) return 2;
      size_t n;
      void* m = load_file(path, &n);
      char what[1200];
      snprintf(what, sizeof what, "GetBackendCompatibility(%s)", strrchr(path, '/') ? strrchr(path, '/') + 1 : path);
      expect(what, F.GetBackendCompatibility(id, n, m), (onnxStatus)want);
      free(m);
    } else if (!strcmp(cmd, "contract")) {
      char relu[1024], add[1024];
      if (fscanf(f, "%1023s %1023s", relu, add) != 2) return 2;
      contract(id, relu, add);
    } else if (!strcmp(cmd, "model")) {
      if (fscanf(f, "%1023s", model) != 1) return 2;
    } else if (!strcmp(cmd, "weight")) {
      if (nw >= MAX_TENSORS || !read_tensor(f, &weights[nw++], 1)) { fprintf(stderr, "host: bad weight line\n"); return 2; }
    } else if (!strcmp(cmd, "input")) {
      if (ni >= MAX_TENSORS || !read_tensor(f, &inputs[ni++], 0)) { fprintf(stderr, "host: bad input line\n"); return 2; }
    } else if (!strcmp(cmd, "output")) {
      if (no >= MAX_TENSORS || !read_tensor(f, &outputs[no++], 0)) { fprintf(stderr, "host: bad output line\n"); return 2; }
    } else if (!strcmp(cmd, "tolerance")) {
      if (fscanf(f, "%lf %lf", &atol, &rtol) != 2) return 2;
    } else if (!strcmp(cmd, "run")) {
      int runs;
      if (fscanf(f, "%d", &runs) != 1) return 2;
      run_model(id, model, weights, nw, inputs, ni, outputs, no, atol, rtol, runs);
      nw = ni = no = 0;
    } else {
      fprintf(stderr, "host: unknown script command %s\n", cmd);
      return 2;
    }
  }
  fclose(f);
  for (size_t i = 0; i < num_ids; i++) expect("ReleaseBackendID", F.ReleaseBackendID(ids[i]), ONNXIFI_STATUS_SUCCESS);
  printf("host: %d checks, %d failed\n", checks, failures);
  return failures ? 1 : 0;
}
