"""The broker link (:mod:`backends.link`) over in-memory streams, against a fake broker.

The link is handed a ``connect`` function returning one end of
``trio.testing.memory_stream_pair()`` (or a lockstep pair, where a test needs
a write to block part way); the fake broker on the other end reads the
link's frames and answers with whatever correlation ids the test chooses.
The pure correlation-id table (:mod:`backends.correlations`) is tested alone
at the end.

Every trio test runs on trio's ``MockClock`` with autojump: the deadlines that
stop a test which hangs (:func:`running`, :func:`answer_of`, :func:`failure_of`)
are virtual, so they expire only once every task is blocked for good, never
because a loaded machine was slow.
"""

from __future__ import annotations

import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from backends.correlations import Correlations, UnknownCorrelationId
from backends.link import Link, LinkError, Pending
from proxy.core import SubRequest
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import peek_request

API_KEY, API_VERSION = 3, 1  # any: the link does not read bodies
_CID = struct.Struct(">i")


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def request(tag: str, expect_response: bool = True) -> SubRequest:
    return SubRequest(API_KEY, API_VERSION, [tag.encode()], expect_response)


class FakeBroker:
    """The broker's end of a link's stream: reads frames, answers by correlation id."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()

    async def read(self) -> tuple[int, str]:
        """The next request's correlation id and tag (its body)."""
        while (payload := self.reader.next_frame()) is None:
            data = await self.stream.receive_some()
            assert data, "the link closed its stream"
            self.reader.feed(data)
        api_key, api_version, cid = peek_request(payload)
        assert (api_key, api_version) == (API_KEY, API_VERSION)
        return cid, bytes(payload[8:]).decode()

    async def read_all(self, n: int) -> list[tuple[int, str]]:
        return [await self.read() for _ in range(n)]

    async def answer(self, cid: int, body: bytes) -> None:
        await self.stream.send_all(frame([_CID.pack(cid), body]))


def connect_to(stream: trio.abc.Stream, gate: trio.Event | None = None) -> Callable[[], Awaitable[trio.abc.Stream]]:
    async def connect() -> trio.abc.Stream:
        if gate is not None:
            await gate.wait()
        return stream

    return connect


def memory_link(gate: trio.Event | None = None) -> tuple[Link, FakeBroker]:
    client, server = trio.testing.memory_stream_pair()
    return Link(7, "broker.test", 9092, connect=connect_to(client, gate)), FakeBroker(server)


