/*
 * onnxifi.h: the ONNXIFI 1.0 interface as glowpy implements it, for C and C++ hosts.
 *
 * Written by the glowpy project from the interface facts of the final ONNXIFI 1.0 header (status
 * codes 0x01xx-0x04xx, tagged V1 structs, onnxGetEventState, auxPropertiesList on onnxInitGraph),
 * not the 2018-07 draft. The two extension functions of onnxifi_ext.h are declared at the end.
 *
 * libonnxifi-glowpy.so exports every function below under its plain name; build it with
 * `glowpy onnxifi build` and find it with `glowpy onnxifi path`.
 */
#ifndef ONNXIFI_H
#define ONNXIFI_H 1

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(_M_IX86)
#define ONNXIFI_ABI __stdcall
#elif defined(__i386__)
#define ONNXIFI_ABI __attribute__((__cdecl__))
#else
#define ONNXIFI_ABI
#endif

#ifndef ONNXIFI_PUBLIC
#if defined(__ELF__) || defined(__MACH__)
#define ONNXIFI_PUBLIC __attribute__((__visibility__("default")))
#else
#define ONNXIFI_PUBLIC
#endif
#endif

#ifndef ONNXIFI_CHECK_RESULT
#if defined(__GNUC__) && __GNUC__ >= 4
#define ONNXIFI_CHECK_RESULT __attribute__((__warn_unused_result__))
#else
#define ONNXIFI_CHECK_RESULT
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque handles and scalar types */
typedef void* onnxBackendID;
typedef void* onnxBackend;
typedef void* onnxGraph;
typedef void* onnxEvent;
typedef int32_t onnxStatus;
typedef uint64_t onnxEnum;
typedef uint64_t onnxBitfield;
typedef uint64_t onnxPointer;
typedef int32_t onnxBackendInfo;
typedef int32_t onnxEventState;

/* Status codes */
#define ONNXIFI_STATUS_SUCCESS                 0x0000
#define ONNXIFI_STATUS_FALLBACK                0x0001
#define ONNXIFI_STATUS_INVALID_ID              0x0101
#define ONNXIFI_STATUS_INVALID_SIZE            0x0102
#define ONNXIFI_STATUS_INVALID_POINTER         0x0103
#define ONNXIFI_STATUS_INVALID_PROTOBUF        0x0104
#define ONNXIFI_STATUS_INVALID_MODEL           0x0105
#define ONNXIFI_STATUS_INVALID_BACKEND         0x0106
#define ONNXIFI_STATUS_INVALID_GRAPH           0x0107
#define ONNXIFI_STATUS_INVALID_EVENT           0x0108
#define ONNXIFI_STATUS_INVALID_STATE           0x0109
#define ONNXIFI_STATUS_INVALID_NAME            0x010A
#define ONNXIFI_STATUS_INVALID_SHAPE           0x010B
#define ONNXIFI_STATUS_INVALID_DATATYPE        0x010C
#define ONNXIFI_STATUS_INVALID_MEMORY_TYPE     0x010D
#define ONNXIFI_STATUS_INVALID_MEMORY_LOCATION 0x010E
#define ONNXIFI_STATUS_INVALID_FENCE_TYPE      0x010F
#define ONNXIFI_STATUS_INVALID_PROPERTY        0x0110
#define ONNXIFI_STATUS_UNSUPPORTED_TAG         0x0201
#define ONNXIFI_STATUS_UNSUPPORTED_VERSION     0x0202
#define ONNXIFI_STATUS_UNSUPPORTED_OPERATOR    0x0203
#define ONNXIFI_STATUS_UNSUPPORTED_ATTRIBUTE   0x0204
#define ONNXIFI_STATUS_UNSUPPORTED_SHAPE       0x0205
#define ONNXIFI_STATUS_UNSUPPORTED_DATATYPE    0x0206
#define ONNXIFI_STATUS_UNSUPPORTED_MEMORY_TYPE 0x0207
#define ONNXIFI_STATUS_UNSUPPORTED_FENCE_TYPE  0x0208
#define ONNXIFI_STATUS_UNSUPPORTED_PROPERTY    0x0209
#define ONNXIFI_STATUS_UNIDENTIFIED_NAME       0x0301
#define ONNXIFI_STATUS_MISMATCHING_SHAPE       0x0302
#define ONNXIFI_STATUS_MISMATCHING_DATATYPE    0x0303
#define ONNXIFI_STATUS_NO_SYSTEM_MEMORY        0x0401
#define ONNXIFI_STATUS_NO_DEVICE_MEMORY        0x0402
#define ONNXIFI_STATUS_NO_SYSTEM_RESOURCES     0x0403
#define ONNXIFI_STATUS_NO_DEVICE_RESOURCES     0x0404
#define ONNXIFI_STATUS_BACKEND_UNAVAILABLE     0x0405
#define ONNXIFI_STATUS_INTERNAL_ERROR          0x0406

