"""Failures behind and of kfan, seen by real clients through the real kfan process.

Every test owns its cluster (it moves leaders, kills brokers) and its kfan,
which refreshes its topology every second. Brokers go down mid-produce,
leaders and coordinators move under running clients, kfan itself restarts
under load, and kfan starts while most of the cluster is down. What must hold
throughout: nothing a client was told is written is missing, idempotent
producers stay exactly-once and in order, and clients carry on.
"""

from __future__ import annotations

import datetime
import functools
import json
import re
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import trio
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from proxy.kafka import apis, errors
from proxy.tools.mock_cluster import MockCluster
from tests.support.flows import PARTITIONS, Flow, Reports, Row, check_in_order
from tests.support.kfan import Kfan, kfan_on, start_kfan
from tests.support.metrics import http_get, labels_of, metrics_port_in, parse_samples
from tests.support.rawclient import RawClient
from tests.support.records import produce_request
from tests.support.round_trip import SESSION_MS  # the mock holds a classic group rejoin for session timeout - 1 s
from tests.support.waiting import wait_for, wait_for_line

LEADERS = [1, 2, 3, 1, 2, 3]


def new_topic(cluster: MockCluster, leaders: list[int] = LEADERS) -> str:
    name = f"f-{uuid.uuid4().hex[:10]}"
    cluster.create_topic(name, len(leaders), leaders=leaders)
    return name


def read_all(bootstrap: str, topic: str, partitions: int = PARTITIONS, timeout: float = 60) -> list[Row]:
    """Every record of the topic, read from offset 0 up to each partition's high watermark."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"read-{uuid.uuid4()}", "enable.auto.commit": False, "fetch.wait.max.ms": 100}
    )
    try:
        high = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        rows: list[Row] = []
        nxt = dict.fromkeys(range(partitions), 0)

        def read_up_to_high() -> bool:
            if all(nxt[p] >= high[p] for p in range(partitions)):
                return True
            for m in consumer.consume(1000, timeout=0.5):
                assert m.error() is None, m.error()
                if m.offset() < high[m.partition()]:
                    rows.append((m.partition(), m.offset(), m.key(), m.value()))
                    nxt[m.partition()] = m.offset() + 1
            return all(nxt[p] >= high[p] for p in range(partitions))

        wait_for(
            "every record up to the high watermarks", read_up_to_high, timeout, seen=lambda: f"read up to {nxt}, high watermarks {high}"
        )
        return rows
    finally:
        consumer.close()


# --- 1. chaos: a broker dies, its partitions move, it comes back ----------------------


def test_idempotent_producer_through_broker_loss_and_leader_moves() -> None:
    n = 20_000
    with MockCluster() as c, kfan_on(c) as k:
        topic = new_topic(c)
        producer = Producer(
            {
                "bootstrap.servers": k.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 500,
            }
        )
        reports = Reports()
        moved_away = {1: 1, 4: 3}  # broker 2's partitions and where they go
        # The chaos, keyed by how many records have been handed to the producer.
        timeline: dict[int, Callable[[], None]] = {
            4_000: lambda: c.broker_down(2),
            8_000: lambda: [c.set_leader(topic, p, b) for p, b in moved_away.items()],  # type: ignore[func-returns-value]
            12_000: lambda: c.broker_up(2),
            16_000: lambda: [c.set_leader(topic, p, 2) for p in moved_away],  # type: ignore[func-returns-value]
        }
        for i in range(n):
            if i in timeline:
                timeline[i]()
            while True:
                try:
                    producer.produce(topic, key=f"key-{i % 500}".encode(), value=str(i).encode(), on_delivery=reports)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
            if i % 200 == 199:
                time.sleep(0.04)  # ~4 s of producing, so each step happens under load
        assert producer.flush(90) == 0, "records still undelivered"
        assert reports.count == len(reports.by_value) == n, "one delivery report per record"
        assert reports.failed == {}, f"{len(reports.failed)} failed, e.g. {list(reports.failed.items())[:3]}"

        rows = read_all(k.bootstrap, topic)
        values = [int(v) for _, _, _, v in rows]
        assert len(values) == n, f"{len(values)} records in the topic, {n} produced"
        assert sorted(values) == list(range(n)), "records lost or duplicated"
        assert reports.ok <= set(values)
        check_in_order(rows)
        key_partition: dict[bytes | None, int] = {}
        for partition, _, key, _ in rows:
            assert key_partition.setdefault(key, partition) == partition, "one key, one partition"
        assert {p for p, _, _, _ in rows} == set(range(PARTITIONS))
        wait_for_line(k.log, r"link to broker 2 .*failed")  # broker 2's loss was noticed


# --- 2. a leader moves while nothing fails ---------------------------------------------


def errors_answered(k: Kfan) -> dict[tuple[int, int], float]:
    """kfan's count of partitions it answered with an error (kfan_errors_total): (error code, broker that answered) -> count."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    out: dict[tuple[int, int], float] = {}
    for labels, value in parse_samples(text).get("kfan_errors_total", []):
        if value:
            lab = labels_of(labels)
            out[(int(lab["error_code"]), int(lab["broker"]))] = value
    return out