@asynccontextmanager
async def running(link: Link) -> AsyncIterator[None]:
    """The link's task, for the ``with`` block and until the link ends (failing the test after 2 s of virtual time)."""
    with trio.fail_after(2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(link.run)
            yield


def answered(p: Pending) -> bool:
    return p.done_at is not None


async def answer_of(p: Pending) -> bytes:
    with trio.fail_after(1):
        return await p.wait()


async def failure_of(p: Pending) -> LinkError:
    with trio.fail_after(1), pytest.raises(LinkError) as caught:
        await p.wait()
    return caught.value


# --- the link ---------------------------------------------------------------------------


async def test_answers_are_matched_by_correlation_id_when_the_broker_answers_out_of_order(autojump_clock: trio.testing.MockClock) -> None:
    link, broker = memory_link()
    a, b, c = (link.submit(request(t)) for t in "abc")
    async with running(link):
        got = await broker.read_all(3)
        cids = {tag: cid for cid, tag in got}
        for tag in "cab":
            await broker.answer(cids[tag], f"answer to {tag}".encode())
            await trio.testing.wait_all_tasks_blocked()
            if tag == "c":
                assert answered(c) and not answered(a) and not answered(b)
        assert await answer_of(a) == _CID.pack(cids["a"]) + b"answer to a"
        assert await answer_of(b) == _CID.pack(cids["b"]) + b"answer to b"
        assert await answer_of(c) == _CID.pack(cids["c"]) + b"answer to c"
        assert link.failed is None
        link.close()
    assert isinstance(link.failed, LinkError), "a closed link stays failed"


async def test_requests_are_queued_before_connecting_and_written_in_submission_order(autojump_clock: trio.testing.MockClock) -> None:
    connected = trio.Event()
    link, broker = memory_link(gate=connected)
    async with running(link):
        early = [link.submit(request(f"r{i}")) for i in range(5)]  # submit() needs no connection
        await trio.testing.wait_all_tasks_blocked()
        assert not any(p.written or p.sent.is_set() for p in early), "nothing leaves before the link connects"
        connected.set()
        late = []
        for i in range(5, 10):
            late.append(link.submit(request(f"r{i}", expect_response=i % 2 == 0)))
            await trio.sleep(0)
        got = await broker.read_all(10)
        assert [tag for _, tag in got] == [f"r{i}" for i in range(10)]
        assert [cid for cid, _ in got] == list(range(10)), "each request gets the link's next correlation id"
        assert all(p.written and p.sent.is_set() for p in early + late)
        link.close()


async def test_an_acks0_request_gets_no_waiter_and_a_later_answer_retires_it(autojump_clock: trio.testing.MockClock) -> None:
    link, broker = memory_link()
    fire_and_forget = link.submit(request("acks0", expect_response=False))
    asked = link.submit(request("asked"))
    async with running(link):
        (cid0, _), (cid1, _) = await broker.read_all(2)
        await trio.testing.wait_all_tasks_blocked()
        assert fire_and_forget.sent.is_set() and not answered(fire_and_forget), "nobody waits on an acks=0 request"
        await broker.answer(cid1, b"ok")
        assert await answer_of(asked) == _CID.pack(cid1) + b"ok"
        assert not answered(fire_and_forget)
        # The answer to the later request proved the acks=0 one will never be
        # answered: its id is forgotten, so an answer to it now is an unknown id.
        await broker.answer(cid0, b"late")
    assert link.failed is not None and f"unknown correlation id {cid0}" in str(link.failed)
    assert not answered(fire_and_forget)


async def test_an_unexpected_answer_to_an_acks0_request_is_skipped(autojump_clock: trio.testing.MockClock) -> None:
    # librdkafka's mock cluster answers acks=0 Produce requests; real brokers never do.
    link, broker = memory_link()
    fire_and_forget = link.submit(request("acks0", expect_response=False))
    asked = link.submit(request("asked"))
    async with running(link):
        (cid0, _), (cid1, _) = await broker.read_all(2)
        await broker.answer(cid0, b"nobody asked")
        await broker.answer(cid1, b"ok")
        assert await answer_of(asked) == _CID.pack(cid1) + b"ok"
        assert link.failed is None, "the unasked-for answer did not fail the link"
        assert not answered(fire_and_forget)
        then = link.submit(request("then"))
        cid2, tag = await broker.read()
        assert tag == "then"
        await broker.answer(cid2, b"still fine")
        assert await answer_of(then) == _CID.pack(cid2) + b"still fine"
        link.close()


async def test_a_broker_closing_mid_answer_fails_everything_waiting_and_the_link_stays_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link, broker = memory_link()
    a, b, c = (link.submit(request(t)) for t in "abc")
    async with running(link):
        got = await broker.read_all(3)
        await broker.answer(got[0][0], b"first")
        half = frame([_CID.pack(got[1][0]), b"second answer"])
        await broker.stream.send_all(half[:7])  # part of b's answer, then the broker goes
        await broker.stream.aclose()
    assert await answer_of(a) == _CID.pack(got[0][0]) + b"first"
    for p in (b, c):
        assert "closed the connection" in str(await failure_of(p))
    assert isinstance(link.failed, LinkError)
    later = link.submit(request("later"))
    assert answered(later), "a failed link fails a new request at once"
    assert await failure_of(later) is link.failed
    assert not later.written


async def test_an_unknown_correlation_id_fails_the_link(autojump_clock: trio.testing.MockClock) -> None:
    link, broker = memory_link()
    a = link.submit(request("a"))
    async with running(link):
        cid, _ = await broker.read()
        await broker.answer(cid + 1000, b"who?")
    error = await failure_of(a)
    assert f"unknown correlation id {cid + 1000}" in str(error)
    assert link.failed is error


async def test_written_tells_a_request_whose_bytes_started_out_from_one_that_never_left(autojump_clock: trio.testing.MockClock) -> None:
    # A lockstep stream: the link's write of `a` blocks until the broker reads
    # all of it, so `b` is still queued when the broker goes.
    client, server = trio.testing.lockstep_stream_pair()
    link = Link(7, "broker.test", 9092, connect=connect_to(client))
    a, b = link.submit(request("a")), link.submit(request("b"))
    async with running(link):
        assert len(await server.receive_some(3)) == 3
        await trio.testing.wait_all_tasks_blocked()
        assert a.written and not a.sent.is_set(), "a's bytes started out but are not all sent"
        assert not b.written
        await server.aclose()
    assert a.written and not b.written
    await failure_of(a)
    await failure_of(b)


async def test_a_connect_that_fails_fails_the_queued_requests(autojump_clock: trio.testing.MockClock) -> None:
    async def refused() -> trio.abc.Stream:
        raise ConnectionRefusedError(111, "Connection refused")

    link = Link(7, "broker.test", 9092, connect=refused)
    queued = [link.submit(request(t)) for t in "ab"] + [link.submit(request("c", expect_response=False))]
    await link.run()
    assert isinstance(link.failed, LinkError) and "Connection refused" in str(link.failed)
    for p in queued:
        assert await failure_of(p) is link.failed
        assert not p.written
    assert answered(link.submit(request("d")))


async def test_a_connect_that_hangs_fails_after_the_connect_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def hangs() -> trio.abc.Stream:
        await trio.sleep_forever()
        raise AssertionError

    link = Link(7, "broker.test", 9092, connect=hangs, connect_timeout=5.0)
    p = link.submit(request("a"))
    start = trio.current_time()
    await link.run()
    assert trio.current_time() - start == pytest.approx(5.0)
    assert "TooSlowError" in str(await failure_of(p))
    assert not p.written


async def test_closing_the_link_fails_what_waits_on_it(autojump_clock: trio.testing.MockClock) -> None:
    link, broker = memory_link()
    a = link.submit(request("a"))
    async with running(link):
        await broker.read()
        link.close()
    assert "closed" in str(await failure_of(a))
    assert a.written


async def test_keep_requests_keeps_the_frame_as_sent(autojump_clock: trio.testing.MockClock) -> None:
    client, server = trio.testing.memory_stream_pair()
    link = Link(7, "broker.test", 9092, connect=connect_to(client), keep_requests=True)
    p = link.submit(request("a"))
    assert p.request == frame([struct.pack(">hhi", API_KEY, API_VERSION, 0), b"a"])
    assert Link(7, "broker.test", 9092, connect=connect_to(client)).submit(request("a")).request is None


# --- the correlation-id table -------------------------------------------------------------


def test_ids_are_handed_out_in_order_and_wrap_at_int32_max() -> None:
    table: Correlations[str] = Correlations(first=0x7FFFFFFE)
    assert [table.add("x"), table.add(None), table.add("y")] == [0x7FFFFFFE, 0x7FFFFFFF, 0]
    assert table.next_id == 1
    assert (table.waiting, table.unanswered) == (2, 1)


def test_answers_find_their_waiter_once_in_any_order() -> None:
    table: Correlations[str] = Correlations()
    ids = {w: table.add(w) for w in "abc"}
    assert table.answer(ids["c"]) == "c"
    assert table.answer(ids["a"]) == "a"
    with pytest.raises(UnknownCorrelationId) as caught:
        table.answer(ids["a"])  # answered already
    assert caught.value.correlation_id == ids["a"]
    assert table.answer(ids["b"]) == "b"
    assert table.waiting == 0
    with pytest.raises(UnknownCorrelationId):
        table.answer(99)


def test_an_answer_to_a_request_expecting_none_is_skipped_once() -> None:
    table: Correlations[str] = Correlations()
    cid = table.add(None)
    assert table.unanswered == 1
    assert table.answer(cid) is None
    assert table.unanswered == 0
    with pytest.raises(UnknownCorrelationId):
        table.answer(cid)


def test_an_answer_retires_only_the_requests_expecting_none_sent_before_it() -> None:
    # Across the id wrap: submission order, not id order, decides.
    table: Correlations[str] = Correlations(first=0x7FFFFFFE)
    before1, before2 = table.add(None), table.add(None)  # 0x7FFFFFFE, 0x7FFFFFFF
    asked = table.add("asked")  # 0
    after = table.add(None)  # 1
    assert table.answer(asked) == "asked"
    assert table.unanswered == 1
    for cid in (before1, before2):
        with pytest.raises(UnknownCorrelationId):
            table.answer(cid)
    assert table.answer(after) is None


def test_take_all_empties_the_table_in_submission_order() -> None:
    table: Correlations[str] = Correlations()
    ids = [table.add(w) for w in "abcd"]
    table.add(None)
    assert table.answer(ids[1]) == "b"
    assert table.take_all() == ["a", "c", "d"]
    assert (table.waiting, table.unanswered) == (0, 0)
    with pytest.raises(UnknownCorrelationId):
        table.answer(ids[0])
    assert table.take_all() == []
