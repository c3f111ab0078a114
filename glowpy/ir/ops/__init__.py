"""IR op declarations. Importing this package registers every op in `OPS`.

Where an op lives: elementwise math in `elementwise` (activations are declared by glowpy/ir/activations.py),
conv / pool / norm / matrix products in `nn`, Resize in `resize`, GridSample in `grid_sample`, recurrent networks in `rnn`, data movement in
`tensor`, reductions in `reduce`, (de)quantization and integer products in `quant`.
"""

from glowpy.ir.activations import ACTIVATIONS
from glowpy.ir.ops import elementwise, grid_sample, nn, quant, reduce, resize, rnn, tensor  # noqa: F401  (registration side effects)
from glowpy.ir.ops.registry import OPS, REQUIRED, OpDef, get_op, op, register

__all__ = ["ACTIVATIONS", "OPS", "REQUIRED", "OpDef", "get_op", "op", "register"]
