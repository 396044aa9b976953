"""Replay of captured traffic: the Spark job, the live replay and the tcpdump import.

Real client traffic (produce, consume in a group with commits; confluent-kafka
and kafka-python) goes through kfan in front of the 3-broker mock, and admin
calls (which the mock lacks) through kfan in front of Tansu, both with
``--capture`` into one directory. Then:

- ``kfan replay DIR --report OUT`` (PySpark, local mode) finds no regression
  and writes the JSON and HTML report; the capture also holds transactions
  produced and read back through kfan in front of the mock, which writes its
  transaction markers with a CRC that does not match: the job names them as
  corrupt batches from that broker, a finding of their own, not as kfan
  regressions (the checks judge every record batch both ways, as kfan
  judges a Produce's);
- each deliberately broken core (a split that drops a partition, a double
  size prefix, swapped responses: tests/support/broken_cores.py) is caught by
  the checks the job runs on every exchange, only where the break really
  applies; and the Spark job with one of them (tests/support/broken_replay.py)
  exits non-zero and names those exchanges (one Spark job, not three: each
  takes half a minute, and the job treats every kind of finding alike);
- ``kfan replay DIR --target`` against a running kfan gets the same answers
  (read-only requests), and against a kfan in front of a cluster without the
  topic reports the differences;
- the same traffic recorded with tcpdump directly between clients and
  brokers, imported with ``kfan capture import``, passes the job's checks (run
  without Spark: the job itself is tested above on kfan's own capture).

Spark needs Java; it is installed with apt when missing (tests/support/apt.py), as is tcpdump.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dpkt
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from proxy.capture.rows import CaptureRow, read_rows
from proxy.tools.mock_cluster import MockCluster
from proxy.tools.pcap import _packets as pcap_packets
from spark.checks import check_exchange
from tests.support import ROOT
from tests.support.apt import ensure_command
from tests.support.broken_cores import BROKEN_CORES
from tests.support.kfan import start_kfan
from tests.support.processes import follow_output
from tests.support.spark import quick_jvm_env
from tests.support.tansu import Tansu
from tests.support.waiting import wait_for, wait_for_line

KFAN = str(Path(sys.executable).parent / "kfan")
RECORDS = 300
KP_RECORDS = 60
TRANSACTIONS = 3
_REGRESSED = re.compile(r"regressed: api_key (\d+) v(\d+) (\S+)#(-?\d+):")


def traffic(bootstrap: str, topic: str, kafka_python: bool = True) -> None:
    """Produce, consume in a group and commit, with two client libraries (kafka-python
    cannot talk to the mock directly: its ApiVersions v3+ answer is malformed)."""
    kp_records = KP_RECORDS if kafka_python else 0
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "enable.idempotence": True})
    for i in range(RECORDS):
        producer.produce(topic, key=f"k{i % 17}".encode(), value=f"v{i}".encode())
    assert producer.flush(20) == 0
    # librdkafka sends one partition per Produce; kafka-python batches partitions per broker.
    if kafka_python:
        kp_producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50)
        for i in range(kp_records):
            kp_producer.send(topic, key=f"k{i % 17}".encode(), value=f"kp{i}".encode())
        kp_producer.flush(20)
        kp_producer.close()
    group = f"replay-{uuid.uuid4().hex[:8]}"
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = [0]

    def all_read() -> bool:
        got[0] += sum(1 for m in consumer.consume(200, timeout=0.5) if m.error() is None)
        return got[0] >= RECORDS + kp_records

    wait_for(f"the {RECORDS + kp_records} records consumed", all_read, 60, seen=lambda: got[0])
    assert got[0] == RECORDS + kp_records
    consumer.commit(asynchronous=False)
    consumer.close()
    if not kafka_python:
        return
    kp = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    kp.assign([TopicPartition(topic, p) for p in range(6)])
    # Its first polls may come back empty while it looks up the partitions' leaders and offsets.
    wait_for("kafka-python to read records", lambda: sum(len(v) for v in kp.poll(timeout_ms=1000, max_records=RECORDS).values()), 30)
    kp.end_offsets([TopicPartition(topic, p) for p in range(6)])
    kp.close()


def admin_traffic(bootstrap: str) -> None:
    """The admin calls operators make (the mock lacks these APIs; this runs against Tansu)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = f"replay-admin-{uuid.uuid4().hex[:8]}"
    for f in admin.create_topics([NewTopic(topic, 3, 1)], operation_timeout=10).values():
        f.result(20)
    for f in admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values():
        f.result(20)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"x")
    assert producer.flush(20) == 0
    group = f"replay-admin-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    wait_for("the admin topic's record consumed", lambda: any(m.error() is None for m in consumer.consume(10, timeout=0.5)), 60)
    consumer.commit(asynchronous=False)
    consumer.close()
    admin.list_consumer_groups().result(20)
    admin.describe_consumer_groups([group])[group].result(20)
    for f in admin.delete_topics([topic], operation_timeout=10).values():
        f.result(20)


