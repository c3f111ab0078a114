/*
 * A soak host for the ONNXIFI library: T host threads each run N cycles of
 *   onnxInitGraph -> onnxSetGraphIO -> onnxRunGraph (input fence signalled by a host thread) -> check
 *   the output -> release,
 * in R rounds; between rounds every object is released and the library is closed (dlclose) and opened
 * again (dlopen). Cycles rotate through three ways of finishing a run:
 *   0  this thread signals the input and waits for the output event;
 *   1  another thread waits for the output event (events waited on from other threads);
 *   2  the graph is released while its run is in flight (a helper signals the input 2 ms later;
 *      onnxReleaseGraph must block until the run finishes), then the output event is waited on.
 * Resident memory (/proc/self/statm) is printed every REPORT completed cycles.
 *
 *   soak_host CONFIG
 *
 * CONFIG lines:  library PATH | model PATH | backend SUBSTRING | threads T | cycles N | rounds R |
 *   report K | tolerance ATOL RTOL | input NAME RANK DIMS... FILE | output NAME RANK DIMS... EXPECTED_FILE
 * (one float32 input and one float32 output).
 *
 * Prints "rss round=R cycles=C kib=K" lines, "FAIL ..." for every failed check, and last
 * "soak: C cycles, F failed"; exits 1 if any check failed.
 */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "host_util.h"
#include "onnxifi.h"

#define MAX_RANK 8
#define MAX_THREADS 64

typedef struct {
  char name[256];
  uint32_t rank;
  uint64_t dims[MAX_RANK];
  char file[1024];
  size_t count;
} Tensor;

static char library[1024], model_path[1024], backend_name[64] = "CPU";
static int threads = 2, cycles = 10, rounds = 2, report = 10;
static double abs_tol = 1e-4, rel_tol = 1e-3;
static Tensor in_t, out_t;
static void* model;
static size_t model_size;
static float *input, *expected;
static atomic_long done, failures;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char* what, long status) {
  atomic_fetch_add(&failures, 1);
  pthread_mutex_lock(&print_lock);
  printf("FAIL  %s (status 0x%04lx)\n", what, status);
  fflush(stdout);
  pthread_mutex_unlock(&print_lock);
}

