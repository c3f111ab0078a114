"""A model file parsed without its big initializer payloads.

Parsing a whole file holds the model twice (the file's bytes and the parsed proto), and the arrays
the import makes would be a third copy while the proto lives. Here the file is scanned field by field
(protobuf wire format, reading only the bytes around each field) and every initializer whose
raw_data is at least `MIN_PAYLOAD` bytes is rewritten as external data pointing back into the same
file (its offset and length), which the ONNX external data rule already gives a meaning: the
importer then reads each payload from the file into its array, one at a time, and nothing else ever
holds it. What is not a plain initializer with one raw_data field (segments, external data already,
typed data fields, groups) is copied unchanged.

Only the importer's private proto is parsed this way: a caller who reads a model to rewrite and save
it (quantize, partition) gets the plain proto from `read_model`.
"""

from __future__ import annotations

import os
from typing import BinaryIO

MIN_PAYLOAD = 4096  # bytes: smaller payloads stay in the proto (shape operands, biases)

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_TENSOR_SEGMENT, _TENSOR_RAW_DATA, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION = 3, 9, 13, 14
_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


class NotWireFormat(ValueError):
    """The bytes do not scan as protobuf fields (the ordinary parse then reports what is wrong)."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | _LEN) + _varint(len(payload)) + payload


class _Scanner:
    """Fields of a message region of the file, read with small positioned reads."""

    def __init__(self, f: BinaryIO) -> None:
        self.fd = f.fileno()

    def read(self, start: int, n: int) -> bytes:
        data = os.pread(self.fd, n, start)
        if len(data) != n:
            raise NotWireFormat("truncated")
        return data

    def varint(self, at: int, end: int) -> tuple[int, int]:
        head = os.pread(self.fd, min(10, end - at), at)
        value = shift = 0
        for i, b in enumerate(head):
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value, at + i + 1
            shift += 7
        raise NotWireFormat("bad varint")

    def fields(self, start: int, end: int):
        """(number, wire type, field start, payload start, field end) of each field in [start, end)."""
        at = start
        while at < end:
            tag, p = self.varint(at, end)
            number, wire = tag >> 3, tag & 7
            if wire == _VARINT:
                _, stop = self.varint(p, end)
            elif wire == _FIXED64:
                stop = p + 8
            elif wire == _FIXED32:
                stop = p + 4
            elif wire == _LEN:
                n, p = self.varint(p, end)
                stop = p + n
            else:
                raise NotWireFormat(f"wire type {wire}")
            if number == 0 or stop > end:
                raise NotWireFormat("bad field")
            yield number, wire, at, p, stop
            at = stop


def _tensor(sc: _Scanner, start: int, end: int, location: str) -> bytes | None:
    """The tensor message with its payload made external, or None to keep it as it is."""
    fields = list(sc.fields(start, end))
    raw = [f for f in fields if f[0] == _TENSOR_RAW_DATA]
    plain = not any(f[0] in (_TENSOR_SEGMENT, _TENSOR_EXTERNAL_DATA, _TENSOR_DATA_LOCATION) for f in fields)
    if not plain or len(raw) != 1 or raw[0][1] != _LEN or raw[0][4] - raw[0][3] < MIN_PAYLOAD:
        return None
    _, _, _, offset, stop = raw[0]
    out = [sc.read(f[2], f[4] - f[2]) for f in fields if f[0] != _TENSOR_RAW_DATA]
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(stop - offset))):
        out.append(_len_field(_TENSOR_EXTERNAL_DATA, _len_field(1, key.encode()) + _len_field(2, value.encode())))
    out.append(_varint(_TENSOR_DATA_LOCATION << 3 | _VARINT) + _varint(_EXTERNAL))
    return b"".join(out)


def _rewrite(sc: _Scanner, start: int, end: int, wanted: int, rewrite) -> bytes | None:
    """The message in [start, end) with each length-delimited field number `wanted` replaced by
    rewrite(payload start, payload end) where that gives bytes; None when nothing was replaced."""
    out, changed = [], False
    for number, wire, at, p, stop in sc.fields(start, end):
        new = rewrite(p, stop) if number == wanted and wire == _LEN else None
        if new is None:
            out.append(sc.read(at, stop - at))
        else:
            out.append(_len_field(number, new))
            changed = True
    return b"".join(out) if changed else None


def _graph(sc: _Scanner, start: int, end: int, location: str) -> bytes | None:
    """The graph message with its big payloads made external, or None when it has none."""
    return _rewrite(sc, start, end, _GRAPH_INITIALIZER, lambda p, stop: _tensor(sc, p, stop, location))


def without_payloads(path: str) -> bytes | None:
    """The serialized model at `path` with its big initializer payloads made external references into
    the same file (named by its base name: the model's directory is the external data directory); None
    when the file holds no such payload. Raises NotWireFormat for bytes that do not scan."""
    location = os.path.basename(path)
    with open(path, "rb") as f:
        sc = _Scanner(f)
        return _rewrite(sc, 0, os.fstat(f.fileno()).st_size, _MODEL_GRAPH,
                        lambda p, stop: _graph(sc, p, stop, location))
