"""Frames on trio streams: writing one, and how much to read at a time (trio).

A frame is written as its parts (:func:`proxy.kafka.frames.frame_parts`):
on a plain TCP stream with one gather write (``sendmsg``), so record data
goes from the buffer it arrived in straight to the socket, never joined into
a new frame first. Small frames, and streams that cannot gather (TLS,
in-memory streams in tests), get the parts joined once; on those, a large
frame is joined and written a step (:data:`MAX_STEP`) at a time.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable

import trio

from proxy.kafka.frames import MAPPED_FROM, FrameReader, frame_parts, small_frame
from proxy.runtime import mapped

# Below this a frame is joined: one copy of a few KiB costs less than a scatter list.
JOIN_BELOW = 16 * 1024
# Reads: 256 KiB (64 KiB where frames are small: a client not logged in yet),
# or the rest of a larger frame at once (up to 1 MiB), so a big Produce or
# Fetch answer arrives in few reads and few chunks to join. With 64 KiB, a
# producer's 0.5-1 MB requests came in two reads joined in a copy (8% of
# kfan's CPU under a producer); with 256 KiB the first read holds a fifth
# of such a frame, and the rest is received into it in place (2%).
READ_CHUNK = 64 * 1024
FIRST_READ = 256 * 1024
MAX_READ = 1024 * 1024
# Frames up to this size are received in place; larger ones (rare: a Fetch
# answer of many MiB) in chunks, so no single allocation outruns the memory
# pool that bounds what clients make kfan buffer.
MAX_IN_PLACE = 8 * 1024 * 1024
# A large frame (received in place, or written from MAPPED_FROM bytes on)
# moves at most this much per read or write, and only BULK_TURNS such steps
# run at once in the process: the event loop turns to every other client
# between them. Without this, 30 Fetch answers of 12 MiB arriving together
# made each turn of the loop copy them all (about 1 ms per MiB here), and a
# small request waited 100-200 ms behind them.
MAX_STEP = 512 * 1024
BULK_TURNS = 2
_SIZE = struct.Struct(">i")
_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def send_small_now(stream: trio.abc.Stream, parts: Iterable[bytes | memoryview]) -> tuple[int, bytes | memoryview] | None:
    """A small frame on a plain socket, written as far as the socket takes it at once: the frame's size and
    what is left to write (empty: all of it went), for :func:`send_rest`. None: not such a frame, nothing
    written (:func:`send_frame` writes it).

    Most small frames go whole this way, without trio's send: that yields to the scheduler after every
    write (a pass of the event loop per frame), and its caller's deadline scope costs as much again.
    A broken socket is None too: :func:`send_frame` then meets the failure where it is waited for.
    """
    if not isinstance(stream, trio.SocketStream):
        return None
    data = small_frame(parts, JOIN_BELOW)
    if data is None:
        return None  # a large frame, framed once, by send_frame
    try:
        return len(data), _write_now(stream, data)
    except trio.BrokenResourceError:
        return None


def _write_now(stream: trio.SocketStream, data: bytes) -> bytes | memoryview:
    """``data`` written as far as the socket takes it without waiting: what is left."""
    try:
        sent = os.write(stream.socket.fileno(), data)
    except BlockingIOError:
        sent = 0
    except OSError as e:
        raise trio.BrokenResourceError(f"socket connection broken: {e}") from e
    return memoryview(data)[sent:] if sent < len(data) else b""


async def send_rest(stream: trio.abc.Stream, total: int, rest: bytes | memoryview) -> int:
    """What :func:`send_small_now` left of a frame of ``total`` bytes, written; ``total``."""
    if rest:
        await stream.send_all(rest)
    return total


async def send_frame(stream: trio.abc.Stream, parts: Iterable[bytes | memoryview]) -> int:
    """Write the frame of ``parts`` (their size prefix added here); the bytes written."""
    framed = frame_parts(parts)
    total = 4 + _SIZE.unpack(framed[0])[0]  # the payload's size, summed once by frame_parts
    if total < JOIN_BELOW and isinstance(stream, trio.SocketStream):
        return await send_rest(stream, total, _write_now(stream, b"".join(framed)))
    if total < JOIN_BELOW or (total < MAPPED_FROM and not isinstance(stream, trio.SocketStream)):
        await stream.send_all(b"".join(framed))
        return total
    views = [memoryview(p).cast("B") for p in framed if len(p)]
    if not isinstance(stream, trio.SocketStream):
        # TLS: a large frame is encrypted and written a step at a time, never joined whole. No
        # turns: the stream cannot say it is writable first, and a client that stops reading
        # would hold its turn.
        first = 0
        while first < len(views):
            step = _step(views, first)
            await stream.send_all(b"".join(step))
            first = _advance(views, first, sum(len(v) for v in step))
        return total
    sock = stream.socket
    first = 0  # views before it are written
    try:
        while first < len(views):
            if total < MAPPED_FROM:
                sent = await sock.sendmsg(views[first : first + _IOV_MAX])
            else:
                # A large frame takes its turns with the other large transfers (see MAX_STEP).
                await trio.lowlevel.wait_writable(sock)
                async with _bulk_turns():
                    sent = await sock.sendmsg(_step(views, first))
            first = _advance(views, first, sent)
    except OSError as e:
        raise trio.BrokenResourceError(f"socket connection broken: {e}") from e
    return total


def _advance(views: list[memoryview], first: int, sent: int) -> int:
    """``sent`` more bytes of ``views`` are written: the first view not written whole (trimmed to its rest)."""
    while sent:
        n = len(views[first])
        if sent >= n:
            sent -= n
            first += 1
        else:
            views[first] = views[first][sent:]
            sent = 0
    return first


def _step(views: list[memoryview], first: int) -> list[memoryview]:
    """The views from ``first`` on, up to :data:`MAX_STEP` bytes in all."""
    out: list[memoryview] = []
    room = MAX_STEP
    for v in views[first : first + _IOV_MAX]:
        if len(v) >= room:
            out.append(v[:room])
            break
        out.append(v)
        room -= len(v)
    return out


_BULK: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar("kfan_bulk_turns")


def _bulk_turns() -> trio.CapacityLimiter:
    """This run's (the process's) turns at moving a large frame's bytes (FIFO: each transfer gets its turn)."""
    try:
        return _BULK.get()
    except LookupError:
        limiter = trio.CapacityLimiter(BULK_TURNS)
        _BULK.set(limiter)
        return limiter


