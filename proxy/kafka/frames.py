"""Kafka framing: ``int32 size`` + payload.

:func:`frame_parts` is the one place in kfan that adds a size prefix;
encoders elsewhere return un-prefixed payload parts, and the trio layer
writes a frame's parts as they are (a gather write) rather than joining
them. :class:`FrameReader` is the sans-IO reader: feed it bytes, take whole
frames out, with sizes checked before anything is buffered beyond the
4-byte prefix.
"""

from __future__ import annotations

import mmap
import struct
from collections import deque
from collections.abc import Callable, Iterable

from .wire import Malformed, Parts

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
MIN_REQUEST_FRAME = 8  # api_key, api_version, correlation_id
MIN_RESPONSE_FRAME = 4  # correlation_id

_SIZE = struct.Struct(">i")
# Frames from this size on are received into mapped memory: see :func:`_frame_buffer`.
MAPPED_FROM = 1024 * 1024


class FrameTooLarge(Malformed):
    """A size prefix over the reader's limit (the frame is not read)."""


def frame_parts(parts: Iterable[bytes | memoryview]) -> Parts:
    """The frame's parts: the payload's size, then the payload's own parts (the single framing point)."""
    payload = list(parts)
    return [_SIZE.pack(sum(len(p) for p in payload)), *payload]


def small_frame(parts: Iterable[bytes | memoryview], below: int) -> bytes | None:
    """The frame joined, when it is smaller than ``below`` bytes (its size prefix included); None for a larger
    one, whose parts are summed only as far as ``below``."""
    payload: Parts = []
    size, limit = 0, below - _SIZE.size
    for part in parts:
        size += len(part)
        if size >= limit:
            return None
        payload.append(part)
    return None if size >= limit else b"".join([_SIZE.pack(size), *payload])


def frame(parts: Iterable[bytes | memoryview]) -> bytes:
    """The frame as one bytes object, for writers that cannot gather (tests, replay, TLS)."""
    return b"".join(frame_parts(parts))


def _frame_buffer(n: int, mapped: Callable[[int], memoryview] | None) -> bytearray | memoryview:
    """A writable buffer of ``n`` bytes for a frame received in place (``mapped``: where a large one's
    mapping comes from, when not a fresh one: :mod:`proxy.runtime.mapped` keeps them for reuse).

    A large one is an anonymous mapping: its pages are faulted in by the reads
    that fill it (spread over them, as the bytes arrive) rather than zeroed all
    at once by ``bytearray`` in one step of the event loop (12 ms for 12 MiB on
    a 2-core VM, with every other client waiting behind it). A fresh one goes
    back to the system as soon as the last view of it is dropped; one from
    ``mapped`` is kept for the next large frame, its pages already in memory
    (counted by that keeper's own bound).
    """
    if n < MAPPED_FROM:
        return bytearray(n)
    return memoryview(mmap.mmap(-1, n)) if mapped is None else mapped(n)


