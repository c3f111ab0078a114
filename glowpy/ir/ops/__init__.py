"""IR op declarations. Importing this package registers every op in `OPS`.

Where an op lives: elementwise math in `elementwise` (activations are declared by glowpy/ir/activations.py),
conv / pool / norm / matrix products in `nn`, Resize in `resize`, recurrent networks in `rnn`, data movement
in `tensor`, reductions in `reduce`, gathers / scatters / scans / selections by index in `indexing`,
(de)quantization and integer products in `quant`, If / Loop / Scan (bodies as Graph attributes) in `control`.
"""

from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.ops import control, elementwise, indexing, nn, quant, reduce, resize, rnn, tensor  # noqa: F401  (registration side effects)
from glowpy.ir.ops.registry import OPS, REQUIRED, OpDef, get_op, op, register

__all__ = ["ACTIVATIONS", "OPS", "REQUIRED", "OpDef", "get_op", "op", "register"]