def test_leader_move_costs_each_client_at_most_one_retriable_error_per_partition() -> None:
    metrics = ("--metrics-listen", "127.0.0.1:0")
    retriable = {6, 74, 75}  # NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH
    with MockCluster() as c, kfan_on(c, *metrics) as kp, kfan_on(c, *metrics) as kc:
        topic = new_topic(c)
        flow = Flow(topic, produce_via=kp, consume_via=kc).start()
        seen: dict[str, list[dict[tuple[int, int], float]]] = {"producer": [], "consumer": []}
        try:
            wait_for("records to flow", lambda: len(flow.consumed) >= 300 or bool(flow.failures))
            for who, k in (("producer", kp), ("consumer", kc)):
                seen[who].append(errors_answered(k))
            assert seen == {"producer": [{}], "consumer": [{}]}, f"errors before anything moved: {seen}"
            # One partition at a time, so that each client's error count belongs to one moved partition.
            for partition, broker in ((0, 2), (4, 3)):  # partition 0 from broker 1 to 2, then partition 4 from broker 2 to 3
                c.set_leader(topic, partition, broker)
                moved_at = flow.sent
                # Data keeps flowing, through the moved partition too: records sent well after the move arrive.
                wait_for(
                    f"records produced after partition {partition} moved to be consumed from every partition",
                    lambda moved_at=moved_at: (
                        bool(flow.failures) or all(max(flow.values_from(p), default=-1) >= moved_at + 600 for p in range(PARTITIONS))
                    ),
                )
                for who, k in (("producer", kp), ("consumer", kc)):
                    seen[who].append(errors_answered(k))
        finally:
            flow.finish()
        print(f"errors (code, broker) -> count, before and after each move: {seen}")
        assert flow.reports.failed == {}
        values = sorted(int(v) for _, _, _, v in flow.consumed)
        assert values == sorted(flow.reports.ok) == list(range(flow.sent)), "records lost or duplicated"
        check_in_order(flow.consumed)
        assert flow.consumer_errors == [] and flow.producer_errors == [], (flow.consumer_errors, flow.producer_errors)
        for who, counts in seen.items():
            for step, (before, after) in enumerate(zip(counts, counts[1:], strict=False)):
                new = {key: n - before.get(key, 0) for key, n in after.items() if n != before.get(key, 0)}
                assert {code for code, _ in new} <= retriable, f"the {who} saw non-retriable errors after move {step + 1}: {new}"
                assert sum(new.values()) <= 1, f"the {who} saw {new} for one moved partition"


# --- 3. the group coordinator moves while the group consumes ---------------------------


