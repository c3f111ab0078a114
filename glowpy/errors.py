"""The one error hierarchy of glowpy.

Every class carries the ONNXIFI status code (onnxifi-spec §3) that the ONNXIFI layer returns for
it, so an error raised deep in the importer or a backend reaches a host as the right status without
a mapping table anywhere else. Messages name the node (name and op type), the opset, and what was
expected against what was found.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class Status(IntEnum):
    """ONNXIFI status codes (final 1.0 header; values from onnxifi-spec §3)."""

    SUCCESS = 0x0000
    FALLBACK = 0x0001
    INVALID_ID = 0x0101
    INVALID_SIZE = 0x0102
    INVALID_POINTER = 0x0103
    INVALID_PROTOBUF = 0x0104
    INVALID_MODEL = 0x0105
    INVALID_BACKEND = 0x0106
    INVALID_GRAPH = 0x0107
    INVALID_EVENT = 0x0108
    INVALID_STATE = 0x0109
    INVALID_NAME = 0x010A
    INVALID_SHAPE = 0x010B
    INVALID_DATATYPE = 0x010C
    INVALID_MEMORY_TYPE = 0x010D
    INVALID_MEMORY_LOCATION = 0x010E
    INVALID_FENCE_TYPE = 0x010F
    INVALID_PROPERTY = 0x0110
    UNSUPPORTED_TAG = 0x0201
    UNSUPPORTED_VERSION = 0x0202
    UNSUPPORTED_OPERATOR = 0x0203
    UNSUPPORTED_ATTRIBUTE = 0x0204
    UNSUPPORTED_SHAPE = 0x0205
    UNSUPPORTED_DATATYPE = 0x0206
    UNSUPPORTED_MEMORY_TYPE = 0x0207
    UNSUPPORTED_FENCE_TYPE = 0x0208
    UNSUPPORTED_PROPERTY = 0x0209
    UNIDENTIFIED_NAME = 0x0301
    MISMATCHING_SHAPE = 0x0302
    MISMATCHING_DATATYPE = 0x0303
    NO_SYSTEM_MEMORY = 0x0401
    NO_DEVICE_MEMORY = 0x0402
    NO_SYSTEM_RESOURCES = 0x0403
    NO_DEVICE_RESOURCES = 0x0404
    BACKEND_UNAVAILABLE = 0x0405
    INTERNAL_ERROR = 0x0406


class GlowpyError(Exception):
    """Base of every glowpy error.

    `node` and `op` name the node the error is about, `opset` the opset it was imported under,
    `expected` / `found` the disagreement. All are optional; the message is composed from them so
    every error reads the same way:  ``node 'conv1' (Conv, opset 9): <what> (expected X, found Y)``.
    """

    status: Status = Status.INTERNAL_ERROR

    def __init__(
        self,
        message: str,
        *,
        node: str | None = None,
        op: str | None = None,
        opset: int | None = None,
        expected: Any = None,
        found: Any = None,
    ) -> None:
        self.reason = message
        self.node = node
        self.op = op
        self.opset = opset
        self.expected = expected
        self.found = found
        super().__init__(self._compose())

    def at(self, *, node: str | None = None, op: str | None = None, opset: int | None = None) -> GlowpyError:
        """Fill in the node context where it is still missing (errors raised below the importer
        know the op but not the node), and recompose the message. Returns self for `raise e.at(...)`."""
        self.node = self.node if self.node is not None else node
        self.op = self.op if self.op is not None else op
        self.opset = self.opset if self.opset is not None else opset
        self.args = (self._compose(),)
        return self

    def _compose(self) -> str:
        # Names come from untrusted protobufs: bytes that are not UTF-8 must not break the message.
        for key in ("node", "op"):
            value = getattr(self, key)
            if isinstance(value, bytes):
                setattr(self, key, value.decode("utf-8", "replace"))
        where = ""
        if self.node is not None or self.op is not None:
            detail = ", ".join(
                x for x in (self.op, f"opset {self.opset}" if self.opset is not None else None) if x
            )
            name = f"node '{self.node}'" if self.node is not None else "node"
            where = f"{name} ({detail}): " if detail else f"{name}: "
        text = where + self.reason
        if self.expected is not None or self.found is not None:
            text += f" (expected {self.expected}, found {self.found})"
        return text


class InvalidProtobuf(GlowpyError):
    """The bytes do not parse as an ONNX ModelProto."""

    status = Status.INVALID_PROTOBUF


class InvalidModel(GlowpyError):
    """The model parsed but breaks ONNX rules (dangling names, cycles, missing weights...)."""

    status = Status.INVALID_MODEL


class UnsupportedVersion(GlowpyError):
    """The IR version or an opset version is not supported."""

    status = Status.UNSUPPORTED_VERSION


class UnsupportedOperator(GlowpyError):
    """An operator (op type or domain) has no glowpy implementation."""

    status = Status.UNSUPPORTED_OPERATOR


class UnsupportedAttribute(GlowpyError):
    """An attribute value is not supported (or is invalid for the op)."""

    status = Status.UNSUPPORTED_ATTRIBUTE


class UnsupportedShape(GlowpyError):
    """A tensor shape (given or inferred) cannot be compiled, e.g. an unbound symbolic dim."""

    status = Status.UNSUPPORTED_SHAPE


class UnsupportedDatatype(GlowpyError):
    """A tensor element type (given or inferred) is not supported."""

    status = Status.UNSUPPORTED_DATATYPE


class InvalidName(GlowpyError):
    """At binding: a name is not a graph input/output, or appears twice."""

    status = Status.INVALID_NAME


class InvalidShape(GlowpyError):
    """At binding: a shape is malformed (a zero dim, a negative or non-integer extent)."""

    status = Status.INVALID_SHAPE


class InvalidDatatype(GlowpyError):
    """At binding: an element type unknown to glowpy."""

    status = Status.INVALID_DATATYPE


class UnidentifiedName(GlowpyError):
    """A graph input or output has no binding."""

    status = Status.UNIDENTIFIED_NAME


class MismatchingShape(GlowpyError):
    """A given shape disagrees with the model (or the model with shape inference)."""

    status = Status.MISMATCHING_SHAPE


class MismatchingDatatype(GlowpyError):
    """A given element type disagrees with the model (or the model with type inference)."""

    status = Status.MISMATCHING_DATATYPE


class InternalError(GlowpyError):
    """A broken invariant inside glowpy (a bug): raised instead of `assert`."""

    status = Status.INTERNAL_ERROR


class MemoryLimitExceeded(GlowpyError):
    """A tensor, folded value, packed weight or arena would need more memory than the budget
    (`glowpy.limits`): refused before anything is allocated."""

    status = Status.NO_SYSTEM_MEMORY


class ConfigurationError(GlowpyError):
    """An environment setting glowpy reads (e.g. GLOWPY_MAX_MEMORY) is malformed."""

    status = Status.INVALID_PROPERTY
