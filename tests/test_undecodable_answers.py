"""A broker answer kfan cannot decode is a retriable error for the client (as
before), and now also a line in kfan's log, at most one per broker and API per
interval however often it happens, and a count in
``kfan_broker_answers_undecodable_total{broker,api}``.

A whole client connection over memory streams (the harness of
tests/test_connection.py), with fake brokers that answer garbage when told to.
"""

from __future__ import annotations

import logging

import pytest
import trio
from prometheus_client import REGISTRY

from proxy.core import Forward, Response, plan_request, undecodable
from proxy.kafka import apis, errors
from proxy.kafka.headers import response_header
from tests.support.memory_broker import BrokerRequest, MemoryBrokers
from tests.support.messages import request_bytes
from tests.test_connection import LIST_OFFSETS_V, answer_list_offsets, by_partition, list_offsets, serving
from tests.test_fault_boundaries import _context, _fetch_plan, _fetchanswer_bytes

RETRIABLE = {errors.NOT_LEADER_OR_FOLLOWER, errors.REQUEST_TIMED_OUT, errors.NETWORK_EXCEPTION}
METADATA_V = 12


def undecodable_count(broker: int, api: str) -> float:
    return REGISTRY.get_sample_value("kfan_broker_answers_undecodable_total", {"broker": str(broker), "api": api}) or 0.0


def lines_about(caplog: pytest.LogCaptureFixture, broker: int, api: str) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if "cannot decode" in r.getMessage() and f"broker {broker} answered {api} " in r.getMessage()
    ]


def metadata(cid: int) -> bytes:
    return request_bytes(apis.METADATA, METADATA_V, {"topics": None, "allow_auto_topic_creation": False}, cid)


async def answer_garbage(req: BrokerRequest) -> None:
    """The right header (so the link takes it as this request's answer), then a body that does not decode."""
    h = req.header
    req.answered = True
    await req.connection.send(response_header(h.api_key, h.api_version, h.correlation_id) + b"\x00\x00\x00\x00\xff\xff\xff\x7f")


async def test_a_garbage_answer_is_a_retriable_error_logged_once_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    before = undecodable_count(2, "ListOffsets")
    repeats = 5
    async with serving() as h:
        for cid in range(1, repeats + 1):
            await h.client.send(list_offsets(cid, [0, 1]))  # partition 0 on broker 1, partition 1 on broker 2
            await answer_list_offsets(await h.brokers.next(1), 100)
            await answer_garbage(await h.brokers.next(2))
            got, body = await h.client.response(apis.LIST_OFFSETS, LIST_OFFSETS_V)
            parts = by_partition(body, "topics", "partitions", "partition_index")
            assert got == cid
            assert parts[0]["error_code"] == 0 and parts[0]["offset"] == 100, "the healthy broker's part was not served"
            assert parts[1]["error_code"] in RETRIABLE
            assert undecodable_count(2, "ListOffsets") == before + cid
    (line,) = lines_about(caplog, 2, "ListOffsets")  # one line for five answers
    assert f"ListOffsets v{LIST_OFFSETS_V}" in line and "retriable" in line
    assert undecodable_count(1, "ListOffsets") == 0
    assert not lines_about(caplog, 1, "ListOffsets")


async def next_anywhere(brokers: MemoryBrokers, taken: set[int]) -> BrokerRequest:
    """The next request any broker reads that this test has not taken yet."""
    while True:
        for reqs in brokers.received.values():
            for req in reqs:
                if id(req) not in taken:
                    taken.add(id(req))
                    return req
        await trio.sleep(0.005)


async def test_an_undecodable_answer_to_any_broker_names_the_broker_that_sent_it(caplog: pytest.LogCaptureFixture) -> None:
    """Metadata goes to any broker: the count and the line name the one that babbled, and another broker answers the client."""
    caplog.set_level(logging.INFO)
    async with serving() as h:
        taken: set[int] = set()
        await h.client.send(metadata(1))
        first = await next_anywhere(h.brokers, taken)
        before = undecodable_count(first.broker, "Metadata")
        await answer_garbage(first)
        second = await next_anywhere(h.brokers, taken)
        assert second.broker != first.broker, "the read-only request was not asked of another broker"
        await second.answer({"brokers": [{"node_id": 1, "host": "broker1.test", "port": 9092, "rack": None}], "topics": []})
        got, body = await h.client.response(apis.METADATA, METADATA_V)
        assert got == 1 and body["brokers"]
    assert undecodable_count(first.broker, "Metadata") == before + 1
    (line,) = lines_about(caplog, first.broker, "Metadata")
    assert f"Metadata v{METADATA_V}" in line


# --- at the core: which failures are noted ---------------------------------------------------


def test_the_core_notes_the_answers_it_fails_and_only_those() -> None:
    plan, _ = _fetch_plan()
    garbage = Response(b"\x00\x00\x00\x00\xff\xff\xff")
    with undecodable.collect() as noted:
        plan.merge(plan, {1: Response(_fetchanswer_bytes(0, b"x")), 2: garbage, 3: Response(_fetchanswer_bytes(2, b""))})
    assert [p for p, _ in noted] == [garbage.payload]

    # A coordinator's answer goes to the client as it came: one that breaks the
    # schema past its header still does, and is no failure; one whose header
    # does not parse is.
    heartbeat = plan_request(_context(), bytes.fromhex("000c00040000000700017800026700000001026d0000"))
    assert isinstance(heartbeat, Forward)
    (target,) = heartbeat.subs
    for answer, failed in ((b"\x00\x00\x00\x00\x00", False), (b"\x00\x00", True)):
        with undecodable.collect() as noted:
            heartbeat.merge(heartbeat, {target: Response(answer)})
        assert bool(noted) == failed, answer

    undecodable.note(b"x", ValueError("nobody collects"))  # outside collect(): nothing happens