def test_group_keeps_consuming_and_committing_while_its_coordinator_moves() -> None:
    group = f"cg-{uuid.uuid4()}"
    with MockCluster() as c, kfan_on(c) as k:
        topic = new_topic(c)
        c.set_coordinator("group", group, 1)
        flow = Flow(topic, produce_via=k, consume_via=k, group=group).start()
        try:
            wait_for(
                "the group to consume and commit", lambda: bool(flow.failures) or (len(flow.consumed) >= 500 and len(flow.commits) >= 3)
            )
            first_move = time.monotonic()
            for broker in (2, 3):
                c.set_coordinator("group", group, broker)
                moved_at, consumed_at = time.monotonic(), len(flow.consumed)
                wait_for(
                    f"commits and new records after the coordinator moved to broker {broker}",
                    lambda moved_at=moved_at, consumed_at=consumed_at: (
                        bool(flow.failures) or (sum(t > moved_at for t in flow.commits) >= 3 and len(flow.consumed) >= consumed_at + 500)
                    ),
                )
            # The old coordinators refuse heartbeats (the mock answers NOT_COORDINATOR): had kfan kept
            # sending them there, the member would expire one session after the first move and the
            # group would rebalance. Keep going past that point: until the member commits again well after it.
            until = first_move + SESSION_MS / 1000 + 1.5
            wait_for(
                "a commit more than a session timeout after the coordinator first moved",
                lambda: bool(flow.failures) or any(t > until for t in list(flow.commits)),
                timeout=SESSION_MS / 1000 + 30,
            )
            assert flow.assignments == [list(range(PARTITIONS))] and flow.revocations == 0, (
                f"the group rebalanced: assignments {flow.assignments}, {flow.revocations} revocations"
            )
        finally:
            flow.finish()
        assert flow.reports.failed == {}
        delivered = sorted(flow.reports.ok)
        assert delivered == list(range(flow.sent))
        values = [int(v) for _, _, _, v in flow.consumed]
        assert set(values) == set(delivered), f"{len(set(delivered) - set(values))} records skipped"
        assert len(values) == len(delivered), f"{len(values) - len(set(values))} records consumed twice (no rebalance, so none may be)"
        check_in_order(flow.consumed)
        print(f"{len(flow.commit_errors)} commits failed while the coordinator moved: {flow.commit_errors[:3]}")
        # The committed offsets end at the end of every partition.
        probe = Consumer({"bootstrap.servers": k.bootstrap, "group.id": group, "enable.auto.commit": False})
        try:
            high = {p: probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
            committed = {
                tp.partition: tp.offset for tp in probe.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10)
            }
        finally:
            probe.close()
        assert sum(high.values()) == flow.sent
        assert committed == high, f"committed {committed}, end of partitions {high}"


# --- 4. a broker dies while a fanned-out Produce is in flight ---------------------------


RETRIABLE_PRODUCE = {6, 7}  # NOT_LEADER_OR_FOLLOWER (not written), REQUEST_TIMED_OUT (maybe written)


# kfan gives up on a broker's answer to a Produce after the request's own timeout (5 s in produce_request)
# plus --request-timeout: an answer sooner than that, while the broker still held its own, is kfan noticing
# the broker died. The broker holds it far longer, so that no slowness of the machine can let it answer.
KFAN_REQUEST_TIMEOUT_S = 30
KFAN_GIVES_UP_S = 5 + KFAN_REQUEST_TIMEOUT_S
HELD_MS = 4 * KFAN_GIVES_UP_S * 1000


