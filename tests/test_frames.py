"""Framing: the reader's chunked and in-place receiving, and the gather write of a frame's parts."""

from __future__ import annotations

import socket
import struct

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.kafka.frames import MAPPED_FROM, FrameReader, frame, frame_parts, small_frame
from proxy.kafka.wire import Malformed
from proxy.runtime import frame_io
from proxy.runtime.frame_io import JOIN_BELOW, receive_into, send_frame, send_small_now


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(st.binary(min_size=1, max_size=5000), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 7000), min_size=1, max_size=50),
    in_place=st.lists(st.booleans(), min_size=1, max_size=50),
)
def test_frames_come_out_whole_and_in_order_however_the_bytes_arrive(frames: list[bytes], cuts: list[int], in_place: list[bool]) -> None:
    stream = b"".join(frame([f]) for f in frames)
    reader = FrameReader(min_frame_bytes=1)
    out: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        n = min(cuts[i % len(cuts)], len(stream) - pos)
        buffer = reader.receive_buffer(1, 1 << 20) if in_place[i % len(in_place)] else None
        if buffer is not None:
            n = min(n, len(buffer))
            buffer[:n] = stream[pos : pos + n]
            reader.received(n)
        else:
            reader.feed(stream[pos : pos + n])
        pos += n
        i += 1
        while (payload := reader.next_frame()) is not None:
            out.append(bytes(payload))
    assert out == frames
    assert reader.buffered() == 0 and not reader.pending_partial()


def test_a_frame_inside_one_chunk_is_a_slice_of_it_not_a_copy() -> None:
    chunk = frame([b"a" * 100]) + frame([b"b" * 50])
    reader = FrameReader(min_frame_bytes=1)
    reader.feed(chunk)
    first, second = reader.next_frame(), reader.next_frame()
    assert isinstance(first, memoryview) and first.obj is chunk
    assert bytes(first) == b"a" * 100 and bytes(second) == b"b" * 50


def test_a_size_prefix_alone_allocates_nothing_in_place() -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", MAPPED_FROM - 100) + b"\0" * 1000)
    assert reader.next_frame() is None
    assert reader.receive_buffer(1, 1 << 30) is None, "a fifth of the frame must be here first"
    assert reader.buffered() == 1004


def test_a_large_frame_is_received_into_mapped_memory_counted_as_it_arrives() -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", 50_000_000) + b"a" * 1000)
    assert reader.next_frame() is None
    buffer = reader.receive_buffer(1, 1 << 30)
    assert buffer is not None and len(buffer) == 50_000_004 - 1004, "mapped at once: untouched pages take no memory"
    assert reader.buffered() == 1004, "only what arrived is held"
    buffer[:2000] = b"b" * 2000
    reader.received(2000)
    assert reader.buffered() == 3004 and reader.next_frame() is None
    rest = reader.receive_buffer(1, 1 << 30)
    assert rest is not None and len(rest) == 50_000_004 - 3004
    rest[:] = b"c" * len(rest)
    reader.received(len(rest))
    payload = reader.next_frame()
    assert payload is not None and len(payload) == 50_000_000
    assert bytes(payload[:1000]) == b"a" * 1000 and bytes(payload[1000:3000]) == b"b" * 2000 and payload[-1] == ord("c")
    assert reader.buffered() == 0


def test_a_frame_received_in_place_counts_its_whole_buffer_as_held() -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", 1000) + b"x" * 400)
    assert reader.next_frame() is None  # its size is read
    assert reader.receive_buffer(1, 999) is None, "larger than the in-place cap"
    buffer = reader.receive_buffer(1, 1 << 20)
    assert buffer is not None and len(buffer) == 600
    assert reader.buffered() == 1004, "the allocation is what the memory pool must see"
    buffer[:600] = b"y" * 600
    reader.received(600)
    payload = reader.next_frame()
    assert payload is not None and bytes(payload) == b"x" * 400 + b"y" * 600 and reader.buffered() == 0


def test_an_oversized_prefix_is_refused_before_any_body() -> None:
    reader = FrameReader(max_frame_bytes=1000)
    reader.feed(struct.pack(">i", 1001))
    with pytest.raises(Malformed):
        reader.next_frame()


