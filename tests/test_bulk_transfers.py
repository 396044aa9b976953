"""Large frames share the event loop: bounded steps, a few at a time, none held by a sender that stalls; and
the buffers they leave behind are freed off the loop.

The figures (a bystander's latency beside 30 answers of 12 MiB) come from
``python -m tests.attacks``; these tests pin the mechanisms behind them.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time

import trio
import trio.testing

from backends.link import Pending
from proxy.kafka.frames import MAPPED_FROM, FrameReader
from proxy.runtime import frame_io
from proxy.runtime.frame_io import BULK_TURNS, MAX_STEP, receive_into, send_frame
from proxy.runtime.reclaim import release_later
from tests.support.waiting import wait_for, wait_for_async

FRAME = 3 * 1024 * 1024


async def _tcp_pairs(n: int) -> tuple[list[trio.SocketStream], list[trio.SocketStream], trio.SocketListener]:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    clients, servers = [], []
    for _ in range(n):
        clients.append(await trio.open_tcp_stream("127.0.0.1", port))
        servers.append(await listener.accept())
    return clients, servers, listener


class _Watched(FrameReader):
    """Records the size of every read into the frame's buffer."""

    def __init__(self, steps: list[int]) -> None:
        super().__init__(min_frame_bytes=1)
        self._steps = steps

    def received(self, n: int) -> None:
        self._steps.append(n)
        super().received(n)


async def test_large_frames_arrive_in_bounded_steps_a_few_at_a_time() -> None:
    clients, servers, listener = await _tcp_pairs(6)
    steps: list[int] = []
    most = [0]
    got: list[int] = []

    async def watch(done: trio.Event) -> None:
        # Turns are held across the read's own checkpoint: a watcher sees how many run at once.
        while not done.is_set():
            most[0] = max(most[0], frame_io._bulk_turns().borrowed_tokens)
            await trio.lowlevel.checkpoint()

    async def read(stream: trio.SocketStream) -> None:
        reader = _Watched(steps)
        while (payload := reader.next_frame()) is None:
            assert await receive_into(stream, reader, 1 << 30), "closed before the frame was whole"
        got.append(len(payload))

    done = trio.Event()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, done)
            async with trio.open_nursery() as readers:
                for s in servers:
                    readers.start_soon(read, s)
                for c in clients:
                    readers.start_soon(send_frame, c, [b"x" * FRAME])
            done.set()
    for s in [*clients, *servers, listener]:
        await s.aclose()
    assert got == [FRAME] * 6
    assert steps and max(steps) <= MAX_STEP, "a read into a large frame's buffer moves at most MAX_STEP bytes"
    assert most[0] == BULK_TURNS, f"at most {BULK_TURNS} large transfers at once (saw {most[0]})"


async def test_a_sender_that_stalls_mid_frame_holds_no_turn() -> None:
    """Senders stalled halfway through large frames, more of them than there are turns: another frame still arrives."""
    clients, servers, listener = await _tcp_pairs(BULK_TURNS + 2)
    *stalled, live = clients
    half = struct.pack(">i", FRAME) + b"s" * (FRAME // 2)
    got: list[int] = []

    async def read(stream: trio.SocketStream, keep: bool) -> None:
        reader = FrameReader(min_frame_bytes=1)
        while (payload := reader.next_frame()) is None:
            if not await receive_into(stream, reader, 1 << 30):
                return
        if keep:
            got.append(len(payload))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for s in servers[:-1]:
                nursery.start_soon(read, s, False)
            for c in stalled:
                await c.send_all(half)
            await trio.sleep(0.2)  # the stalled frames' readers have taken what came and wait for more
            nursery.start_soon(read, servers[-1], True)
            await send_frame(live, [b"y" * FRAME])
            while not got:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    for s in [*clients, *servers, listener]:
        await s.aclose()
    assert got == [FRAME]


class _Writes(trio.abc.SendStream):
    """A stream that cannot gather (as TLS): records each write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_large_frame_goes_out_on_tls_a_step_at_a_time_never_joined_whole() -> None:
    stream = _Writes()
    parts = [b"a" * 700_000, b"b" * 10, b"c" * 2_000_000]
    assert await send_frame(stream, parts) == 4 + 2_700_010  # type: ignore[arg-type]
    assert b"".join(stream.writes) == struct.pack(">i", 2_700_010) + b"".join(parts)
    assert max(len(w) for w in stream.writes) <= MAX_STEP and len(stream.writes) == -(-(2_700_014) // MAX_STEP)


async def test_a_large_frame_from_tls_is_gathered_as_it_comes_into_one_buffer() -> None:
    """What a stream that cannot receive in place hands over is copied into the frame's buffer as it comes."""
    send, receive = trio.testing.memory_stream_pair()
    body = bytes(range(256)) * (3 * 4096)  # 3 MiB
    reader = FrameReader(min_frame_bytes=1)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send.send_all, struct.pack(">i", len(body)) + body)
        reads = 0
        while (payload := reader.next_frame()) is None:
            assert await receive_into(receive, reader, 1 << 30)
            reads += 1
    assert isinstance(payload, memoryview) and bytes(payload) == body
    assert isinstance(payload.obj, mmap.mmap), "received into one mapped buffer, not joined from chunks"
    assert reads > 1


class _Noted(bytearray):
    """A buffer that notes the thread that frees it."""

    freed_in: list[str] = []

    def __del__(self) -> None:
        self.freed_in.append(threading.current_thread().name)


def _wait_freed(n: int) -> None:
    wait_for("the releasing thread", lambda: len(_Noted.freed_in) >= n, 10)


def test_a_buffer_released_later_is_freed_in_the_releasing_thread() -> None:
    _Noted.freed_in.clear()
    release_later(_Noted(b"x" * MAPPED_FROM))
    _wait_freed(1)
    assert _Noted.freed_in == ["kfan-release"]


def test_a_forked_child_releases_in_a_thread_of_its_own() -> None:
    release_later(b"started")  # the parent's thread runs
    pid = os.fork()
    if pid == 0:  # the child: its first release must start a thread there, or nothing is ever freed
        _Noted.freed_in.clear()
        release_later(_Noted(b"x"))
        end = time.monotonic() + 10
        while not _Noted.freed_in and time.monotonic() < end:
            time.sleep(0.01)
        os._exit(0 if _Noted.freed_in == ["kfan-release"] else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


async def test_an_abandoned_answer_is_freed_off_the_event_loop() -> None:
    _Noted.freed_in.clear()
    pending = Pending()
    pending.set(_Noted(b"a" * MAPPED_FROM))  # type: ignore[arg-type]
    pending.abandon()
    await wait_for_async("the releasing thread", lambda: _Noted.freed_in, 10)
    assert _Noted.freed_in == ["kfan-release"], "the answer's last reference went with it to the releasing thread"