def test_broker_killed_mid_fanout_produce_fails_only_its_partitions() -> None:
    with (
        MockCluster() as c,
        kfan_on(c, "--metrics-listen", "127.0.0.1:0", "--request-timeout", str(KFAN_REQUEST_TIMEOUT_S)) as k,
        Consumer({"bootstrap.servers": c.bootstrap, "group.id": f"probe-{uuid.uuid4()}"}) as direct,  # straight to the brokers
    ):
        topic = new_topic(c)
        with RawClient(k.address) as client:
            assert all(
                p.error_code.value == 0
                for p in client.call(produce_request(topic, [0, 1, 2, 3, 4, 5], acks=-1)).responses[0].partition_responses
            )
            # Broker 2 writes the next Produce it gets at once, then holds its answer: kill it meanwhile.
            c.push_broker_request_errors(2, apis.PRODUCE, [(0, HELD_MS)])
            order = [4, 0, 5, 2, 1, 3]
            sent_at = time.monotonic()
            cid = client.send(produce_request(topic, order, acks=-1))
            wait_for(
                "kfan to have the Produce out on every broker (brokers 1 and 3 answered)",
                lambda: (n := _broker_counts(k, api_key=0)).get(1, 0) >= 2 and n.get(3, 0) >= 2,
            )
            wait_for(
                "broker 2 to have written the record of each of its partitions (its high watermarks, asked past kfan)",
                lambda: all(direct.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] == 2 for p in (1, 4)),
            )
            c.broker_down(2)
            payload = client.receive(timeout=KFAN_GIVES_UP_S + 30)
            took = time.monotonic() - sent_at
            assert payload is not None
            resp = client.decode(produce_request(topic, order, acks=-1), payload)
            assert struct.unpack_from(">i", payload)[0] == cid
        print(f"answered {took:.2f} s after sending")
        codes = {p.index: p.error_code.value for p in resp.responses[0].partition_responses}
        assert list(codes) == order, "every partition once, in the client's order"
        assert {p: codes[p] for p in (0, 2, 3, 5)} == {0: 0, 2: 0, 3: 0, 5: 0}, codes
        # The request had reached broker 2 whole: "maybe written" (REQUEST_TIMED_OUT), not "not written".
        assert codes[1] == codes[4] == 7, f"broker 2's partitions: {codes}"
        assert took < KFAN_GIVES_UP_S, f"answered {took:.1f} s after sending: kfan waited for broker 2 instead of noticing it died"
        # Broker 2 comes back: the partitions acknowledged hold the record, and the failed ones can be retried.
        c.broker_up(2)
        rows = read_all(k.bootstrap, topic)
        acknowledged = {(p, f"p{p}".encode()) for p, code in codes.items() if code == 0}
        assert acknowledged <= {(p, v) for p, _, _, v in rows}
        # (Broker 2 had in fact written it, as seen before it died: the mock held only its answer. Hence "maybe written".)
        assert {p: sum(r[0] == p for r in rows) for p in range(PARTITIONS)} == dict.fromkeys(range(PARTITIONS), 2)
        with RawClient(k.address) as client:
            wait_for(
                "a retry of broker 2's partitions to succeed",
                lambda: all(
                    p.error_code.value == 0 for p in client.call(produce_request(topic, [1, 4], acks=-1)).responses[0].partition_responses
                ),
                every=0.2,
            )


MESSAGE_TIMEOUT_MS = 12_000  # past the few seconds every record takes to reach kfan, and short for a flush


