"""Requests to one broker answered where the answer lands, under one timer per connection (:mod:`proxy.server.deadlines`).

Through a client connection (in-memory streams, fake brokers, virtual clock): a broker that never answers
gets its request answered REQUEST_TIMED_OUT at the request timeout and its link closed; answers in time are
answered as they land, in request order. On its own, :class:`AnswerDeadlines` runs exactly one callback per entry, and
what it keeps stays bounded by the entries still out.
"""

from __future__ import annotations

import trio
import trio.testing

from backends.pending import LinkError, Pending
from proxy.kafka import apis, errors
from proxy.server.deadlines import AnswerDeadlines
from proxy.server.limits import Limits
from tests.test_connection import LIST_OFFSETS_V, answer_list_offsets, by_partition, list_offsets, serving

TIMEOUT = 7.0


async def test_a_broker_that_never_answers_times_out_at_the_request_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(Limits(request_timeout=TIMEOUT)) as h:
        start = trio.current_time()
        await h.client.send(list_offsets(1, [0]))
        await h.brokers.next(1)  # and never answered
        cid, body = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        took = trio.current_time() - start
        assert cid == 1 and TIMEOUT <= took < TIMEOUT + 1, took
        assert by_partition(body, "topics", "partitions", "partition_index")[0]["error_code"] == errors.REQUEST_TIMED_OUT
        # Its link was closed: the next request opens a new one.
        await h.client.send(list_offsets(2, [0]))
        again = await h.brokers.next(1)
        assert again.connection.number == 2
        await answer_list_offsets(again, 70)
        cid, body = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
        assert cid == 2 and by_partition(body, "topics", "partitions", "partition_index")[0]["offset"] == 70


async def test_answers_in_time_are_answered_as_they_land_and_none_waits_for_the_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async with serving(Limits(request_timeout=TIMEOUT)) as h:
        start = trio.current_time()
        for cid in range(1, 21):
            await h.client.send(list_offsets(cid, [cid % 2 * 1]))  # partitions 0 and 1: brokers 1 and 2
        held = [await h.brokers.next(1) for _ in range(10)] + [await h.brokers.next(2) for _ in range(10)]
        for i, req in enumerate(reversed(held)):
            await answer_list_offsets(req, 1000 + i)
        cids = [(await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V))[0] for _ in range(20)]
        assert cids == list(range(1, 21))
        assert trio.current_time() - start < 1.0


def _entry(deadlines: AnswerDeadlines, ran: list[tuple[int, str]], i: int, deadline: float) -> Pending:
    pending = Pending()
    deadlines.expect(pending, deadline, lambda _, late: ran.append((i, "late" if late else "landed")))
    return pending


async def test_each_entry_runs_one_callback_once(autojump_clock: trio.testing.MockClock) -> None:
    ran: list[tuple[int, str]] = []
    async with trio.open_nursery() as nursery:
        deadlines = AnswerDeadlines(nursery)
        now = trio.current_time()
        answered = _entry(deadlines, ran, 0, now + 5)
        failed = _entry(deadlines, ran, 1, now + 5)
        late = _entry(deadlines, ran, 2, now + 3)
        answered.set(b"answer")
        failed.set(LinkError("gone"))
        await trio.sleep(4)
        assert ran == [(0, "landed"), (1, "landed"), (2, "late")]
        late.set(b"too late")  # after its deadline: nothing more runs
        done = Pending()
        done.set(b"in already")
        deadlines.expect(done, now + 100, lambda _, late: ran.append((3, "late" if late else "landed")))
        assert ran[-1] == (3, "landed"), "an answer in already is handed over at once"
        await trio.sleep(10)
        assert ran == [(0, "landed"), (1, "landed"), (2, "late"), (3, "landed")]
        nursery.cancel_scope.cancel()


async def test_an_earlier_deadline_added_later_still_runs_on_time(autojump_clock: trio.testing.MockClock) -> None:
    ran: list[tuple[int, str]] = []
    async with trio.open_nursery() as nursery:
        deadlines = AnswerDeadlines(nursery)
        now = trio.current_time()
        _entry(deadlines, ran, 0, now + 60)
        await trio.sleep(1)  # the timer sleeps until the first deadline
        _entry(deadlines, ran, 1, now + 2)
        await trio.sleep(1.5)
        assert ran == [(1, "late")]
        nursery.cancel_scope.cancel()


async def test_what_it_keeps_is_bounded_by_the_entries_still_out(autojump_clock: trio.testing.MockClock) -> None:
    ran: list[tuple[int, str]] = []
    async with trio.open_nursery() as nursery:
        deadlines = AnswerDeadlines(nursery)
        out = [_entry(deadlines, ran, -1, trio.current_time() + 1000)]  # one request hung for long
        for i in range(10_000):
            _entry(deadlines, ran, i, trio.current_time() + 30).set(b"answer")  # every other one answered at once
            assert len(deadlines._heap) <= max(64, 4 * len(out)) + 1
        assert len(ran) == 10_000 and all(kind == "landed" for _, kind in ran)
        nursery.cancel_scope.cancel()