# Reads served from bytes already in the socket do not wait, so they do not yield
# to the scheduler: every YIELD_EVERY-th such read (in the process) yields, so
# that a peer that never stops sending cannot hold the event loop. A client's
# reader and writer yield as often (slots placed and taken in the response order).
YIELD_EVERY = 8
_reads_without_wait = 0


async def _receive_chunk(sock: trio.socket.SocketType, reader: FrameReader) -> int:
    """Read once from a plain socket into ``reader``: the bytes read, 0 at end of stream.

    The read is tried first and waited for only when nothing is there: trio's
    own receive costs a small request 15 us more (its checks, a scheduler pass)."""
    global _reads_without_wait
    size = receive_size(reader)
    waited = False
    while True:
        try:
            data = os.read(sock.fileno(), size)
            break
        except BlockingIOError:
            waited = True
            await trio.lowlevel.wait_readable(sock)
        except OSError as e:
            raise trio.BrokenResourceError(f"socket connection broken: {e}") from e
    reader.feed(data)
    if not waited:
        _reads_without_wait += 1
        if _reads_without_wait >= YIELD_EVERY:
            _reads_without_wait = 0
            await trio.lowlevel.cancel_shielded_checkpoint()  # after the bytes are the reader's: nothing is lost
    return len(data)


def receive_size(reader: FrameReader) -> int:
    """How many bytes to ask the stream for next."""
    least = FIRST_READ if reader.max_frame_bytes >= FIRST_READ else READ_CHUNK
    return max(least, min(reader.wanted(), MAX_READ))


async def receive_into(stream: trio.abc.Stream, reader: FrameReader, max_in_place: int = MAX_IN_PLACE) -> int:
    """Read once from ``stream`` into ``reader``: the bytes read, 0 at end of stream.

    The rest of a large frame on a plain TCP stream is received straight into
    a buffer of the frame's size, so its bytes are copied once, by the kernel;
    on TLS, into that buffer as they are decrypted.
    ``max_in_place``: the largest frame received so (a broker link, whose
    answers no client sizes, may allow more than a client connection).
    """
    buffer = reader.receive_buffer(READ_CHUNK, max_in_place, mapped.take)
    if buffer is None and isinstance(stream, trio.SocketStream):
        return await _receive_chunk(stream.socket, reader)
    if buffer is None or not isinstance(stream, trio.SocketStream):
        # TLS: what it decrypts is copied into the frame's buffer as it comes (never joined whole at the end).
        data = await stream.receive_some(receive_size(reader))
        reader.feed(data)
        return len(data)
    sock = stream.socket
    try:
        # Wait for the bytes first, holding nothing: a sender that stalls mid-frame must not keep others waiting.
        await trio.lowlevel.wait_readable(sock)
        async with _bulk_turns():
            n = await sock.recv_into(buffer[:MAX_STEP])
    except OSError as e:
        raise trio.BrokenResourceError(f"socket connection broken: {e}") from e
    reader.received(n)
    return n