def transactions(cluster: MockCluster, bootstrap: str) -> None:
    """Transactions produced and read back (read_committed) on a topic of their own."""
    topic = f"txn-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 2, leaders=[1, 2])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(20)
    for t in range(TRANSACTIONS):
        producer.begin_transaction()
        for i in range(4):
            producer.produce(topic, value=f"t{t}-{i}".encode(), partition=i % 2)
        producer.commit_transaction(20)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    got = [0]

    def all_committed_read() -> bool:
        got[0] += sum(1 for m in consumer.consume(50, timeout=0.5) if m.error() is None)
        return got[0] >= TRANSACTIONS * 4

    wait_for(f"the {TRANSACTIONS * 4} committed records read", all_committed_read, 60, seen=lambda: got[0])
    consumer.consume(50, timeout=1.0)  # past the last marker
    consumer.close()
    assert got[0] == TRANSACTIONS * 4


@dataclass
class Captured:
    cluster: MockCluster
    topic: str
    directory: Path  # every capture file: the mock's (both runs) and Tansu's
    mock_directory: Path  # the mock's first run only (live replay goes to kfan in front of the same mock)
    rows: list[CaptureRow]
    mock_rows: list[CaptureRow]
    transaction_rows: list[CaptureRow]


ONE_BROKER = ("--broker-ids", "kfan")


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory, tansu: Tansu) -> Iterator[Captured]:
    """kfan in front of the 3-broker mock, and kfan in front of Tansu for the admin calls, both capturing."""
    on_tansu, on_mock, on_txn, everything = (
        tmp_path_factory.mktemp(n) for n in ("capture-tansu", "capture-mock", "capture-transactions", "capture")
    )
    k = start_kfan(tansu.bootstrap, "--capture", str(on_tansu))
    admin_traffic(k.bootstrap)
    assert k.stop() == 0
    with MockCluster() as cluster:
        topic = f"replay-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 6, leaders=[1, 2, 3, 1, 2, 3])
        # kfan as one broker (also in a run with KFAN_BROKER_IDS=cluster): the clients' requests reach it whole,
        # and the capture holds the splits the job checks.
        k = start_kfan(cluster.bootstrap, "--capture", str(on_mock), *ONE_BROKER)
        traffic(k.bootstrap, topic)
        assert k.stop() == 0
        k = start_kfan(cluster.bootstrap, "--capture", str(on_txn), *ONE_BROKER)
        transactions(cluster, k.bootstrap)
        assert k.stop() == 0
        for f in [*on_tansu.glob("*.parquet"), *on_mock.glob("*.parquet"), *on_txn.glob("*.parquet")]:
            shutil.copy(f, everything / f.name)
        yield Captured(cluster, topic, everything, on_mock, read_rows(everything), read_rows(on_mock), read_rows(on_txn))


@pytest.fixture(scope="module")
def java() -> str:
    return ensure_command("java", "default-jre-headless")


