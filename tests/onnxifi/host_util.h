/* Helpers shared by the C hosts in this directory (host.c, soak_host.c). */
#ifndef GLOWPY_TEST_HOST_UTIL_H
#define GLOWPY_TEST_HOST_UTIL_H

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnxifi.h"

/* The ONNXIFI functions, looked up by their plain names (load_onnxifi). */
static struct {
  onnxGetBackendIDsFunction GetBackendIDs;
  onnxReleaseBackendIDFunction ReleaseBackendID;
  onnxGetBackendInfoFunction GetBackendInfo;
  onnxGetBackendCompatibilityFunction GetBackendCompatibility;
  onnxInitBackendFunction InitBackend;
  onnxReleaseBackendFunction ReleaseBackend;
  onnxInitEventFunction InitEvent;
  onnxSignalEventFunction SignalEvent;
  onnxGetEventStateFunction GetEventState;
  onnxWaitEventFunction WaitEvent;
  onnxReleaseEventFunction ReleaseEvent;
  onnxInitGraphFunction InitGraph;
  onnxSetGraphIOFunction SetGraphIO;
  onnxRunGraphFunction RunGraph;
  onnxReleaseGraphFunction ReleaseGraph;
  onnxGetExtensionFunctionAddressFunction GetExtensionFunctionAddress;
} F;

/* Fill F from a dlopen'ed library; the name of a missing symbol, or NULL. */
static const char* load_onnxifi(void* lib) {
  static const char* symbols[] = {"onnxGetBackendIDs", "onnxReleaseBackendID", "onnxGetBackendInfo",
                                  "onnxGetBackendCompatibility", "onnxInitBackend", "onnxReleaseBackend",
                                  "onnxInitEvent", "onnxSignalEvent", "onnxGetEventState", "onnxWaitEvent",
                                  "onnxReleaseEvent", "onnxInitGraph", "onnxSetGraphIO", "onnxRunGraph",
                                  "onnxReleaseGraph", "onnxGetExtensionFunctionAddress"};
  void** slots = (void**)&F;
  for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++) {
    slots[i] = dlsym(lib, symbols[i]);
    if (!slots[i]) return symbols[i];
  }
  return NULL;
}

/* The whole file, malloc'ed; exits 2 if it cannot be read. */
static void* load_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (!f) { fprintf(stderr, "host: cannot open %s\n", path); exit(2); }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  void* data = malloc(n > 0 ? (size_t)n : 1);
  if (n > 0 && fread(data, 1, (size_t)n, f) != (size_t)n) { fprintf(stderr, "host: short read %s\n", path); exit(2); }
  fclose(f);
  *size = (size_t)n;
  return data;
}

/* A CPU tensor descriptor. */
static onnxTensorDescriptorV1 simple(const char* name, uint64_t dtype, uint32_t rank, const uint64_t* shape, void* buf) {
  onnxTensorDescriptorV1 d;
  memset(&d, 0, sizeof d);
  d.tag = ONNXIFI_TAG_TENSOR_DESCRIPTOR_V1;
  d.name = name;
  d.dataType = dtype;
  d.memoryType = ONNXIFI_MEMORY_TYPE_CPU;
  d.dimensions = rank;
  d.shape = shape;
  d.buffer = (onnxPointer)(uintptr_t)buf;
  return d;
}

/* An event fence (event NULL: an output fence the backend fills). */
static onnxMemoryFenceV1 fence(onnxEvent event) {
  onnxMemoryFenceV1 f;
  memset(&f, 0, sizeof f);
  f.tag = ONNXIFI_TAG_MEMORY_FENCE_V1;
  f.type = ONNXIFI_SYNCHRONIZATION_EVENT;
  f.event = event;
  return f;
}

#endif
