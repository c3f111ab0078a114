"""ONNXIFI 1.0 constants and structs (the final header, not the 2018-07 draft).

Values mirror onnxifi-spec §3-§5 name for name; `include/onnxifi.h` carries the same numbers for C
hosts (a test compares the two). Status codes live in `glowpy.errors.Status`.
"""

from __future__ import annotations

import ctypes

import numpy as np

from glowpy.errors import Status

ONNXIFI_VERSION_1_0 = 0x0000000100000000

# §4.1 event states
EVENT_STATE_INVALID = 0
EVENT_STATE_NONSIGNALLED = 0x16BD
EVENT_STATE_SIGNALLED = 0x3395

# §4.2 device types
DEVICE_TYPE_NPU = 0x01
DEVICE_TYPE_DSP = 0x02
DEVICE_TYPE_GPU = 0x04
DEVICE_TYPE_CPU = 0x08
DEVICE_TYPE_FPGA = 0x10
DEVICE_TYPE_HETEROGENEOUS = 0x20

# §4.3 capabilities
CAPABILITY_THREAD_SAFE = 0x01
CAPABILITY_SYMBOLIC_BATCH_SIZE = 0x02
CAPABILITY_SYMBOLIC_SIZE_TENSORS = 0x04
CAPABILITY_VARIABLE_BATCH_SIZE = 0x08
CAPABILITY_VARIABLE_SIZE_OUTPUTS = 0x10
CAPABILITY_HOT_PLUGGABLE = 0x20

# §4.4 backend info selectors
BACKEND_ONNXIFI_VERSION = 0
BACKEND_NAME = 1
BACKEND_VENDOR = 2
BACKEND_VERSION = 3
BACKEND_EXTENSIONS = 4
BACKEND_DEVICE = 5
BACKEND_DEVICE_TYPE = 6
BACKEND_ONNX_IR_VERSION = 7
BACKEND_OPSET_VERSION = 8
BACKEND_CAPABILITIES = 10
BACKEND_INIT_PROPERTIES = 11
BACKEND_MEMORY_TYPES = 12
BACKEND_GRAPH_INIT_PROPERTIES = 13
BACKEND_SYNCHRONIZATION_TYPES = 14
BACKEND_MEMORY_SIZE = 20
BACKEND_MAX_GRAPH_SIZE = 21
BACKEND_MAX_GRAPH_COUNT = 22
BACKEND_MACS_FP32 = 30
BACKEND_MACS_FP16 = 31
BACKEND_MEMORY_BANDWIDTH = 35
BACKEND_CPU_MEMORY_READ_BANDWIDTH = 36
BACKEND_CPU_MEMORY_WRITE_BANDWIDTH = 37
BACKEND_PCI_BUS_ID = 40
BACKEND_PCI_DEVICE_ID = 41
BACKEND_PCI_DOMAIN_ID = 42
BACKEND_DIRECTX_ID = 43
BACKEND_CUDA_INDEX = 44
BACKEND_OPENCL_PLATFORM_ID = 45
BACKEND_OPENCL_DEVICE_ID = 46

# §4.5 data types (ONNX TensorProto numbering; 8 STRING and 9 BOOL are not ONNXIFI types)
DATATYPE_UNDEFINED = 0
DATATYPE_FLOAT32 = 1
DATATYPE_UINT8 = 2
DATATYPE_INT8 = 3
DATATYPE_UINT16 = 4
DATATYPE_INT16 = 5
DATATYPE_INT32 = 6
DATATYPE_INT64 = 7
DATATYPE_FLOAT16 = 10
DATATYPE_FLOAT64 = 11
DATATYPE_UINT32 = 12
DATATYPE_UINT64 = 13
DATATYPE_COMPLEX64 = 14
DATATYPE_COMPLEX128 = 15
DATATYPE_BFLOAT16 = 16

# Types ONNXIFI defines and glowpy computes with; the rest of the known ones are UNSUPPORTED_DATATYPE.
NUMPY_DTYPES: dict[int, np.dtype] = {
    DATATYPE_FLOAT32: np.dtype(np.float32),
    DATATYPE_UINT8: np.dtype(np.uint8),
    DATATYPE_INT8: np.dtype(np.int8),
    DATATYPE_UINT16: np.dtype(np.uint16),
    DATATYPE_INT16: np.dtype(np.int16),
    DATATYPE_INT32: np.dtype(np.int32),
    DATATYPE_INT64: np.dtype(np.int64),
    DATATYPE_FLOAT16: np.dtype(np.float16),
    DATATYPE_FLOAT64: np.dtype(np.float64),
    DATATYPE_UINT32: np.dtype(np.uint32),
    DATATYPE_UINT64: np.dtype(np.uint64),
}
KNOWN_DATATYPES = frozenset(NUMPY_DTYPES) | {DATATYPE_COMPLEX64, DATATYPE_COMPLEX128, DATATYPE_BFLOAT16}
DATATYPE_OF_NUMPY: dict[np.dtype, int] = {dt: code for code, dt in NUMPY_DTYPES.items()}

