"""Per-op tests: one-node ONNX models, glowpy against onnx.reference.ReferenceEvaluator."""