def test_exactly_one_size_prefix_whatever_the_parts() -> None:
    parts = [b"ab", memoryview(b"cde"), b""]
    assert frame_parts(parts) == [struct.pack(">i", 5), *parts]
    assert frame(parts) == struct.pack(">i", 5) + b"abcde"


@given(st.lists(st.binary(max_size=300), max_size=12), st.integers(min_value=4, max_value=2000))
def test_a_small_frame_is_the_frame_joined_and_a_larger_one_is_none(payload: list[bytes], below: int) -> None:
    parts = [memoryview(p) if i % 2 else p for i, p in enumerate(payload)]
    whole = frame(parts)
    assert small_frame(parts, below) == (whole if len(whole) < below else None)


@pytest.mark.parametrize("sizes", [[10, 20], [JOIN_BELOW, 3, 2_000_000, 1, 70_000] + [7] * 1500])
async def test_a_frame_written_as_parts_reads_back_whole_over_tcp(sizes: list[int]) -> None:
    """Small frames are joined; large ones go out as one gather write, more parts than one sendmsg takes."""
    parts = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def read_one() -> None:
            server = await listener.accept()
            reader = FrameReader(min_frame_bytes=1)
            while (payload := reader.next_frame()) is None:
                assert await receive_into(server, reader), "closed before the frame was whole"
            got.append(bytes(payload))
            await server.aclose()

        nursery.start_soon(read_one)
        client = await trio.open_tcp_stream("127.0.0.1", port)
        assert await send_frame(client, parts) == 4 + sum(sizes)
    await client.aclose()
    await listener.aclose()
    assert got == [b"".join(parts)]


async def test_only_a_frame_under_join_below_is_written_at_once_and_then_whole() -> None:
    """send_small_now writes a frame of fewer than JOIN_BELOW bytes (its size prefix included) whole, and leaves a
    frame of JOIN_BELOW or more unwritten, for send_frame: nothing of it reaches the socket."""
    a, b = socket.socketpair()  # b: the peer, read without trio
    stream = trio.SocketStream(trio.socket.from_stdlib_socket(a))
    below = [b"x" * 100, b"y" * (JOIN_BELOW - 4 - 101)]
    assert send_small_now(stream, below) == (JOIN_BELOW - 1, b"")
    assert b.recv(JOIN_BELOW) == frame(below)
    assert send_small_now(stream, [b"x" * 100, b"y" * (JOIN_BELOW - 4 - 100)]) is None
    assert send_small_now(stream, [b"z" * JOIN_BELOW, *[b"w"] * 10_000]) is None
    with pytest.raises(BlockingIOError):
        b.recv(1, socket.MSG_DONTWAIT)
    await stream.aclose()
    b.close()


async def test_reads_that_find_bytes_waiting_still_let_other_tasks_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read served from bytes already in the socket does not wait; every YIELD_EVERY-th one yields anyway,
    so a peer that never stops sending cannot hold the event loop (and its bytes reach the reader first)."""
    monkeypatch.setattr(frame_io, "YIELD_EVERY", 1)
    a, b = trio.socket.socketpair()
    server = trio.SocketStream(a)
    sent = b"".join(frame([bytes([i % 256]) * 96]) for i in range(1200))  # 120,000 bytes: two reads' worth
    assert await b.send(sent) == len(sent)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tick)
        await trio.sleep(0.01)
        reader, got, reads, before = FrameReader(max_frame_bytes=1000), 0, 0, ticks
        while got < len(sent):
            n = await receive_into(server, reader)
            assert n > 0
            got, reads = got + n, reads + 1
        # (trio runs the ready tasks in a random order: the other task has run by the read after the one that yielded)
        assert reads >= 2 and ticks - before >= reads - 1, "reads that found their bytes waiting did not yield"
        nursery.cancel_scope.cancel()
    frames = []
    while (payload := reader.next_frame()) is not None:
        frames.append(bytes(payload))
    assert frames == [bytes([i % 256]) * 96 for i in range(1200)]
    a.close()
    b.close()
