"""ONNX → IR. `import_model` is the full importer; `table` is the op table it shares with the
cheap compatibility path."""

from glowpy.importer.onnx_import import DeferredModel, ModelLike, ShapeMap, import_model, read_model
from glowpy.importer.table import TABLE, check_node

__all__ = ["TABLE", "DeferredModel", "ModelLike", "ShapeMap", "check_node", "import_model", "read_model"]
