"""A request whose answer has no error code to say its brokers failed (Metadata before v13): asked again of
another broker, and only when that fails too is the client's connection closed, as a broker closes it on its
own failure. What kfan logs about it says what the client saw, and a broker's death that fails many clients'
requests at once writes one line for them, not one per client per attempt (30 lines in a millisecond when a
broker was killed under 30 clients asking Metadata, every one of them then answered by another broker).

Whole client connections over memory streams (the harness of tests/test_connection.py).
"""

from __future__ import annotations

import logging

import pytest
import trio
import trio.testing

from backends.cluster import Cluster
from proxy.kafka import apis
from tests.test_connection import make_cluster, serving
from tests.test_undecodable_answers import METADATA_V, metadata, next_anywhere

CLOSING = "answer can say its brokers failed: closing"


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Lines about the Metadata request itself (not the rate-limited ones about the broker's failure)."""
    about = ("Metadata", f"api_key {apis.METADATA} ")
    return [m for r in caplog.records if r.levelno >= logging.INFO and any(a in (m := r.getMessage()) for a in about)]


async def test_a_metadata_another_broker_answers_writes_no_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kfan")
    async with serving() as h:
        taken: set[int] = set()
        await h.client.send(metadata(1))
        first = await next_anywhere(h.brokers, taken)
        await first.close_connection()
        second = await next_anywhere(h.brokers, taken)
        assert second.broker != first.broker, "not asked of another broker"
        await second.answer({"brokers": [{"node_id": 1, "host": "broker1.test", "port": 9092, "rack": None}], "topics": []})
        cid, body = await h.client.response(apis.METADATA, METADATA_V)
        assert cid == 1 and body["brokers"]
    assert lines(caplog) == [], "a line about an answer the client got"


async def test_clients_closed_because_every_broker_failed_their_metadata_share_one_line(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kfan")
    cluster: Cluster = make_cluster()
    for cid in (1, 2):
        async with serving(cluster=cluster) as h:
            taken: set[int] = set()
            await h.client.send(metadata(cid))
            for _ in range(2):  # the broker asked, then another one
                await (await next_anywhere(h.brokers, taken)).close_connection()
            assert await h.client.closed(), "answered, though no broker answered"
    assert len(lines(caplog)) == 1 and CLOSING in lines(caplog)[0], lines(caplog)