def test_broker_killed_under_a_real_producer_loses_nothing_it_acknowledged() -> None:
    """The same through librdkafka without retries, so every error reaches the delivery reports.

    A sub-request kfan has not yet written to broker 2 when it dies (rare: the kill follows the client's last
    send closely) is answered NOT_LEADER_OR_FOLLOWER, "not written", as Kafka's brokers answer for a partition
    they do not lead. librdkafka then keeps those records, whatever ``retries`` says, for a new leader, which
    the mock never elects: they fail when their message timeout ends (seen once in 96 runs, with the client's
    debug log: partition 4's request was answered NOT_LEADER, and its 300 records went back to wait for a
    leader)."""
    per_partition = 300
    with MockCluster() as c, kfan_on(c, "--metrics-listen", "127.0.0.1:0") as k:
        topic = new_topic(c)
        stats: list[dict[str, Any]] = []  # librdkafka's statistics, newest last
        producer = Producer(
            {
                "bootstrap.servers": k.bootstrap,
                "acks": "all",
                "linger.ms": 20,
                "retries": 0,
                "message.timeout.ms": MESSAGE_TIMEOUT_MS,
                "statistics.interval.ms": 100,
                "stats_cb": lambda text: stats.append(json.loads(text)),
            }
        )

        def handed_to_kfan(partition: int) -> int:
            """Records of ``partition`` the producer has put in a Produce request to kfan (the statistics' txmsgs)."""
            partitions = stats[-1].get("topics", {}).get(topic, {}).get("partitions", {}) if stats else {}
            return int(partitions.get(str(partition), {}).get("txmsgs", 0))

        # The client learns the cluster first: its Metadata may go to broker 2, which is about to be slow.
        for p in range(PARTITIONS):
            producer.produce(topic, value=str(-1 - p).encode(), partition=p)
        assert producer.flush(10) == 0
        reports = Reports()
        partition_of: dict[int, int] = {}
        before = _broker_counts(k, api_key=0)
        c.set_rtt(2, HELD_MS)  # longer than anything here may take: broker 2 cannot answer before it dies
        for i in range(per_partition * PARTITIONS):
            partition_of[i] = i % PARTITIONS
            producer.produce(topic, value=str(i).encode(), partition=i % PARTITIONS, on_delivery=reports)
        on_broker_2 = {i for i, p in partition_of.items() if LEADERS[p] == 2}
        # Brokers 1 and 3 answer kfan at once while broker 2 sits on its requests: then it dies. Every record
        # has gone out to kfan by then: one still in the producer would wait for a leader after broker 2 died.
        wait_for(
            "every record to be sent to kfan, and brokers 1 and 3 to answer kfan",
            lambda: (
                producer.poll(0.02) >= 0
                and all(handed_to_kfan(p) >= 1 + per_partition for p in range(PARTITIONS))
                and _answered_since(before, _broker_counts(k, api_key=0)) >= {1, 3}
            ),
            seen=lambda: f"records sent to kfan by partition: { {p: handed_to_kfan(p) for p in range(PARTITIONS)} }",
        )
        assert not set(reports.by_value) & on_broker_2, "broker 2 answered despite its delay"
        c.broker_down(2)
        assert producer.flush(MESSAGE_TIMEOUT_MS / 1000 + 10) == 0
        assert reports.ok == set(partition_of) - on_broker_2
        failed = reports.failed
        assert set(failed) == on_broker_2
        codes = {e.code() for e in failed.values()}
        # REQUEST_TIMED_OUT: written, maybe persisted; the message timeout: not written, waited for a leader.
        assert codes <= {KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT}, codes
        # Broker 2 back: everything acknowledged is there, and its partitions take writes again.
        c.set_rtt(2, 0)
        c.broker_up(2)
        rows = read_all(k.bootstrap, topic)
        assert reports.ok <= {int(v) for _, _, _, v in rows}
        check_in_order(rows)
        retry = Reports()
        for i in sorted(on_broker_2):
            producer.produce(topic, value=str(i).encode(), partition=partition_of[i], on_delivery=retry)
        assert producer.flush(20) == 0
        assert retry.failed == {} and retry.ok == on_broker_2


def _answered_since(before: dict[int, float], now: dict[int, float]) -> set[int]:
    """Brokers whose answer count grew."""
    return {b for b, n in now.items() if n > before.get(b, 0)}


