"""Identical Metadata requests out at once are sent once, and their answer shared (backends/flights.py).

Through the real kfan in front of a one-broker embedded cluster whose broker
sits behind the stand-in (:mod:`tests.support.badbroker`), which answers the
test clients' Metadata a second late: requests made within that second are
in flight together. Each client has its own client id, so the stand-in
counts which of them reached the broker. What must hold: twenty identical
requests make one broker request, and every client gets the whole answer
under its own correlation id; different bodies are not shared; an answer
that has landed is not reused (the next request is sent); and when the
client whose request the others share leaves before the answer, the others
are answered all the same (asked again on their own links).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from backends.flights import MAX_FLIGHTS, Flights
from backends.link import Pending
from proxy.capture.rows import read_rows
from proxy.kafka import schema
from proxy.kafka.headers import response_body_offset
from proxy.tools.mock_cluster import MockCluster
from spark.checks import check_exchange
from tests.support import badbroker
from tests.support.badbroker import LATE, STALL, BadBroker
from tests.support.kfan import Kfan, kfan_at, shown_ids, start_kfan
from tests.support.messages import request_bytes
from tests.support.rawclient import RawClient
from tests.support.waiting import wait_for

TOPIC, OTHER = "flights", "flights-other"
METADATA, VERSION = 3, 12
LIST_OFFSETS = 2
CLIENTS = 20


@pytest.fixture(scope="module")
def kfan_late() -> Iterator[tuple[Kfan, BadBroker]]:
    """kfan in front of one broker whose answers to the test's clients (client ids ``flight-*``) come a second late."""
    with MockCluster(1) as cluster, BadBroker(cluster.brokers[1], seed=1, lifetime=600) as bad:
        cluster.set_broker_address(1, "127.0.0.1", bad.port)
        cluster.create_topic(TOPIC, 3)
        cluster.create_topic(OTHER, 2)
        bad.set_mode(LATE, api_keys=[METADATA], client_ids=[f"flight-{i}" for i in range(CLIENTS)])
        with kfan_at(cluster.bootstrap) as k:
            yield k, bad


def _metadata(client: int, topics: list[str], correlation_id: int) -> bytes:
    body = {"topics": [{"name": t, "topic_id": uuid.UUID(int=0)} for t in topics] if topics else None, "allow_auto_topic_creation": False}
    payload = request_bytes(METADATA, VERSION, body, correlation_id, client_id=f"flight-{client}")
    return struct.pack(">i", len(payload)) + payload


def _answer(raw: RawClient, timeout: float = 30) -> tuple[int, schema.Struct]:
    payload = raw.receive(timeout)
    assert payload is not None, "kfan closed the connection"
    (cid,) = struct.unpack_from(">i", payload)
    spec = schema.response_spec(METADATA, VERSION)
    return cid, schema.decode_body(spec, payload, response_body_offset(payload, METADATA, VERSION))


def _asked(bad: BadBroker) -> int:
    """Metadata requests of the test's clients that reached the broker."""
    return sum(bad.requests(METADATA, f"flight-{i}") for i in range(CLIENTS))


def _all_at_once(k: Kfan, bodies: list[list[str]]) -> list[tuple[int, schema.Struct]]:
    clients = [RawClient(k.address) for _ in bodies]
    try:
        for i, (raw, topics) in enumerate(zip(clients, bodies, strict=True)):
            raw.send_bytes(_metadata(i, topics, 1000 + i))
        return [_answer(raw) for raw in clients]
    finally:
        for raw in clients:
            raw.close()


def _topics(answer: schema.Struct) -> dict[str, int]:
    return {t["name"]: len(t["partitions"]) for t in answer["topics"]}


def test_identical_requests_at_once_make_one_broker_request(kfan_late: tuple[Kfan, BadBroker]) -> None:
    k, bad = kfan_late
    before = _asked(bad)
    answers = _all_at_once(k, [[TOPIC]] * CLIENTS)
    # More would mean the answer went to its first client only (dropped before the others read it: asked again).
    assert _asked(bad) - before == 1, f"{_asked(bad) - before} broker requests for {CLIENTS} identical ones"
    assert [cid for cid, _ in answers] == [1000 + i for i in range(CLIENTS)], "each client's own correlation id"
    assert all(_topics(a) == {TOPIC: 3} for _, a in answers)
    assert all(a == answers[0][1] for _, a in answers), "every client gets the whole of the same answer"