/* Event states */
#define ONNXIFI_EVENT_STATE_INVALID      0
#define ONNXIFI_EVENT_STATE_NONSIGNALLED 0x16BD
#define ONNXIFI_EVENT_STATE_SIGNALLED    0x3395

/* Device types (value of ONNXIFI_BACKEND_DEVICE_TYPE) */
#define ONNXIFI_DEVICE_TYPE_NPU           0x01
#define ONNXIFI_DEVICE_TYPE_DSP           0x02
#define ONNXIFI_DEVICE_TYPE_GPU           0x04
#define ONNXIFI_DEVICE_TYPE_CPU           0x08
#define ONNXIFI_DEVICE_TYPE_FPGA          0x10
#define ONNXIFI_DEVICE_TYPE_HETEROGENEOUS 0x20

/* Capabilities (bits of ONNXIFI_BACKEND_CAPABILITIES) */
#define ONNXIFI_CAPABILITY_THREAD_SAFE           0x01
#define ONNXIFI_CAPABILITY_SYMBOLIC_BATCH_SIZE   0x02
#define ONNXIFI_CAPABILITY_SYMBOLIC_SIZE_TENSORS 0x04
#define ONNXIFI_CAPABILITY_VARIABLE_BATCH_SIZE   0x08
#define ONNXIFI_CAPABILITY_VARIABLE_SIZE_OUTPUTS 0x10
#define ONNXIFI_CAPABILITY_HOT_PLUGGABLE         0x20

/* Backend info queries */
#define ONNXIFI_BACKEND_ONNXIFI_VERSION            0
#define ONNXIFI_BACKEND_NAME                       1
#define ONNXIFI_BACKEND_VENDOR                     2
#define ONNXIFI_BACKEND_VERSION                    3
#define ONNXIFI_BACKEND_EXTENSIONS                 4
#define ONNXIFI_BACKEND_DEVICE                     5
#define ONNXIFI_BACKEND_DEVICE_TYPE                6
#define ONNXIFI_BACKEND_ONNX_IR_VERSION            7
#define ONNXIFI_BACKEND_OPSET_VERSION              8
#define ONNXIFI_BACKEND_CAPABILITIES               10
#define ONNXIFI_BACKEND_INIT_PROPERTIES            11
#define ONNXIFI_BACKEND_MEMORY_TYPES               12
#define ONNXIFI_BACKEND_GRAPH_INIT_PROPERTIES      13
#define ONNXIFI_BACKEND_SYNCHRONIZATION_TYPES      14
#define ONNXIFI_BACKEND_MEMORY_SIZE                20
#define ONNXIFI_BACKEND_MAX_GRAPH_SIZE             21
#define ONNXIFI_BACKEND_MAX_GRAPH_COUNT            22
#define ONNXIFI_BACKEND_MACS_FP32                  30
#define ONNXIFI_BACKEND_MACS_FP16                  31
#define ONNXIFI_BACKEND_MEMORY_BANDWIDTH           35
#define ONNXIFI_BACKEND_CPU_MEMORY_READ_BANDWIDTH  36
#define ONNXIFI_BACKEND_CPU_MEMORY_WRITE_BANDWIDTH 37
#define ONNXIFI_BACKEND_PCI_BUS_ID                 40
#define ONNXIFI_BACKEND_PCI_DEVICE_ID              41
#define ONNXIFI_BACKEND_PCI_DOMAIN_ID              42
#define ONNXIFI_BACKEND_DIRECTX_ID                 43
#define ONNXIFI_BACKEND_CUDA_INDEX                 44
#define ONNXIFI_BACKEND_OPENCL_PLATFORM_ID         45
#define ONNXIFI_BACKEND_OPENCL_DEVICE_ID           46