def _broker_counts(k: Kfan, api_key: int) -> dict[int, float]:
    """Answers kfan got from each broker for ``api_key`` (kfan_broker_request_duration_seconds_count)."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    out: dict[int, float] = {}
    for labels, value in parse_samples(text).get("kfan_broker_request_duration_seconds_count", []):
        lab = labels_of(labels)
        if lab["api_key"] == str(api_key):
            out[int(lab["broker"])] = value
    return out


# --- 5. kfan itself restarts under load ------------------------------------------------


def test_kfan_restart_under_load_on_the_same_port() -> None:
    group = f"rg-{uuid.uuid4()}"
    with MockCluster() as c:
        topic = new_topic(c)
        # The first kfan listens on a port the kernel picks (port 0: no port chosen, let go and bound later).
        first = start_kfan(c.bootstrap, "--metadata-refresh", "1")
        port = first.port
        flow: Flow | None = None
        try:
            flow = Flow(topic, produce_via=first, consume_via=first, group=group).start()
            wait_for(
                "the group to consume and commit", lambda: bool(flow.failures) or (len(flow.consumed) >= 500 and len(flow.commits) >= 3)
            )
            stopped_at = flow.sent
            assert first.alive()
            assert first.stop() == 0  # SIGTERM: stop accepting, answer what was read, exit
            # A thread copies kfan's output into its log: the line may land a moment after the exit.
            wait_for_line(first.log, r"every connection drained")

            def restarted() -> Kfan | None:
                """kfan on the same port again; None while another socket still holds the port (then it is tried again)."""
                try:
                    return start_kfan(c.bootstrap, "--metadata-refresh", "1", "--listen", f"127.0.0.1:{port}")
                except RuntimeError as e:
                    if "Address already in use" in str(e):
                        return None
                    raise

            second = wait_for(f"a second kfan to listen on port {port}", restarted, timeout=60, every=0.5)
            try:
                assert second.port == port
                restarted_at = time.monotonic()
                # The clients know only the one address: what flows now flows through the new kfan.
                wait_for(
                    "records produced after the restart to be consumed from every partition, and commits",
                    lambda: (
                        bool(flow.failures)
                        or (
                            all(max(flow.values_from(p), default=-1) >= stopped_at + 600 for p in range(PARTITIONS))
                            and sum(t > restarted_at for t in flow.commits) >= 3
                        )
                    ),
                )
                # The member outlived the restart: no rebalance, no rewind to committed offsets.
                assert flow.assignments == [list(range(PARTITIONS))] and flow.revocations == 0, (flow.assignments, flow.revocations)
                flow.finish()
            except BaseException:
                second.stop()
                print("the second kfan's log (tail):\n" + "".join(second.log[-80:]))  # shown by pytest with the failure
                raise
            alive, code = second.alive(), second.stop()
            assert alive, "the second kfan died during the test:\n" + "".join(second.log[-60:])
            assert code == 0, f"the second kfan did not stop cleanly (exit {code}):\n" + "".join(second.log[-60:])
        finally:
            first.stop()
            if flow is not None:
                flow.stop_producing.set()
                flow.stop_consuming.set()
        assert flow.reports.failed == {}, list(flow.reports.failed.items())[:3]
        delivered = sorted(flow.reports.ok)
        assert delivered == list(range(flow.sent))
        values = [int(v) for _, _, _, v in flow.consumed]
        assert sorted(values) == delivered, "records lost or consumed twice across the restart"
        check_in_order(flow.consumed)
        assert sorted(int(v) for _, _, _, v in read_all(c.bootstrap, topic)) == delivered, "the log itself holds each record once"


# --- 6. kfan starts while most of the cluster is down ---------------------------------


def reachability(k: Kfan) -> dict[int, float]:
    """kfan_broker_reachable, by broker id."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(k.log)}/metrics")
    return {int(labels_of(labels)["broker"]): value for labels, value in parse_samples(text).get("kfan_broker_reachable", [])}