# Spark in local mode takes minutes on a busy machine: the deadline bounds a hang, never judges the time.
SPARK_TIMEOUT_S = 1200


def kfan_replay(*args: str, timeout: float = SPARK_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KFAN, "replay", *args], capture_output=True, text=True, timeout=timeout, env=quick_jvm_env())


def broken_replay(broken: str, *args: str, timeout: float = SPARK_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`kfan replay ARGS` with a deliberately broken core (tests/support/broken_cores.py)."""
    command = [sys.executable, "-m", "tests.support.broken_replay", broken, *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=quick_jvm_env())


def test_capture_holds_every_kind_of_traffic(captured: Captured) -> None:
    keys = {r.api_key for r in captured.rows}
    # Produce, Fetch, ListOffsets, Metadata, OffsetCommit, OffsetFetch, FindCoordinator,
    # JoinGroup, SyncGroup, ListGroups, DescribeGroups or ConsumerGroupDescribe, CreateTopics, DeleteTopics, InitProducerId, DescribeConfigs.
    assert {0, 1, 2, 3, 8, 9, 10, 11, 14, 16, 19, 20, 22, 32} <= keys and keys & {15, 69}, sorted(keys)
    assert any(len(r.subrequests) == 3 for r in captured.rows if r.api_key == 0), "no Produce fanned out to all three brokers"


def test_spark_replay_of_real_traffic_finds_no_regression(captured: Captured, java: str, tmp_path: Path) -> None:
    out = kfan_replay(str(captured.directory), "--report", str(tmp_path / "report"))
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["exchanges"] == len(captured.rows)
    assert report["regressions"] == 0
    per_api = {(a["api_key"], a["api_version"]): a for a in report["apis"]}
    assert sum(a["exchanges"] for a in per_api.values()) == len(captured.rows)
    produce = [a for (k, _), a in per_api.items() if k == 0]
    assert produce and all(a["latency_ms"]["p50"] is not None and a["latency_ms"]["p50"] >= 0 for a in produce)
    assert {f["width"] for f in report["fanout"] if f["api_key"] == 0} >= {3}
    assert sum(b["count"] for b in report["latency_histogram_ms"]) == len(captured.rows)
    html = (tmp_path / "report.html").read_text()
    assert "kfan replay: no regressions" in html and html.count("<svg") == 2
    # The mock's transaction markers: reported apart, and they do not make the job fail (only regressions do).
    peers = report["peer_findings"]
    assert peers["exchanges"] >= 1
    details = [d for e in peers["examples"] for check, d in e["findings"] if check == "corrupt batch from broker"]
    assert details and all(d.endswith(": crc") for d in details), peers
    assert "corrupt batch from broker: broker " in out.stdout, out.stdout
    assert "Corrupt batches from clients or brokers (not kfan regressions)" in html


def test_the_checks_name_the_brokers_corrupt_markers_and_no_regression(captured: Captured) -> None:
    rows = captured.transaction_rows
    results = [check_exchange(row) for row in rows]
    peer = [f for r in results for f in r.peer_findings]
    assert peer, "the mock's transaction markers carry a wrong CRC: the checks must name them"
    assert all(f.check == "corrupt batch from broker" and f.detail.endswith(": crc") and "broker " in f.detail for f in peer), peer
    assert not [f for r in results for f in r.findings if "corrupt" in f.check], "corrupt peer batches are not kfan regressions"
    assert all(not r.peer_findings for r, row in zip(results, rows, strict=True) if row.api_key == 0), "the client's batches are sound"


EXPECTED_KIND = {"drop-partition": "split", "double-prefix": "one size prefix", "swap-responses": "merge"}


def _may_regress(row: CaptureRow, broken: str) -> bool:
    """Only exchanges the break can affect: partition-keyed ones, with a response to compare; swapping needs two brokers' answers."""
    if row.api_key not in (0, 1, 2, 21, 23, 61) or row.response is None:
        return False
    return broken != "swap-responses" or len(row.subrequests) > 1


@pytest.mark.parametrize("broken", sorted(EXPECTED_KIND))
def test_the_checks_catch_each_broken_core_where_it_breaks(captured: Captured, broken: str) -> None:
    """Each break, through the checks the Spark job runs on every exchange (without Spark: the job itself is below)."""
    core = BROKEN_CORES[broken]
    flagged = [(row, result) for row in captured.rows if (result := check_exchange(row, core)).findings]
    assert flagged, f"{broken}: no exchange flagged"
    assert all(_may_regress(row, broken) for row, _ in flagged), [(r.api_key, res.findings) for r, res in flagged]
    assert EXPECTED_KIND[broken] in {f.check for _, result in flagged for f in result.findings}
    assert not [r for r in captured.rows if check_exchange(r).findings], "the real core regresses nowhere"


def test_a_broken_core_makes_the_job_fail_and_name_the_exchanges(captured: Captured, java: str, tmp_path: Path) -> None:
    """The Spark job with one broken core (the checks catch the others the same way, above): it fails and names them."""
    broken = "swap-responses"
    out = broken_replay(broken, str(captured.directory), "--report", str(tmp_path / "report"))
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["regressions"] > 0
    named = _REGRESSED.findall(out.stdout)
    assert named, out.stdout
    rows = {(r.conn_id, r.correlation_id): r for r in captured.rows}
    for key, version, conn, cid in named:
        row = rows[(conn, int(cid))]
        assert (row.api_key, row.api_version) == (int(key), int(version))
        assert _may_regress(row, broken)
    kinds = {f[0] for a in report["apis"] for e in a["examples"] for f in e["findings"]}
    assert EXPECTED_KIND[broken] in kinds, kinds


def test_live_replay_gets_the_same_answers_from_a_running_kfan(captured: Captured) -> None:
    k = start_kfan(captured.cluster.bootstrap)
    try:
        out = kfan_replay(str(captured.mock_directory), "--target", k.bootstrap, "--apis", "read-only")
    finally:
        k.stop()
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    sent = int(re.search(r"(\d+) requests sent", out.stdout).group(1))  # type: ignore[union-attr]
    assert sent >= sum(1 for r in captured.mock_rows if r.api_key in (1, 3)), out.stdout
    assert "0 answers differ" in out.stdout


def test_live_replay_reports_answers_that_changed(captured: Captured) -> None:
    with MockCluster() as other:  # the topic does not exist there
        k = start_kfan(other.bootstrap)
        try:
            out = kfan_replay(str(captured.mock_directory), "--target", k.bootstrap, "--apis", "read-only")
        finally:
            k.stop()
    assert out.returncode == 1, out.stdout + out.stderr[-3000:]
    assert "differs: " in out.stdout and "error_code" in out.stdout, out.stdout


def test_tcpdump_of_direct_traffic_imports_and_replays_cleanly(captured: Captured, tmp_path: Path) -> None:
    tcpdump = ensure_command("tcpdump", "tcpdump")
    cluster = captured.cluster
    ports = [int(a.rsplit(":", 1)[1]) for a in cluster.bootstrap.split(",")]
    topic = f"direct-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 6, leaders=[1, 2, 3, 1, 2, 3])
    pcap = tmp_path / "direct.pcap"
    dump = subprocess.Popen(
        [tcpdump, "-i", "lo", "-U", "-s", "0", "-w", str(pcap), " or ".join(f"tcp port {p}" for p in ports)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # tcpdump says it is listening once its filter is attached and its file open: packets from then on are kept.
    said, listening = follow_output(dump, r"listening on lo", 30)
    try:
        assert listening is not None, "tcpdump did not start:\n" + "".join(said)
        traffic(cluster.bootstrap, topic, kafka_python=False)
        # A last connection to a broker, after all of the traffic: once tcpdump has written one of its
        # packets to the file, it has written every packet of the traffic before it (-U: as it goes).
        with socket.socket() as marker:
            marker.bind(("127.0.0.1", 0))
            marker.connect(("127.0.0.1", ports[0]))
            marker_port = marker.getsockname()[1]
        wait_for("tcpdump to write the packets of the traffic", lambda: _holds_packet_from(pcap, marker_port), 30)
    finally:
        dump.send_signal(signal.SIGINT)
        dump.wait(10)
    # The thread copying tcpdump's output may still be behind when it has exited.
    wait_for_line(said, r"packets dropped by kernel")
    assert re.search(r"^0 packets dropped by kernel", "".join(said), re.M), "".join(said)
    out_dir = tmp_path / "imported"
    imported = subprocess.run(
        [KFAN, "capture", "import", str(pcap), *[a for p in ports for a in ("--port", str(p))], "--out", str(out_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr
    rows = read_rows(out_dir)
    produce = [r for r in rows if r.api_key == 0]
    fetch = [r for r in rows if r.api_key == 1 and r.response is not None]
    assert produce and fetch, sorted({r.api_key for r in rows})
    assert {r.subrequests[0][0] for r in produce} == {1, 2, 3}, "produce requests go to every leader directly"
    # Through the checks the Spark job runs on every exchange (the job itself is above: it adds nothing here
    # but the 25 s of starting Spark).
    flagged = [(r.api_key, f) for r in rows if (f := check_exchange(r).findings)]
    assert not flagged, flagged[:5]


def _holds_packet_from(pcap: Path, port: int) -> bool:
    """Whether the capture file (still being written) holds a packet sent from local port ``port``."""
    try:
        with pcap.open("rb") as f:
            return any(source[1] == port for _, source, _, _, _, _ in pcap_packets(f))
    except (OSError, ValueError, dpkt.Error):  # not there yet, or its last packet half written
        return False


def test_double_prefix_is_told_from_a_correlation_id_equal_to_the_length() -> None:
    """A 10-byte Heartbeat v3 answer to correlation id 6 starts with 6 = its length - 4: not a double prefix."""
    from proxy.kafka.frames import frame
    from spark.checks import double_prefix

    answer = struct.pack(">iih", 6, 0, 0)
    assert not double_prefix(answer, 12, 3, response_to=6)
    assert double_prefix(frame([answer]), 12, 3, response_to=6)
    request = struct.pack(">hhi", 12, 3, 10) + b"\x00\x01c" + b"group-1234"
    assert not double_prefix(request, 12, 3)
    assert double_prefix(frame([request]), 12, 3)


def test_live_replay_refuses_an_answer_whose_size_is_out_of_bounds() -> None:
    """The target's answers are cut by the one frame reader: a 2 GiB size prefix is
    refused at once, not awaited (and buffered) byte by byte."""
    import socket
    import threading

    from proxy.kafka import apis
    from proxy.tools.live_replay import replay_live
    from tests.support.messages import request_bytes

    listener = socket.create_server(("127.0.0.1", 0))

    def babbling_target() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(struct.pack(">i", 0x7FFFFFFF) + b"\x00\x00\x00\x05")
            conn.recv(1)  # hold the connection open until the replay gives up on it

    threading.Thread(target=babbling_target, daemon=True).start()
    row = CaptureRow(
        ts_start=0,
        ts_end=0,
        conn_id="c1",
        api_key=apis.METADATA,
        api_version=12,
        correlation_id=5,
        request=request_bytes(apis.METADATA, 12, {"topics": None}, correlation_id=5),
        response=b"\x00\x00\x00\x05\x00",
    )
    started = time.monotonic()
    report = replay_live([row], listener.getsockname(), timeout=20)
    listener.close()
    # Refused for its size: awaiting the bytes would have ended in the 20 s timeout instead, a
    # different detail. How long it took is only reported.
    assert [m.detail for m in report.mismatches][0].startswith("no answer: frame size 2147483647 outside")
    print(f"the out-of-bounds answer was refused after {time.monotonic() - started:.2f} s")