#define CHECK(call, want)                                     \
  do {                                                        \
    onnxStatus s_ = (call);                                   \
    if (s_ != (want)) fail(#call, (long)s_);                  \
  } while (0)

static long rss_kib(void) {
  long pages = 0, resident = 0;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    fclose(f);
  }
  return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static void print_rss(int round) {
  pthread_mutex_lock(&print_lock);
  printf("rss round=%d cycles=%ld kib=%ld\n", round, atomic_load(&done), rss_kib());
  fflush(stdout);
  pthread_mutex_unlock(&print_lock);
}

static onnxTensorDescriptorV1 describe(const Tensor* t, void* buffer) {
  return simple(t->name, ONNXIFI_DATATYPE_FLOAT32, t->rank, t->dims, buffer);
}

typedef struct { onnxEvent event; onnxStatus status; int delay_ms; } EventJob;

static void* wait_job(void* arg) {
  EventJob* j = arg;
  j->status = F.WaitEvent(j->event);
  return NULL;
}

static void* signal_job(void* arg) {
  EventJob* j = arg;
  struct timespec pause = {0, (long)j->delay_ms * 1000 * 1000};
  nanosleep(&pause, NULL);
  j->status = F.SignalEvent(j->event);
  return NULL;
}

typedef struct { int index, round; onnxBackendID id; } Worker;

static void* worker(void* arg) {
  Worker* w = arg;
  onnxBackend backend = NULL;
  onnxStatus st = F.InitBackend(w->id, NULL, &backend);
  if (st != ONNXIFI_STATUS_SUCCESS) { fail("InitBackend", st); return NULL; }
  float* out = malloc(out_t.count * sizeof(float));
  float* in = malloc(in_t.count * sizeof(float));
  memcpy(in, input, in_t.count * sizeof(float));
  for (int c = 0; c < cycles; c++) {
    int mode = (c + w->index) % 3;
    onnxGraph graph = NULL;
    st = F.InitGraph(backend, NULL, model_size, model, 0, NULL, &graph);
    if (st != ONNXIFI_STATUS_SUCCESS) { fail("InitGraph", st); continue; }
    memset(out, 0, out_t.count * sizeof(float));
    onnxTensorDescriptorV1 ind = describe(&in_t, in), outd = describe(&out_t, out);
    CHECK(F.SetGraphIO(graph, 1, &ind, 1, &outd), ONNXIFI_STATUS_SUCCESS);
    onnxEvent in_ev = NULL;
    CHECK(F.InitEvent(backend, &in_ev), ONNXIFI_STATUS_SUCCESS);
    onnxMemoryFenceV1 fin = fence(in_ev), fout = fence(NULL);
    st = F.RunGraph(graph, &fin, &fout);
    if (st != ONNXIFI_STATUS_SUCCESS) {
      fail("RunGraph", st);
      F.ReleaseEvent(in_ev);
      F.ReleaseGraph(graph);
      continue;
    }
    pthread_t helper;
    EventJob job = {mode == 1 ? fout.event : in_ev, ONNXIFI_STATUS_INTERNAL_ERROR, 2};
    int released = 0;
    if (mode == 0) {
      CHECK(F.SignalEvent(in_ev), ONNXIFI_STATUS_SUCCESS);
      CHECK(F.WaitEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
    } else if (mode == 1) {
      pthread_create(&helper, NULL, wait_job, &job);
      CHECK(F.SignalEvent(in_ev), ONNXIFI_STATUS_SUCCESS);
      pthread_join(helper, NULL);
      if (job.status != ONNXIFI_STATUS_SUCCESS) fail("WaitEvent(output) from another thread", job.status);
    } else {
      pthread_create(&helper, NULL, signal_job, &job);
      CHECK(F.ReleaseGraph(graph), ONNXIFI_STATUS_SUCCESS); /* blocks until the run in flight finishes */
      released = 1;
      pthread_join(helper, NULL);
      if (job.status != ONNXIFI_STATUS_SUCCESS) fail("SignalEvent(input) during ReleaseGraph", job.status);
      CHECK(F.WaitEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
    }
    size_t bad = 0;
    for (size_t k = 0; k < out_t.count; k++) {
      double err = fabs((double)out[k] - (double)expected[k]);
      if (!(err <= abs_tol + rel_tol * fabs((double)expected[k]))) bad++;
    }
    if (bad) {
      char what[128];
      snprintf(what, sizeof what, "output mismatch (thread %d, cycle %d, mode %d: %zu values)", w->index, c, mode, bad);
      fail(what, 0);
    }
    CHECK(F.ReleaseEvent(fout.event), ONNXIFI_STATUS_SUCCESS);
    CHECK(F.ReleaseEvent(in_ev), ONNXIFI_STATUS_SUCCESS);
    if (!released) CHECK(F.ReleaseGraph(graph), ONNXIFI_STATUS_SUCCESS);
    long n = atomic_fetch_add(&done, 1) + 1;
    if (report > 0 && n % report == 0) print_rss(w->round);
  }
  CHECK(F.ReleaseBackend(backend), ONNXIFI_STATUS_SUCCESS);
  free(in);
  free(out);
  return NULL;
}

static int read_tensor(FILE* f, Tensor* t) {
  if (fscanf(f, "%255s %u", t->name, &t->rank) != 2 || t->rank > MAX_RANK) return 0;
  t->count = 1;
  for (uint32_t i = 0; i < t->rank; i++) {
    unsigned long long d;
    if (fscanf(f, "%llu", &d) != 1) return 0;
    t->dims[i] = d;
    t->count *= d;
  }
  return fscanf(f, "%1023s", t->file) == 1;
}

static void read_config(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) { fprintf(stderr, "soak: cannot open %s\n", path); exit(2); }
  char key[64];
  int ok = 1;
  while (ok && fscanf(f, "%63s", key) == 1) {
    if (!strcmp(key, "library")) ok = fscanf(f, "%1023s", library) == 1;
    else if (!strcmp(key, "model")) ok = fscanf(f, "%1023s", model_path) == 1;
    else if (!strcmp(key, "backend")) ok = fscanf(f, "%63s", backend_name) == 1;
    else if (!strcmp(key, "threads")) ok = fscanf(f, "%d", &threads) == 1 && threads > 0 && threads <= MAX_THREADS;
    else if (!strcmp(key, "cycles")) ok = fscanf(f, "%d", &cycles) == 1;
    else if (!strcmp(key, "rounds")) ok = fscanf(f, "%d", &rounds) == 1;
    else if (!strcmp(key, "report")) ok = fscanf(f, "%d", &report) == 1;
    else if (!strcmp(key, "tolerance")) ok = fscanf(f, "%lf %lf", &abs_tol, &rel_tol) == 2;
    else if (!strcmp(key, "input")) ok = read_tensor(f, &in_t);
    else if (!strcmp(key, "output")) ok = read_tensor(f, &out_t);
    else ok = 0;
  }
  fclose(f);
  if (!ok || !library[0] || !model_path[0] || !in_t.count || !out_t.count) {
    fprintf(stderr, "soak: bad config line near '%s'\n", key);
    exit(2);
  }
}

static void* open_library(void) {
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "soak: dlopen: %s\n", dlerror()); exit(2); }
  const char* missing = load_onnxifi(lib);
  if (missing) { fprintf(stderr, "soak: missing symbol %s\n", missing); exit(2); }
  return lib;
}