def test_different_bodies_are_not_shared_and_a_landed_answer_is_not_reused(kfan_late: tuple[Kfan, BadBroker]) -> None:
    k, bad = kfan_late
    before = _asked(bad)
    answers = _all_at_once(k, [[TOPIC], [OTHER], [TOPIC, OTHER]] * 4)
    assert _asked(bad) - before == 3, "one broker request per distinct body"
    assert [_topics(a) for _, a in answers[:3]] == [{TOPIC: 3}, {OTHER: 2}, {TOPIC: 3, OTHER: 2}]
    _all_at_once(k, [[TOPIC]])
    assert _asked(bad) - before == 4, "asked after the shared answer landed: sent afresh"


def test_the_others_are_answered_when_the_client_they_share_with_leaves(kfan_late: tuple[Kfan, BadBroker]) -> None:
    k, bad = kfan_late
    before = _asked(bad)
    leaver = RawClient(k.address)
    leaver.send_bytes(_metadata(0, [TOPIC], 1))
    others = [RawClient(k.address) for _ in range(3)]
    try:
        for i, raw in enumerate(others, start=1):
            raw.send_bytes(_metadata(i, [TOPIC], 2000 + i))
        leaver.close()  # before the answer, which comes a second (badbroker.LATE_S) after the request
        answers = [_answer(raw) for raw in others]
    finally:
        for raw in others:
            raw.close()
    assert [cid for cid, _ in answers] == [2001, 2002, 2003]
    assert all(_topics(a) == {TOPIC: 3} for _, a in answers)
    # The leaver's request, and (once it left) one more for the others; never one each.
    assert 1 <= _asked(bad) - before <= 2, f"{_asked(bad) - before} broker requests"


def test_a_request_past_its_deadline_is_not_a_flight_to_join() -> None:
    """A Metadata request its broker never answers is asked again of another broker once kfan's request timeout
    passes, and that second request must not join the first (still listed as in flight, as its link is closing):
    the client gets the other broker's whole answer. Not, as it did, the first one's failure: in Metadata v13
    an error in an empty answer (which kafka-python 3 reads as "no such topic"), in earlier versions, which have
    no error code to carry it, a closed connection."""
    with MockCluster(2) as cluster, BadBroker(cluster.brokers[1], seed=1, lifetime=600) as stalled:
        cluster.set_broker_address(1, "127.0.0.1", stalled.port)
        cluster.create_topic(TOPIC, 3)
        with kfan_at(cluster.bootstrap, "--request-timeout", "1") as k:
            clients = [f"stall-{i}" for i in range(40)]
            stalled.set_mode(STALL, api_keys=[METADATA], client_ids=clients)
            # Each connection asks a broker of its own choosing: ask until one asked the stalled broker.
            for client in clients:
                raw = RawClient(k.address)
                try:
                    payload = request_bytes(
                        METADATA, VERSION, {"topics": [{"name": TOPIC, "topic_id": uuid.UUID(int=0)}]}, 7, client_id=client
                    )
                    raw.send_bytes(struct.pack(">i", len(payload)) + payload)
                    answer = raw.receive(30)
                finally:
                    raw.close()
                assert answer is not None, "kfan closed the connection"
                spec = schema.response_spec(METADATA, VERSION)
                body = schema.decode_body(spec, answer, response_body_offset(answer, METADATA, VERSION))
                assert (_topics(body), len(body["brokers"])) == ({TOPIC: 3}, len(shown_ids(cluster.brokers))), client
                if stalled.requests(METADATA, client):
                    break
            else:
                pytest.fail("no connection asked the stalled broker")
            assert stalled.injected(STALL, METADATA) >= 1