# §4.6 memory types
MEMORY_TYPE_CPU = 0
MEMORY_TYPE_CUDA_BUFFER = 1
MEMORY_TYPE_OPENCL_BUFFER = 2
MEMORY_TYPE_OPENGLES_TEXTURE_2D = 4
MEMORY_TYPE_D3D_RESOURCE = 8
KNOWN_MEMORY_TYPES = frozenset({MEMORY_TYPE_CPU, MEMORY_TYPE_CUDA_BUFFER, MEMORY_TYPE_OPENCL_BUFFER,
                                MEMORY_TYPE_OPENGLES_TEXTURE_2D, MEMORY_TYPE_D3D_RESOURCE})

# §4.7 synchronization (fence) types
SYNCHRONIZATION_EVENT = 0
SYNCHRONIZATION_IMPLICIT = 2
KNOWN_FENCE_TYPES = frozenset({SYNCHRONIZATION_EVENT, SYNCHRONIZATION_IMPLICIT})

# §4.8 backend init properties, §4.9 graph init properties
BACKEND_PROPERTY_NONE = 0
BACKEND_PROPERTY_OPTIMIZATION = 1
BACKEND_PROPERTY_LOG_LEVEL = 2
BACKEND_CUDA_STREAM = 4
BACKEND_OPENCL_CONTEXT = 8
GRAPH_PROPERTY_NONE = 0

# §4.10 optimization targets, §4.11 log levels
OPTIMIZATION_HIGH_THROUGHPUT = 0
OPTIMIZATION_LOW_LATENCY = 1
OPTIMIZATION_LOW_POWER = 2
OPTIMIZATION_LOW_DELAY = 3
LOG_LEVEL_DEBUG = 1
LOG_LEVEL_INFO = 2
LOG_LEVEL_WARNING = 3
LOG_LEVEL_ERROR = 4

# §4.12 struct tags
TAG_TENSOR_DESCRIPTOR_V1 = 0x43DFBF69
TAG_MEMORY_FENCE_V1 = 0x23E08AAB


class onnxTensorDescriptorV1(ctypes.Structure):  # noqa: N801  (the C name)
    """§5.1: 56 bytes, tag first."""

    _fields_ = [("tag", ctypes.c_int32), ("name", ctypes.c_char_p),
                ("dataType", ctypes.c_uint64), ("memoryType", ctypes.c_uint64),
                ("dimensions", ctypes.c_uint32), ("shape", ctypes.POINTER(ctypes.c_uint64)),
                ("buffer", ctypes.c_uint64)]


class onnxMemoryFenceV1(ctypes.Structure):  # noqa: N801
    """§5.2: 24 bytes; the one-member union is the `event` field at offset 16."""

    _fields_ = [("tag", ctypes.c_int32), ("type", ctypes.c_uint64), ("event", ctypes.c_void_p)]


DESCRIPTOR_SIZE = ctypes.sizeof(onnxTensorDescriptorV1)
FENCE_SIZE = ctypes.sizeof(onnxMemoryFenceV1)

# The spec's function names, in the loader's order (§5.3), then the two extension functions.
CORE_FUNCTIONS = (
    "onnxGetBackendIDs", "onnxReleaseBackendID", "onnxGetBackendInfo", "onnxGetBackendCompatibility",
    "onnxInitBackend", "onnxReleaseBackend", "onnxInitEvent", "onnxSignalEvent", "onnxGetEventState",
    "onnxWaitEvent", "onnxReleaseEvent", "onnxInitGraph", "onnxSetGraphIO", "onnxRunGraph", "onnxReleaseGraph",
)
EXTENSION_FUNCTIONS = ("onnxGetExtensionFunctionAddress", "onnxSetIOAndRunGraph")
ALL_FUNCTIONS = CORE_FUNCTIONS + EXTENSION_FUNCTIONS

# ctypes signatures (§6.1), restype c_int32 throughout: used for the built library and the adapter.
_TD = ctypes.POINTER(onnxTensorDescriptorV1)
_FENCE = ctypes.POINTER(onnxMemoryFenceV1)
ARGTYPES: dict[str, list] = {
    "onnxGetBackendIDs": [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)],
    "onnxReleaseBackendID": [ctypes.c_void_p],
    "onnxGetBackendInfo": [ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)],
    "onnxGetBackendCompatibility": [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p],
    "onnxInitBackend": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_void_p)],
    "onnxReleaseBackend": [ctypes.c_void_p],
    "onnxInitEvent": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)],
    "onnxSignalEvent": [ctypes.c_void_p],
    "onnxGetEventState": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32)],
    "onnxWaitEvent": [ctypes.c_void_p],
    "onnxReleaseEvent": [ctypes.c_void_p],
    "onnxInitGraph": [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p,
                      ctypes.c_uint32, _TD, ctypes.POINTER(ctypes.c_void_p)],
    "onnxSetGraphIO": [ctypes.c_void_p, ctypes.c_uint32, _TD, ctypes.c_uint32, _TD],
    "onnxRunGraph": [ctypes.c_void_p, _FENCE, _FENCE],
    "onnxReleaseGraph": [ctypes.c_void_p],
    "onnxGetExtensionFunctionAddress": [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)],
    "onnxSetIOAndRunGraph": [ctypes.c_void_p, ctypes.c_uint32, _TD, ctypes.c_uint32, _TD, _FENCE],
}

__all__ = [name for name in dir() if name.isupper() or name.startswith("onnx")] + ["Status"]
