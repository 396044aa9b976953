"""Kafka framing: ``int32 size`` + payload.

:func:`frame` is the one place in kfan that adds a size prefix; encoders
elsewhere return un-prefixed payload parts. :class:`FrameReader` is the
sans-IO reader: feed it bytes, take whole frames out, with sizes checked
before anything is buffered beyond the 4-byte prefix.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from .wire import Malformed

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
MIN_REQUEST_FRAME = 8  # api_key, api_version, correlation_id
MIN_RESPONSE_FRAME = 4  # correlation_id

_SIZE = struct.Struct(">i")


def frame(parts: Iterable[bytes | memoryview]) -> bytes:
    """Prefix the payload with its size: the single framing point."""
    payload = b"".join(parts)
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Turns a byte stream into frames (payloads without their size prefix)."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, min_frame_bytes: int = MIN_REQUEST_FRAME) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.min_frame_bytes = min_frame_bytes
        self._buf = bytearray()
        self._need: int | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self._buf += data

    def buffered(self) -> int:
        return len(self._buf)

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None if more bytes are needed.

        Raises :class:`Malformed` as soon as a size prefix is out of bounds,
        before the body is awaited or allocated.
        """
        buf = self._buf
        if self._need is None:
            if len(buf) < 4:
                return None
            size = _SIZE.unpack_from(buf, 0)[0]
            if size < self.min_frame_bytes or size > self.max_frame_bytes:
                raise Malformed(f"frame size {size} outside [{self.min_frame_bytes}, {self.max_frame_bytes}]")
            self._need = size
        need = self._need
        if len(buf) < 4 + need:
            return None
        out = bytes(buf[4 : 4 + need])
        del buf[: 4 + need]
        self._need = None
        return out

    def pending_partial(self) -> bool:
        """True when a frame has begun but not ended (a truncated body at EOF)."""
        return bool(self._buf)
