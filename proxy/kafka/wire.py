"""Bounds-checked Kafka wire primitives.

Every length and count read from the wire is checked against the bytes that
remain before anything is allocated; a violation raises :class:`Malformed`.
Readers work on a ``memoryview`` so that byte fields (record batches above
all) come out as zero-copy slices of the frame they arrived in. Writers append
parts to a list; the list is joined exactly once, when the frame is written
(see :func:`proxy.frames.frame`).
"""

from __future__ import annotations

import struct
import uuid

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

Parts = list[bytes | memoryview]
Buffer = bytes | bytearray | memoryview


class Malformed(ValueError):
    """Input that does not follow the Kafka wire format."""


class Reader:
    """A cursor over one frame; every read checks what remains.

    ``cost`` estimates the memory the decoded values take (see
    :meth:`charge`); a reader with ``max_cost`` refuses input whose decoded
    form would outgrow it, so a small frame of many tiny entries cannot cost
    many times its size.
    """

    __slots__ = ("buf", "pos", "end", "cost", "max_cost")

    def __init__(self, buf: Buffer, pos: int = 0, end: int | None = None, max_cost: int | None = None) -> None:
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end
        self.cost = 0
        self.max_cost = max_cost

    def charge(self, n: int) -> None:
        """Count ``n`` more bytes of decoded values; raise past ``max_cost``."""
        self.cost += n
        if self.max_cost is not None and self.cost > self.max_cost:
            raise Malformed(f"decoded form would take over {self.max_cost} bytes")

    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> int:
        p = self.pos
        if n < 0 or p + n > self.end:
            raise Malformed(f"need {n} bytes at offset {p}, {self.end - p} remain")
        self.pos = p + n
        return p

    skip = _take  # move past n bytes, checked (it returns where they started)

    def int8(self) -> int:
        return _I8.unpack_from(self.buf, self._take(1))[0]

    def int16(self) -> int:
        return _I16.unpack_from(self.buf, self._take(2))[0]

    def uint16(self) -> int:
        return _U16.unpack_from(self.buf, self._take(2))[0]

    def int32(self) -> int:
        return _I32.unpack_from(self.buf, self._take(4))[0]

    def uint32(self) -> int:
        return _U32.unpack_from(self.buf, self._take(4))[0]

    def int64(self) -> int:
        return _I64.unpack_from(self.buf, self._take(8))[0]

    def float64(self) -> float:
        return _F64.unpack_from(self.buf, self._take(8))[0]

    def boolean(self) -> bool:
        return self.buf[self._take(1)] != 0

    def uuid(self) -> uuid.UUID:
        p = self._take(16)
        return uuid.UUID(bytes=bytes(self.buf[p : p + 16]))

    def uvarint(self) -> int:
        value = 0
        shift = 0
        while True:
            if self.pos >= self.end:
                raise Malformed("truncated varint")
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise Malformed("varint longer than 10 bytes")

    def empty_tags(self) -> bool:
        """Move past an empty tag section (one 0 byte), the usual case; False, not moved, when there are tags."""
        p = self.pos
        if p < self.end and self.buf[p] == 0:
            self.pos = p + 1
            return True
        return False

    def varint(self) -> int:
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def raw(self, n: int) -> memoryview:
        p = self._take(n)
        return self.buf[p : p + n]

    def _str(self, n: int) -> str:
        try:
            return str(self.raw(n), "utf-8")
        except UnicodeDecodeError as e:
            raise Malformed(f"invalid UTF-8 string: {e}") from None

    # Legacy (non-flexible) encodings use int16/int32 lengths, -1 for null;
    # compact (flexible) ones use uvarint length+1, 0 for null.
    def string(self) -> str | None:
        n = self.int16()
        return None if n < 0 else self._str(n)

    def compact_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._str(n)

    def bytes_(self) -> memoryview | None:
        n = self.int32()
        return None if n < 0 else self.raw(n)

    def compact_bytes(self) -> memoryview | None:
        n = self.uvarint() - 1
        return None if n < 0 else self.raw(n)

    def array_len(self, min_item: int) -> int:
        """Read a legacy array length, rejecting counts the bytes cannot hold."""
        return self._check_count(self.int32(), min_item)

    def compact_array_len(self, min_item: int) -> int:
        return self._check_count(self.uvarint() - 1, min_item)

    def _check_count(self, n: int, min_item: int) -> int:
        if n < 0:
            return -1
        if n * max(min_item, 1) > self.end - self.pos:
            raise Malformed(f"array of {n} items cannot fit in {self.end - self.pos} bytes")
        return n


class Writer:
    """Accumulates encoded parts; large byte fields are appended, not copied."""

    __slots__ = ("parts", "_cur")

    def __init__(self) -> None:
        self.parts: Parts = []
        self._cur = bytearray()

    def _flush(self) -> None:
        if self._cur:
            self.parts.append(bytes(self._cur))
            self._cur = bytearray()

    def finish(self) -> Parts:
        self._flush()
        return self.parts

    def int8(self, v: int) -> None:
        self._cur += _I8.pack(v)

    def int16(self, v: int) -> None:
        self._cur += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self._cur += _U16.pack(v)

    def int32(self, v: int) -> None:
        self._cur += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self._cur += _U32.pack(v)

    def int64(self, v: int) -> None:
        self._cur += _I64.pack(v)

    def float64(self, v: float) -> None:
        self._cur += _F64.pack(v)

    def boolean(self, v: bool) -> None:
        self._cur.append(1 if v else 0)

    def uuid(self, v: uuid.UUID) -> None:
        self._cur += v.bytes

    def uvarint(self, v: int) -> None:
        cur = self._cur
        while v >= 0x80:
            cur.append((v & 0x7F) | 0x80)
            v >>= 7
        cur.append(v)

    def raw(self, data: Buffer) -> None:
        # Large payloads (record batches) become their own part: no copy here.
        if len(memoryview(data)) >= 512:
            self._flush()
            self.parts.append(data if isinstance(data, (bytes, memoryview)) else bytes(data))
        else:
            self._cur += data

    def string(self, v: str | None) -> None:
        if v is None:
            self.int16(-1)
        else:
            b = v.encode()
            self.int16(len(b))
            self._cur += b

    def compact_string(self, v: str | None) -> None:
        if v is None:
            self.uvarint(0)
        else:
            b = v.encode()
            self.uvarint(len(b) + 1)
            self._cur += b

    def bytes_(self, v: Buffer | None) -> None:
        if v is None:
            self.int32(-1)
        else:
            self.int32(len(memoryview(v)))
            self.raw(v)

    def compact_bytes(self, v: Buffer | None) -> None:
        if v is None:
            self.uvarint(0)
        else:
            self.uvarint(len(memoryview(v)) + 1)
            self.raw(v)

    def array_len(self, n: int | None) -> None:
        self.int32(-1 if n is None else n)

    def compact_array_len(self, n: int | None) -> None:
        self.uvarint(0 if n is None else n + 1)