def test_start_with_two_of_three_brokers_down() -> None:
    with MockCluster() as c:
        topic = new_topic(c)
        c.broker_down(2)
        c.broker_down(3)
        # The brokers that are down come first in the bootstrap list.
        bootstrap = ",".join(f"{h}:{p}" for h, p in (c.brokers[3], c.brokers[2], c.brokers[1]))
        with kfan_on(c, "--metrics-listen", "127.0.0.1:0", bootstrap=bootstrap) as k:
            for b in (3, 2):
                wait_for_line(k.log, re.escape("bootstrap broker {}:{} did not answer".format(*c.brokers[b])))
            # The metadata lists live brokers only; 2 and 3 still lead partitions, so kfan knows of them.
            for b in (2, 3):
                wait_for_line(k.log, f"broker {b} is unreachable")
            wait_for_line(k.log, re.escape("brokers up [1], down [2, 3]"))
            base = f"http://127.0.0.1:{metrics_port_in(k.log)}"
            assert http_get(base + "/readyz")[0] == 200, "one broker answers: ready"
            assert reachability(k) == {1: 1, 2: 0, 3: 0}
            # A client produces to every partition: broker 1's take the records at once; the
            # others have no leader (as Kafka reports a partition whose leader is down), so
            # the client holds their records instead of sending kfan requests it must refuse.
            producer = Producer({"bootstrap.servers": k.bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000})
            reports = Reports()
            for i in range(600):
                producer.produce(topic, value=str(i).encode(), partition=i % PARTITIONS, on_delivery=reports)
            on_broker_1 = {i for i in range(600) if LEADERS[i % PARTITIONS] == 1}
            wait_for(
                "broker 1's records to be acknowledged", lambda: producer.poll(0.05) >= 0 and len(reports.by_value) >= len(on_broker_1)
            )
            assert reports.ok == on_broker_1 and reports.failed == {}
            consumer = Consumer({"bootstrap.servers": k.bootstrap, "group.id": f"s-{uuid.uuid4()}", "enable.auto.commit": False})
            got: set[int] = set()

            def consumed_broker_1s() -> bool:
                got.update(int(m.value()) for m in consumer.consume(500, timeout=0.2) if m.error() is None)
                return got >= on_broker_1

            try:
                consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in (0, 3)])
                wait_for("broker 1's records to be consumed", consumed_broker_1s, seen=lambda: f"{len(got)} of {len(on_broker_1)} consumed")
            finally:
                consumer.close()
            assert got == on_broker_1
            assert len(reports.by_value) == len(on_broker_1), "the other partitions' records wait for a leader"
            assert errors_answered(k) == {}, "the client was sent errors (it should have waited for a leader)"
            # The rest of the cluster comes back: kfan sees it, and the waiting records go through.
            c.broker_up(2)
            c.broker_up(3)
            wait_for("kfan to report brokers 2 and 3 reachable", lambda: reachability(k) == {1: 1, 2: 1, 3: 1}, timeout=15, every=0.2)
            assert producer.flush(30) == 0
            assert reports.failed == {} and reports.ok == set(range(600))
            assert sorted(int(v) for _, _, _, v in read_all(k.bootstrap, topic)) == list(range(600))


# --- the rules behind these tests, on the sans-IO core and the link ----------------------


def test_failed_broker_codes_are_ones_clients_retry() -> None:
    from proxy.core import ROUTES

    def failure_code(api_key: int, written: bool) -> int:
        return ROUTES[api_key].failure.code(written)

    assert failure_code(apis.PRODUCE, written=True) == errors.REQUEST_TIMED_OUT  # maybe written
    assert failure_code(apis.PRODUCE, written=False) == errors.NOT_LEADER_OR_FOLLOWER  # not written
    assert failure_code(apis.FETCH, written=True) == failure_code(apis.FETCH, written=False) == 6
    assert failure_code(apis.DELETE_RECORDS, written=True) == errors.NETWORK_EXCEPTION


