"""glowpy's node-level IR: typed values with static shapes, nodes, graphs, op declarations."""

from glowpy.ir.dot import to_dot
from glowpy.ir.graph import Graph, Node, Value
from glowpy.ir.ops import OPS, OpDef, get_op
from glowpy.ir.types import TensorType

__all__ = ["OPS", "Graph", "Node", "OpDef", "TensorType", "Value", "get_op", "to_dot"]
