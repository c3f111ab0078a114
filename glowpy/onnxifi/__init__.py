"""ONNXIFI for glowpy: the interface a host framework loads a backend through.

* `glowpy.onnxifi.api`: the ONNXIFI 1.0 functions in Python (spec names, C argument order, status
  codes, never an exception), over handle registries of backend IDs, backends, graphs and events.
* `glowpy.onnxifi.build`: builds `libonnxifi-glowpy.so`, the C ABI library around that layer (cffi
  embedding); `include/onnxifi.h` is the header for C hosts (`glowpy onnxifi build|path`).
* `glowpy.onnxifi.host`: the host side, a Caffe2-OnnxifiOp-style adapter with a shared graph cache.
"""

from glowpy.onnxifi.api import last_error, live_counts

__all__ = ["last_error", "live_counts"]