def test_a_shared_answer_does_not_wait_behind_what_a_broker_holds_for_its_first_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first client's Metadata goes out after a request of its own the broker holds (as Kafka holds an acks=all
    Produce until a dead follower leaves the ISR, or a JoinGroup until the group rebalances): a client asking the
    same is answered at once, not after that. It used to wait, as the shared request went out on the first client's
    own link behind the held one; in a broker-death storm Metadata took up to 12 s."""
    monkeypatch.setattr(badbroker, "LATE_S", 60.0)  # ListOffsets held a minute, and the link's answers after it
    with MockCluster(1) as cluster, BadBroker(cluster.brokers[1], seed=1, lifetime=600) as bad:
        cluster.set_broker_address(1, "127.0.0.1", bad.port)
        cluster.create_topic(TOPIC, 3)
        with kfan_at(cluster.bootstrap, "--request-timeout", "120") as k:
            bad.set_mode(LATE, api_keys=[LIST_OFFSETS], client_ids=["holder"])
            holder, joiner = RawClient(k.address), RawClient(k.address)
            try:
                offsets = {"replica_id": -1, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
                for request in (request_bytes(LIST_OFFSETS, 7, offsets, 1, client_id="holder"), _metadata_as("holder", 2)):
                    holder.send_bytes(struct.pack(">i", len(request)) + request)
                wait_for("the holder's Metadata at the broker", lambda: bad.requests(METADATA, "holder") == 1, 30)
                request = _metadata_as("joiner", 3)
                joiner.send_bytes(struct.pack(">i", len(request)) + request)
                cid, answer = _answer(joiner, timeout=30)  # half the hold: a joiner waiting behind it times out here
            finally:
                holder.close()
                joiner.close()
            assert bad.injected(LATE, LIST_OFFSETS) == 1, "the ListOffsets answer was held"
    assert (cid, _topics(answer)) == (3, {TOPIC: 3})


def _metadata_as(client_id: str, correlation_id: int) -> bytes:
    return request_bytes(
        METADATA, VERSION, {"topics": [{"name": TOPIC, "topic_id": uuid.UUID(int=0)}]}, correlation_id, client_id=client_id
    )


# --- the table itself ---------------------------------------------------------------------------


def test_a_flight_is_joined_until_it_lands_and_the_table_is_bounded() -> None:
    async def main() -> None:
        flights = Flights()
        key = (METADATA, VERSION, b"body")
        assert flights.join(key) is None
        leader = Pending()
        flights.lead(key, leader)
        joined = flights.join(key)
        assert joined is leader and leader.waiters == 2
        leader.set(b"answer")
        assert flights.join(key) is None, "answered: later requests ask afresh"
        assert len(flights) == 0
        for i in range(MAX_FLIGHTS + 10):
            flights.lead((METADATA, VERSION, b"%d" % i), Pending())
        assert len(flights) == MAX_FLIGHTS
        last = (METADATA, VERSION, b"%d" % (MAX_FLIGHTS + 5))
        assert flights.join(last) is None, "past the bound, requests are simply sent"
        flights.landed(Pending())  # never led: nothing happens

    trio.run(main)


def test_a_request_asked_again_does_not_join_a_flight_to_the_broker_that_failed_it() -> None:
    """Asked again elsewhere after its broker failed, a request must not wait for another client's identical one
    still out to that broker: it would most likely fail the same way, and a Metadata request failing twice costs
    its client the connection (its answer has no error code)."""

    async def main() -> None:
        flights = Flights()
        key = (METADATA, VERSION, b"body")
        to_failed = Pending()
        to_failed.broker = 2
        flights.lead(key, to_failed)
        assert flights.join(key, avoid=2) is None and to_failed.waiters == 1
        assert flights.join(key, avoid=1) is to_failed and to_failed.waiters == 2, "out to another broker: joined"
        assert flights.join(key) is to_failed and to_failed.waiters == 3

    trio.run(main)


def test_shared_answers_are_captured_as_each_client_asked_and_replay_clean(tmp_path: Path) -> None:
    """With traffic capture on, each client's exchange records its own sub-request (its client id), not the one
    it shared: the replay checks find nothing to report."""
    directory = tmp_path / "capture"
    with MockCluster(1) as cluster, BadBroker(cluster.brokers[1], seed=1, lifetime=600) as bad:
        cluster.set_broker_address(1, "127.0.0.1", bad.port)
        cluster.create_topic(TOPIC, 3)
        bad.set_mode(LATE, api_keys=[METADATA], client_ids=[f"flight-{i}" for i in range(CLIENTS)])
        k = start_kfan(cluster.bootstrap, "--capture", str(directory))
        try:
            before = _asked(bad)
            _all_at_once(k, [[TOPIC]] * 5)
            assert _asked(bad) - before == 1
        finally:
            assert k.stop() == 0
    rows = [r for r in read_rows(directory) if r.api_key == METADATA and r.request[8:10] == b"\x00\x08"]  # client id "flight-N"
    assert len(rows) == 5
    for row in rows:
        ((_, sent, _),) = row.subrequests
        assert sent[8:] == row.request[8:], "the sub-request is this client's own request (its header, its body)"
        result = check_exchange(row)
        assert not result.findings and not result.peer_findings, (result.findings, result.peer_findings)