/* Data types (ONNX TensorProto numbering; 8 and 9 are not ONNXIFI types) */
#define ONNXIFI_DATATYPE_UNDEFINED  0
#define ONNXIFI_DATATYPE_FLOAT32    1
#define ONNXIFI_DATATYPE_UINT8      2
#define ONNXIFI_DATATYPE_INT8       3
#define ONNXIFI_DATATYPE_UINT16     4
#define ONNXIFI_DATATYPE_INT16      5
#define ONNXIFI_DATATYPE_INT32      6
#define ONNXIFI_DATATYPE_INT64      7
#define ONNXIFI_DATATYPE_FLOAT16    10
#define ONNXIFI_DATATYPE_FLOAT64    11
#define ONNXIFI_DATATYPE_UINT32     12
#define ONNXIFI_DATATYPE_UINT64     13
#define ONNXIFI_DATATYPE_COMPLEX64  14
#define ONNXIFI_DATATYPE_COMPLEX128 15
#define ONNXIFI_DATATYPE_BFLOAT16   16

/* Memory types */
#define ONNXIFI_MEMORY_TYPE_CPU                 0
#define ONNXIFI_MEMORY_TYPE_CUDA_BUFFER         1
#define ONNXIFI_MEMORY_TYPE_OPENCL_BUFFER       2
#define ONNXIFI_MEMORY_TYPE_OPENGLES_TEXTURE_2D 4
#define ONNXIFI_MEMORY_TYPE_D3D_RESOURCE        8

/* Synchronization (memory fence) types */
#define ONNXIFI_SYNCHRONIZATION_EVENT    0
#define ONNXIFI_SYNCHRONIZATION_IMPLICIT 2

/* Backend and graph initialization properties */
#define ONNXIFI_BACKEND_PROPERTY_NONE         0
#define ONNXIFI_BACKEND_PROPERTY_OPTIMIZATION 1
#define ONNXIFI_BACKEND_PROPERTY_LOG_LEVEL    2
#define ONNXIFI_BACKEND_CUDA_STREAM           4
#define ONNXIFI_BACKEND_OPENCL_CONTEXT        8
#define ONNXIFI_GRAPH_PROPERTY_NONE           0

/* Optimization targets and log levels */
#define ONNXIFI_OPTIMIZATION_HIGH_THROUGHPUT 0
#define ONNXIFI_OPTIMIZATION_LOW_LATENCY     1
#define ONNXIFI_OPTIMIZATION_LOW_POWER       2
#define ONNXIFI_OPTIMIZATION_LOW_DELAY       3
#define ONNXIFI_LOG_LEVEL_DEBUG   1
#define ONNXIFI_LOG_LEVEL_INFO    2
#define ONNXIFI_LOG_LEVEL_WARNING 3
#define ONNXIFI_LOG_LEVEL_ERROR   4

/* Structure tags */
#define ONNXIFI_TAG_TENSOR_DESCRIPTOR_V1 0x43DFBF69
#define ONNXIFI_TAG_MEMORY_FENCE_V1      0x23E08AAB

typedef struct onnxTensorDescriptorV1 {
  int32_t tag;            /* ONNXIFI_TAG_TENSOR_DESCRIPTOR_V1, checked before any other field */
  const char* name;       /* a graph.input or graph.output name */
  onnxEnum dataType;      /* ONNXIFI_DATATYPE_* */
  onnxEnum memoryType;    /* ONNXIFI_MEMORY_TYPE_* */
  uint32_t dimensions;    /* rank; 0 is a scalar */
  const uint64_t* shape;  /* dimensions extents, none of them 0 */
  onnxPointer buffer;     /* dense row-major data */
} onnxTensorDescriptorV1;

typedef struct onnxMemoryFenceV1 {
  int32_t tag;    /* ONNXIFI_TAG_MEMORY_FENCE_V1 */
  onnxEnum type;  /* ONNXIFI_SYNCHRONIZATION_* */
  union {
    onnxEvent event;  /* input fence: made by the caller; output fence: made by onnxRunGraph */
  };
} onnxMemoryFenceV1;

/* Core functions */
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxGetBackendIDs(onnxBackendID* backendIDs, size_t* numBackends);
ONNXIFI_PUBLIC onnxStatus ONNXIFI_ABI
onnxReleaseBackendID(onnxBackendID backendID);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxGetBackendInfo(onnxBackendID backendID, onnxBackendInfo infoType, void* infoValue, size_t* infoValueSize);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxGetBackendCompatibility(onnxBackendID backendID, size_t onnxModelSize, const void* onnxModel);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxInitBackend(onnxBackendID backendID, const uint64_t* auxPropertiesList, onnxBackend* backend);
ONNXIFI_PUBLIC onnxStatus ONNXIFI_ABI
onnxReleaseBackend(onnxBackend backend);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxInitEvent(onnxBackend backend, onnxEvent* event);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxSignalEvent(onnxEvent event);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxGetEventState(onnxEvent event, onnxEventState* state);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxWaitEvent(onnxEvent event);
ONNXIFI_PUBLIC onnxStatus ONNXIFI_ABI
onnxReleaseEvent(onnxEvent event);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxInitGraph(onnxBackend backend, const uint64_t* auxPropertiesList, size_t onnxModelSize, const void* onnxModel,
              uint32_t weightsCount, const onnxTensorDescriptorV1* weightDescriptors, onnxGraph* graph);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxSetGraphIO(onnxGraph graph, uint32_t inputsCount, const onnxTensorDescriptorV1* inputDescriptors,
               uint32_t outputsCount, const onnxTensorDescriptorV1* outputDescriptors);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxRunGraph(onnxGraph graph, const onnxMemoryFenceV1* inputFence, onnxMemoryFenceV1* outputFence);
