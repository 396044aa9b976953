"""The replay checks every captured record batch, both ways, as kfan checks a Produce's.

The embedded broker (librdkafka's mock) writes its transaction markers with a
CRC that does not match: a capture of transactional traffic through kfan
holds Fetch answers carrying them. The replay names them as corrupt batches
from that broker, a finding of their own, and not as kfan regressions.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from proxy.capture.rows import CaptureRow, read_rows
from proxy.tools.mock_cluster import MockCluster
from spark.checks import check_exchange
from tests.support.apt import ensure_command
from tests.support.kfan import start_kfan
from tests.support.spark import quick_jvm_env
from tests.support.waiting import wait_for

KFAN = str(Path(sys.executable).parent / "kfan")
TRANSACTIONS = 3


@pytest.fixture(scope="module")
def transactional_capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CaptureRow]]:
    """Transactions produced and read back (read_committed) through a capturing kfan in front of the mock."""
    directory = tmp_path_factory.mktemp("capture-transactions")
    with MockCluster() as cluster:
        topic = f"txn-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, 2, leaders=[1, 2])
        k = start_kfan(cluster.bootstrap, "--capture", str(directory))
        try:
            producer = Producer({"bootstrap.servers": k.bootstrap, "transactional.id": f"tx-{uuid.uuid4().hex[:6]}"})
            producer.init_transactions(20)
            for t in range(TRANSACTIONS):
                producer.begin_transaction()
                for i in range(4):
                    producer.produce(topic, value=f"t{t}-{i}".encode(), partition=i % 2)
                producer.commit_transaction(20)
            consumer = Consumer(
                {"bootstrap.servers": k.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"}
            )
            consumer.subscribe([topic])
            got = [0]

            def all_committed_read() -> bool:
                got[0] += sum(1 for m in consumer.consume(50, timeout=0.5) if m.error() is None)
                return got[0] >= TRANSACTIONS * 4

            wait_for(f"the {TRANSACTIONS * 4} committed records read", all_committed_read, 60, seen=lambda: got[0])
            consumer.consume(50, timeout=1.0)  # past the last marker
            consumer.close()
            assert got[0] == TRANSACTIONS * 4
        finally:
            assert k.stop() == 0
    return directory, read_rows(directory)


def test_the_checks_name_the_brokers_corrupt_markers_and_no_regression(transactional_capture: tuple[Path, list[CaptureRow]]) -> None:
    _, rows = transactional_capture
    results = [check_exchange(row) for row in rows]
    peer = [f for r in results for f in r.peer_findings]
    assert peer, "the mock's transaction markers carry a wrong CRC: the checks must name them"
    assert all(f.check == "corrupt batch from broker" and f.detail.endswith(": crc") and "broker " in f.detail for f in peer), peer
    assert not [f for r in results for f in r.findings if "corrupt" in f.check], "corrupt peer batches are not kfan regressions"
    assert all(not r.peer_findings for r, row in zip(results, rows, strict=True) if row.api_key == 0), "the client's batches are sound"


def test_spark_replay_reports_corrupt_batches_apart_from_regressions(
    transactional_capture: tuple[Path, list[CaptureRow]], tmp_path: Path
) -> None:
    ensure_command("java", "default-jre-headless")
    directory, rows = transactional_capture
    copy = tmp_path / "capture"
    shutil.copytree(directory, copy)
    # Spark in local mode takes minutes on a busy machine: the deadline bounds a hang, never judges the time.
    out = subprocess.run(
        [KFAN, "replay", str(copy), "--report", str(tmp_path / "report")], capture_output=True, text=True, timeout=1200, env=quick_jvm_env()
    )
    report = json.loads((tmp_path / "report.json").read_text())
    peers = report["peer_findings"]
    assert peers["exchanges"] >= 1
    details = [d for e in peers["examples"] for check, d in e["findings"] if check == "corrupt batch from broker"]
    assert details and all(d.endswith(": crc") for d in details), peers
    assert "corrupt batch from broker: broker " in out.stdout, out.stdout
    assert "Corrupt batches from clients or brokers (not kfan regressions)" in (tmp_path / "report.html").read_text()
    # They do not make the job fail: only kfan's own regressions do.
    assert report["regressions"] == 0 and out.returncode == 0, out.stdout + out.stderr[-3000:]