class FrameReader:
    """Turns a byte stream into frames (payloads without their size prefix).

    The bytes fed are kept as they came, not appended to one buffer: a frame
    that lies inside one received chunk is handed out as a slice of it (no
    copy); one that spans chunks is joined once. A large frame can instead be
    received straight into a buffer of its size (:meth:`receive_buffer`).
    """

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, min_frame_bytes: int = MIN_REQUEST_FRAME) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.min_frame_bytes = min_frame_bytes
        self._chunks: deque[memoryview] = deque()
        self._buffered = 0
        self._need: int | None = None
        self._frame: bytearray | memoryview | None = None  # the large frame being received in place
        self._filled = 0
        self._skip = 0  # bytes still to come of a frame dropped unread (:meth:`skip`)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._skip:
            view = memoryview(data)
            n = min(len(view), self._skip)
            self._skip -= n
            data = view[n:]
        if self._frame is not None:
            view = memoryview(data)
            n = min(len(view), len(self._frame) - self._filled)
            self._frame[self._filled : self._filled + n] = view[:n]
            self.received(n)
            data = view[n:]
        if data:
            # A bytearray fed may be reused by its owner: keep a copy of it.
            view = memoryview(bytes(data) if isinstance(data, bytearray) else data)
            self._chunks.append(view)
            self._buffered += len(view)

    def buffered(self) -> int:
        """Bytes held: those received, or the whole buffer of a frame being received in place
        (of a mapped one, only the pages the bytes received so far have taken)."""
        if self._frame is None or isinstance(self._frame, memoryview):
            return self._buffered
        return len(self._frame) + self._buffered - self._filled

    def wanted(self) -> int:
        """Bytes still to come for the frame begun (0 when no frame's size is known yet)."""
        if self._skip:
            return self._skip
        return 0 if self._need is None else max(0, 4 + self._need - self._buffered)

    def frame_head(self, n: int) -> tuple[int, bytes] | None:
        """The size of the frame begun and its first ``n`` bytes, once they are here (None before, or
        once it is received in place): what it is may decide whether it is worth keeping (:meth:`skip`)."""
        if self._need is None or self._frame is not None or self._buffered < 4 + n:
            return None
        return self._need, self._peek(4 + n)[4:]

    def skip(self) -> None:
        """Drop the frame begun unread: its bytes buffered now, and the rest as they come."""
        assert self._need is not None and self._frame is None
        n = min(4 + self._need, self._buffered)
        self._skip = 4 + self._need - n
        self._need = None
        self._buffered -= n
        chunks = self._chunks
        while n:
            first = chunks[0]
            if len(first) > n:
                chunks[0] = first[n:]
                break
            n -= len(first)
            chunks.popleft()

    def peek(self, n: int) -> bytes:
        """The first ``n`` bytes buffered (fewer if fewer are), left buffered."""
        return self._peek(min(n, self._buffered)) if self._buffered and self._frame is None else b""

    def receive_buffer(self, at_least: int, at_most: int, mapped: Callable[[int], memoryview] | None = None) -> memoryview | None:
        """Where to receive the rest of the frame begun, when at least ``at_least`` bytes of it are
        still to come and the frame is at most ``at_most`` bytes (None: feed chunks). The caller
        reports what it wrote with :meth:`received`. ``mapped``: where a large frame's mapping comes from."""
        if self._skip:
            return None
        if self._frame is None:
            # A size prefix alone must not make kfan allocate what the sender
            # may never send: a buffer of memory once a fifth of the frame is
            # here; a mapped one at once, as a fresh one's pages take memory
            # only when bytes are received into them and a kept one's are
            # within its keeper's bound (and the bytes buffered before it,
            # copied in one step, stay few).
            wanted = self.wanted()
            if self._need is None or wanted < at_least or self._need > at_most:
                return None
            if 4 + self._need < MAPPED_FROM and wanted > 4 * self._buffered:
                return None
            self._frame = _frame_buffer(4 + self._need, mapped)
            self._filled = 0
            for chunk in self._chunks:  # everything buffered belongs to this frame
                self._frame[self._filled : self._filled + len(chunk)] = chunk
                self._filled += len(chunk)
            self._chunks.clear()
        return memoryview(self._frame)[self._filled :]

    def received(self, n: int) -> None:
        """``n`` bytes were written into the :meth:`receive_buffer`."""
        self._filled += n
        self._buffered += n

    def next_frame(self) -> bytes | memoryview | None:
        """The next whole frame, or None if more bytes are needed.

        Raises :class:`Malformed` as soon as a size prefix is out of bounds,
        before the body is awaited or allocated.
        """
        if self._need is None:
            if self._buffered < 4:
                return None
            size = _SIZE.unpack(self._peek(4))[0]
            if size > self.max_frame_bytes:
                raise FrameTooLarge(f"frame size {size} outside [{self.min_frame_bytes}, {self.max_frame_bytes}]")
            if size < self.min_frame_bytes:
                raise Malformed(f"frame size {size} outside [{self.min_frame_bytes}, {self.max_frame_bytes}]")
            self._need = size
        need = self._need
        if self._buffered < 4 + need:
            return None
        if self._frame is not None:
            whole, self._frame = self._frame, None
            self._buffered -= 4 + need
            self._need = None
            return memoryview(whole)[4:]
        self._take(4)
        self._need = None
        return self._take(need)

    def pending_partial(self) -> bool:
        """True when a frame has begun but not ended (a truncated body at EOF)."""
        return self._buffered > 0

    def _peek(self, n: int) -> bytes:
        first = self._chunks[0]
        if len(first) >= n:
            return bytes(first[:n])
        return bytes(self._take(n, keep=True))

    def _take(self, n: int, keep: bool = False) -> bytes | memoryview:
        """The next ``n`` buffered bytes (``keep``: leave them buffered)."""
        chunks = self._chunks
        first = chunks[0]
        if len(first) >= n and not keep:
            out = first[:n]
            if len(first) == n:
                chunks.popleft()
            else:
                chunks[0] = first[n:]
            self._buffered -= n
            return out
        pieces: list[memoryview] = []
        got = 0
        for i, chunk in enumerate(chunks):
            piece = chunk[: n - got]
            pieces.append(piece)
            got += len(piece)
            if got == n:
                if not keep:
                    for _ in range(i):
                        chunks.popleft()
                    rest = chunks[0][len(piece) :]
                    if rest:
                        chunks[0] = rest
                    else:
                        chunks.popleft()
                    self._buffered -= n
                break
        return b"".join(pieces)