ONNXIFI_PUBLIC onnxStatus ONNXIFI_ABI
onnxReleaseGraph(onnxGraph graph);

/* Function pointer types, for hosts that dlopen the library */
typedef onnxStatus (ONNXIFI_ABI* onnxGetBackendIDsFunction)(onnxBackendID*, size_t*);
typedef onnxStatus (ONNXIFI_ABI* onnxReleaseBackendIDFunction)(onnxBackendID);
typedef onnxStatus (ONNXIFI_ABI* onnxGetBackendInfoFunction)(onnxBackendID, onnxBackendInfo, void*, size_t*);
typedef onnxStatus (ONNXIFI_ABI* onnxGetBackendCompatibilityFunction)(onnxBackendID, size_t, const void*);
typedef onnxStatus (ONNXIFI_ABI* onnxInitBackendFunction)(onnxBackendID, const uint64_t*, onnxBackend*);
typedef onnxStatus (ONNXIFI_ABI* onnxReleaseBackendFunction)(onnxBackend);
typedef onnxStatus (ONNXIFI_ABI* onnxInitEventFunction)(onnxBackend, onnxEvent*);
typedef onnxStatus (ONNXIFI_ABI* onnxSignalEventFunction)(onnxEvent);
typedef onnxStatus (ONNXIFI_ABI* onnxGetEventStateFunction)(onnxEvent, onnxEventState*);
typedef onnxStatus (ONNXIFI_ABI* onnxWaitEventFunction)(onnxEvent);
typedef onnxStatus (ONNXIFI_ABI* onnxReleaseEventFunction)(onnxEvent);
typedef onnxStatus (ONNXIFI_ABI* onnxInitGraphFunction)(onnxBackend, const uint64_t*, size_t, const void*, uint32_t,
                                                       const onnxTensorDescriptorV1*, onnxGraph*);
typedef onnxStatus (ONNXIFI_ABI* onnxSetGraphIOFunction)(onnxGraph, uint32_t, const onnxTensorDescriptorV1*, uint32_t,
                                                        const onnxTensorDescriptorV1*);
typedef onnxStatus (ONNXIFI_ABI* onnxRunGraphFunction)(onnxGraph, const onnxMemoryFenceV1*, onnxMemoryFenceV1*);
typedef onnxStatus (ONNXIFI_ABI* onnxReleaseGraphFunction)(onnxGraph);

/* Extensions (onnxifi_ext.h); the backend lists "onnx_extension_function" in ONNXIFI_BACKEND_EXTENSIONS */
typedef onnxStatus (ONNXIFI_ABI* onnxExtensionFunctionPointer)(void);

ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxGetExtensionFunctionAddress(onnxBackendID backendID, const char* name, onnxExtensionFunctionPointer* function);
ONNXIFI_PUBLIC ONNXIFI_CHECK_RESULT onnxStatus ONNXIFI_ABI
onnxSetIOAndRunGraph(onnxGraph graph, uint32_t inputsCount, const onnxTensorDescriptorV1* inputDescriptors,
                     uint32_t outputsCount, const onnxTensorDescriptorV1* outputDescriptors,
                     onnxMemoryFenceV1* outputFence);

typedef onnxStatus (ONNXIFI_ABI* onnxGetExtensionFunctionAddressFunction)(onnxBackendID, const char*,
                                                                         onnxExtensionFunctionPointer*);
typedef onnxStatus (ONNXIFI_ABI* onnxSetIOAndRunGraphFunction)(onnxGraph, uint32_t, const onnxTensorDescriptorV1*,
                                                              uint32_t, const onnxTensorDescriptorV1*,
                                                              onnxMemoryFenceV1*);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONNXIFI_H */