def test_metadata_reports_a_partition_whose_leader_is_down_as_leaderless() -> None:
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v12.request import MetadataRequest
    from kio.schema.metadata.v12.response import MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic

    from proxy.core import ANY_BROKER, Context, FoldMetadata, Forward, Identity, Response, plan_request
    from proxy.core.topology import Topology
    from proxy.kafka.headers import response_header
    from tests.support.kio_oracle import kio_decode, kio_encode, request_payload

    def partition(index: int, leader: int, error: ErrorCode = ErrorCode.none) -> MetadataResponsePartition:
        return MetadataResponsePartition(
            error_code=error, partition_index=index, leader_id=leader, leader_epoch=3, replica_nodes=(leader,), isr_nodes=(leader,)
        )  # type: ignore[arg-type]

    # Broker 2 is down: the answer lists brokers 1 and 3 only, yet broker 2 still leads partition 1.
    answer = MetadataResponse(
        throttle_time=datetime.timedelta(0),
        brokers=tuple(MetadataResponseBroker(node_id=b, host=f"b{b}", port=9000 + b) for b in (1, 3)),  # type: ignore[arg-type]
        controller_id=1,  # type: ignore[arg-type]
        topics=(
            MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="t",  # type: ignore[arg-type]
                topic_id=uuid.uuid4(),
                partitions=(partition(0, 1), partition(1, 2), partition(2, 3), partition(3, -1, ErrorCode.leader_not_available)),
            ),
        ),
    )
    ctx = Context(Identity(7, "kfan", 9092), Topology(), {apis.METADATA: (0, 12)})
    plan = plan_request(
        ctx, request_payload(MetadataRequest(topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False))
    )
    assert isinstance(plan, Forward)
    reply = plan.merge(plan, {ANY_BROKER: Response(response_header(apis.METADATA, 12, 1) + kio_encode(answer))})
    out = kio_decode(MetadataResponse, b"".join(bytes(p) for p in reply.body))
    got = [(p.partition_index, p.leader_id, p.error_code) for p in out.topics[0].partitions]
    assert got == [
        (0, 7, ErrorCode.none),
        (1, -1, ErrorCode.leader_not_available),
        (2, 7, ErrorCode.none),
        (3, -1, ErrorCode.leader_not_available),
    ]
    (fold,) = [e for e in reply.effects if isinstance(e, FoldMetadata)]
    assert fold.metadata["topics"][0]["partitions"][1]["leader_id"] == 2, "the topology keeps the truth"


def test_requests_kfan_answers_alone_count_their_errors() -> None:
    from proxy.core import Context, Identity, LocalReply, plan_request
    from proxy.core.topology import Broker, Topology
    from tests.support.kio_oracle import request_payload

    topology = Topology(brokers={1: Broker(1, "b1", 9001)}, leaders={"t": {0: 1, 1: 2, 2: 2}})
    assert topology.absent_leaders() == {2: 2}
    ctx = Context(Identity(7, "kfan", 9092), topology, {apis.PRODUCE: (0, 9)})
    plan = plan_request(ctx, request_payload(produce_request("t", [1, 2], acks=-1)))
    assert isinstance(plan, LocalReply), "nothing routable: kfan answers alone"
    assert plan.errors == {(errors.NOT_LEADER_OR_FOLLOWER, -1): 2}


def test_a_request_that_never_left_kfan_is_not_written() -> None:
    from backends.link import Link, LinkError
    from proxy.core import SubRequest

    # A listener that reads one request whole and hangs up without answering.
    async def hang_up(stream: trio.SocketStream) -> None:
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">i", data[:4])[0]:
            data += await stream.receive_some(65536)
        await stream.aclose()

    async def main() -> tuple[bool, bool]:
        # And a port bound but never listening, for as long as the test runs: connections to it are
        # refused, and nothing else can take it meanwhile.
        with trio.socket.socket() as refusing:
            await refusing.bind(("127.0.0.1", 0))
            async with trio.open_nursery() as nursery:
                (listener,) = await nursery.start(functools.partial(trio.serve_tcp, hang_up, 0, host="127.0.0.1"))
                port = listener.socket.getsockname()[1]
                sub = SubRequest(apis.API_VERSIONS, 0, [b"\x00\x00"], True)
                outcomes = []
                for address in (("127.0.0.1", port), ("127.0.0.1", refusing.getsockname()[1])):  # the second refuses
                    link = Link(1, *address)
                    nursery.start_soon(link.run)
                    pending = link.submit(sub)
                    try:
                        await pending.wait()
                    except LinkError:
                        outcomes.append(pending.written)
                nursery.cancel_scope.cancel()
        return outcomes[0], outcomes[1]

    written, refused = trio.run(main)
    assert written is True, "the broker read it whole before hanging up: maybe acted on"
    assert refused is False, "no connection: never sent"