static int still_mapped(void) {
  FILE* f = fopen("/proc/self/maps", "r");
  char line[2048];
  int found = 0;
  while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, library) != NULL;
  if (f) fclose(f);
  return found;
}

static onnxBackendID find_backend(onnxBackendID* ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char name[128];
    size_t size = sizeof name;
    if (F.GetBackendInfo(ids[i], ONNXIFI_BACKEND_NAME, name, &size) == ONNXIFI_STATUS_SUCCESS && strstr(name, backend_name))
      return ids[i];
  }
  fprintf(stderr, "soak: no backend named like %s\n", backend_name);
  exit(2);
}

int main(int argc, char** argv) {
  if (argc != 2) { fprintf(stderr, "usage: %s CONFIG\n", argv[0]); return 2; }
  read_config(argv[1]);
  model = load_file(model_path, &model_size);
  size_t n;
  input = load_file(in_t.file, &n);
  if (n != in_t.count * sizeof(float)) { fprintf(stderr, "soak: input has %zu bytes\n", n); return 2; }
  expected = load_file(out_t.file, &n);
  if (n != out_t.count * sizeof(float)) { fprintf(stderr, "soak: expected output has %zu bytes\n", n); return 2; }
  printf("soak: %d rounds x %d threads x %d cycles, backend %s\n", rounds, threads, cycles, backend_name);
  print_rss(0);
  for (int r = 1; r <= rounds; r++) {
    void* lib = open_library();
    onnxBackendID ids[16];
    size_t count = 16;
    CHECK(F.GetBackendIDs(ids, &count), ONNXIFI_STATUS_SUCCESS);
    onnxBackendID id = find_backend(ids, count);
    pthread_t th[MAX_THREADS];
    Worker ws[MAX_THREADS];
    for (int t = 0; t < threads; t++) {
      ws[t] = (Worker){t, r, id};
      pthread_create(&th[t], NULL, worker, &ws[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(th[t], NULL);
    for (size_t i = 0; i < count; i++) CHECK(F.ReleaseBackendID(ids[i]), ONNXIFI_STATUS_SUCCESS);
    print_rss(r);
    if (dlclose(lib) != 0) fail("dlclose", 0);
    printf("round %d: library closed (%s)\n", r, still_mapped() ? "still mapped: the loader keeps it" : "unmapped");
    fflush(stdout);
  }
  printf("soak: %ld cycles, %ld failed\n", atomic_load(&done), atomic_load(&failures));
  return atomic_load(&failures) ? 1 : 0;
}
