"""`kfan replay --master spark://...` on a real standalone Spark cluster whose executors' Python has nothing installed.

A Spark master and one worker (pyspark's own ``spark-class``, in the
foreground, one core and little memory) run beside the test; the executors
run a bare virtual environment (``python -m venv --without-pip``) that cannot
import kfan, kio or anything else kfan needs, only PySpark, which the worker
puts on its path from the Spark distribution. ``kfan replay`` must ship kfan
and its dependencies itself (spark/ship.py: an archive through
``spark.archives``) and write the same report as local mode for the same
capture. Without the Spark cluster, the archive alone is checked: it imports,
and checks an exchange, in that bare Python; it is built once and then reused;
what the probe finds missing is explained with the fix.

Spark needs Java; it is installed with apt when missing (tests/support/apt.py).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from proxy.capture.rows import CaptureRow, read_rows
from proxy.tools.mock_cluster import MockCluster
from spark import ship
from tests.support.apt import ensure_command
from tests.support.kfan import start_kfan
from tests.support.processes import follow_output, stop_process
from tests.support.spark import QUICK_JVM
from tests.support.waiting import wait_for, wait_for_line

KFAN = str(Path(sys.executable).parent / "kfan")
SPARK_HOME = Path(pyspark.__file__).parent  # pip's PySpark is a whole Spark distribution
RECORDS = 120
PARTITIONS = 3
# Deadlines bound a hang on a busy machine; they never judge the time.
START_TIMEOUT_S = 120
REPLAY_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[CaptureRow]]:
    """Produce and fetch through a capturing kfan in front of the 3-broker mock (partitions led by all three)."""
    directory = tmp_path_factory.mktemp("capture-cluster")
    with MockCluster() as cluster:
        topic = f"cluster-{uuid.uuid4().hex[:8]}"
        cluster.create_topic(topic, PARTITIONS, leaders=[1, 2, 3])
        # kfan as one broker (also in a run with KFAN_BROKER_IDS=cluster): the capture holds its splits.
        k = start_kfan(cluster.bootstrap, "--capture", str(directory), "--broker-ids", "kfan")
        try:
            producer = Producer({"bootstrap.servers": k.bootstrap, "linger.ms": 20})
            for i in range(RECORDS):
                producer.produce(topic, key=f"k{i % 11}".encode(), value=f"v{i}".encode())
            assert producer.flush(20) == 0
            # Assigned, not subscribed: no group to join, the fetches are what the test needs.
            consumer = Consumer({"bootstrap.servers": k.bootstrap, "group.id": "unused", "auto.offset.reset": "earliest"})
            consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
            got = [0]

            def all_read() -> bool:
                got[0] += sum(1 for m in consumer.consume(100, timeout=0.5) if m.error() is None)
                return got[0] >= RECORDS

            wait_for(f"the {RECORDS} records read", all_read, 60, seen=lambda: got[0])
            consumer.close()
        finally:
            assert k.stop() == 0
    return directory, read_rows(directory)


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with nothing installed: this interpreter's own base, no site-packages of any environment."""
    venv = tmp_path_factory.mktemp("bare-python")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    for module in ("spark", "proxy", "kio", "crc32c", "trio", "pyspark"):
        found = subprocess.run(
            [str(python), "-c", f"import {module}"], cwd=venv, env=_without_python_path(), capture_output=True, text=True, timeout=60
        )
        assert found.returncode != 0 and "ModuleNotFoundError" in found.stderr, f"the bare Python imports {module}"
    return python


def _without_python_path(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYSPARK_PYTHON")}
    return {**env, **extra}


@dataclass
class SparkCluster:
    url: str
    work: Path  # the worker's directory: one per application, one per executor in it
    master: subprocess.Popen[str]
    worker: subprocess.Popen[str]
    logs: dict[str, list[str]]

    def wait_for_worker(self) -> None:
        """Until the worker has registered with the master: a driver that starts before waits for its executor."""
        wait_for_line(self.logs["worker"], r"Successfully registered with master", START_TIMEOUT_S)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(f"--- {name}:\n" + "".join(log[-lines:]) for name, log in self.logs.items())


def _spark_class(main: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(SPARK_HOME / "bin" / "spark-class"), main, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A standalone master and one worker (1 core, 512 MiB for executors) on 127.0.0.1, in the foreground.

    The master is up when this returns; the worker is still starting, so a replay's driver can start beside it."""
    ensure_command("java", "default-jre-headless")
    base = tmp_path_factory.mktemp("spark-cluster")
    env = _without_python_path(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        # No REST submission server: its fixed port 6066 would clash with another cluster on the machine.
        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        SPARK_LOG_DIR=str(base),
        JAVA_TOOL_OPTIONS=QUICK_JVM,
    )
    # Port 0 everywhere, the master's read back from its log: no port chosen here can be taken meanwhile.
    master = _spark_class(
        "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0", cwd=base, env=env
    )
    master_log, started = follow_output(master, r"Starting Spark master at (spark://\S+)", START_TIMEOUT_S)
    worker = None
    try:
        assert started is not None, "the Spark master did not start:\n" + "".join(master_log[-40:])
        url = started.group(1)
        wait_for_line(master_log, r"New state: ALIVE", START_TIMEOUT_S)
        worker = _spark_class(
            "org.apache.spark.deploy.worker.Worker",
            url,
            *("--host", "127.0.0.1", "--webui-port", "0", "--cores", "1", "--memory", "512m"),
            *("--work-dir", str(base / "work")),
            cwd=base,
            env=env,
        )
        # Not waited for here: the replay's driver starts meanwhile (SparkCluster.wait_for_worker).
        worker_log, _ = follow_output(worker, "", 0)
        yield SparkCluster(url, base / "work", master, worker, {"master": master_log, "worker": worker_log})
    finally:
        # The worker first: it takes its executors down with it.
        if worker is not None:
            stop_process(worker, 30)
        stop_process(master, 30)


@dataclass
class Replay:
    """A `kfan replay` running in the background; its output goes to files, so no pipe fills while the test waits elsewhere."""

    process: subprocess.Popen[bytes]
    report: Path

    def finish(self) -> tuple[int, str]:
        """Its exit status and output (stdout, then stderr's tail), once it has ended."""
        try:
            status = self.process.wait(REPLAY_TIMEOUT_S)
        finally:
            stop_process(self.process, 10)
        out = Path(f"{self.report}.stdout").read_text() + Path(f"{self.report}.stderr").read_text()[-4000:]
        return status, out


def kfan_replay(capture: Path, report: Path, *args: str, env: dict[str, str]) -> Replay:
    with Path(f"{report}.stdout").open("wb") as out, Path(f"{report}.stderr").open("wb") as err:
        process = subprocess.Popen([KFAN, "replay", str(capture), "--report", str(report), *args], stdout=out, stderr=err, env=env)
    return Replay(process, report)


@pytest.fixture(scope="module")
def local_replay(capture: tuple[Path, list[CaptureRow]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replay]:
    """The local-mode report of the capture, to compare with: started before the cluster, it runs while the cluster starts."""
    replay = kfan_replay(
        capture[0], tmp_path_factory.mktemp("local-replay") / "report", env=_without_python_path(JAVA_TOOL_OPTIONS=QUICK_JVM)
    )
    yield replay
    stop_process(replay.process, 10)


def test_replay_on_a_cluster_ships_kfan_and_reports_as_local_mode(
    capture: tuple[Path, list[CaptureRow]],
    local_replay: Replay,
    bare_python: Path,
    spark_cluster: SparkCluster,
    tmp_path: Path,
) -> None:
    directory, rows = capture
    assert rows and any(len(r.subrequests) > 1 for r in rows), "the capture must hold fanned-out exchanges to check"
    env = _without_python_path(
        SPARK_LOCAL_IP="127.0.0.1",
        # The executors' Python: the bare one. The worker offers 512 MiB; Spark asks 1 GiB per executor by default.
        PYSPARK_PYTHON=str(bare_python),
        SPARK_EXECUTOR_MEMORY="512m",
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        JAVA_TOOL_OPTIONS=QUICK_JVM,
    )
    started = time.monotonic()
    remote = kfan_replay(directory, tmp_path / "cluster", "--master", spark_cluster.url, env=env)
    try:
        spark_cluster.wait_for_worker()
    except BaseException:
        stop_process(remote.process, 10)  # it would wait for an executor until its deadline
        raise
    status, out = remote.finish()
    print(f"the cluster replay took {time.monotonic() - started:.1f} s")
    assert status == 0, out + spark_cluster.log_tail()
    status, out = local_replay.finish()
    assert status == 0, out
    cluster_report = json.loads((tmp_path / "cluster.json").read_text())
    assert cluster_report["exchanges"] == len(rows) > 0 and cluster_report["regressions"] == 0
    assert cluster_report == json.loads(Path(f"{local_replay.report}.json").read_text())
    # The executor imported kfan from the archive built for it, unpacked in its working directory.
    assert len(list((tmp_path / "cache" / "kfan" / "spark").glob("kfan-executors-*.tar.gz"))) == 1
    assert list(spark_cluster.work.glob(f"app-*/*/{ship.ENV_DIR}/spark/checks.py")), "no executor unpacked the archive"


# --- the archive and the messages, without a cluster ------------------------------------------

CHECK_IN_BARE_PYTHON = """
import json, pickle, sys
from proxy.capture.rows import CaptureRow
from spark.checks import check_exchange
import spark.replay  # what the executors unpickle the job's function from
results = [check_exchange(CaptureRow.from_dict(d)) for d in pickle.load(open(sys.argv[1], "rb"))]
print(json.dumps([[r.api_key, r.fanout, [[f.check, f.detail] for f in r.findings + r.peer_findings]] for r in results]))
"""


def test_the_archive_alone_checks_exchanges_in_a_python_without_kfan(
    capture: tuple[Path, list[CaptureRow]], bare_python: Path, tmp_path: Path
) -> None:
    """What an executor does with the archive, without Spark: unpacked, on PYTHONPATH, in the bare Python."""
    from spark.checks import check_exchange

    _, rows = capture
    archive, contents, compiled = ship.build_archive(tmp_path / "cache")
    shipped = {c.split()[0] for c in contents.split(", ")}
    assert {"kio", "crc32c"} <= shipped, contents
    # The rows come without the recorder: nothing of serving's trio side goes to the executors.
    assert not shipped & {"trio", "prometheus_client"}, contents
    assert any(name.startswith("crc32c/") for name in compiled), compiled
    unpacked = tmp_path / ship.ENV_DIR
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (tmp_path / "rows.pickle").write_bytes(pickle.dumps([r.to_dict() for r in rows]))
    out = subprocess.run(
        [str(bare_python), "-c", CHECK_IN_BARE_PYTHON, str(tmp_path / "rows.pickle")],
        cwd=tmp_path,
        env=_without_python_path(PYTHONPATH=ship.ENV_DIR),  # relative, as spark.executorEnv.PYTHONPATH gives it
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    here = [check_exchange(r) for r in rows]
    assert json.loads(out.stdout) == [[r.api_key, r.fanout, [[f.check, f.detail] for f in r.findings + r.peer_findings]] for r in here]


def test_the_archive_is_built_once_for_the_same_code_and_again_when_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkout = tmp_path / "checkout"
    for package in ship.KFAN_PACKAGES:
        shutil.copytree(ship.ROOT / package, checkout / package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(ship, "ROOT", checkout)
    first, _, _ = ship.build_archive(tmp_path / "cache")
    built = first.stat().st_mtime_ns
    again, _, _ = ship.build_archive(tmp_path / "cache")
    assert again == first and again.stat().st_mtime_ns == built, "the cached archive is shipped, not rebuilt"
    with (checkout / "spark" / "checks.py").open("a") as f:
        f.write("\n# changed\n")
    changed, _, _ = ship.build_archive(tmp_path / "cache")
    assert changed != first and changed.exists()
    with tarfile.open(changed) as tar:
        assert tar.extractfile("spark/checks.py").read().endswith(b"# changed\n")  # type: ignore[union-attr]


def test_shipping_options(tmp_path: Path) -> None:
    assert ship.prepare("none").conf == {}
    with pytest.raises(ship.ShippingError, match="no such file"):
        ship.prepare("/nonexistent/kfan.tar.gz")
    with pytest.raises(ship.ShippingError, match="unpacks only"):
        ship.prepare("hdfs://namenode/kfan.whl#env")
    prebuilt = tmp_path / "env.tgz"
    prebuilt.write_bytes(b"")
    named = ship.prepare(f"{prebuilt}#env")  # the fragment names the directory, and so the PYTHONPATH
    assert named.conf == {"spark.archives": f"{prebuilt}#env", "spark.executorEnv.PYTHONPATH": "env"}
    given = ship.prepare("hdfs://namenode/envs/kfan.tar.gz", {"spark.archives": "other.zip#other", "spark.executorEnv.PYTHONPATH": "other"})
    assert given.conf == {
        "spark.archives": "other.zip#other,hdfs://namenode/envs/kfan.tar.gz#kfan_env",
        "spark.executorEnv.PYTHONPATH": f"kfan_env{os.pathsep}other",
    }
    with pytest.raises(ship.ShippingError, match=r"no-such-kfan-dependency \(required by kfan\) is not installed.*--spark-archive"):
        ship.executor_distributions(["no-such-kfan-dependency"])


def test_what_the_executors_miss_is_named_with_the_fix() -> None:
    missing = {
        "spark.replay": "ModuleNotFoundError: No module named 'spark'",
        "spark.checks": "ModuleNotFoundError: No module named 'spark'",
    }
    probe = {"host": "w1", "python": "/usr/bin/python3", "version": "3.11.2", "soabi": sysconfig.get_config_var("SOABI"), "errors": missing}
    told = ship.explain([probe, probe], ship.Shipment("none"))
    assert "spark.replay, spark.checks: ModuleNotFoundError: No module named 'spark' (on w1, Python 3.11.2 at /usr/bin/python3)" in told
    assert told.count("No module named") == 1 and "pip install kfan" in told and "leave out --spark-archive none" in told
    shipped = ship.Shipment("auto", {"spark.archives": "/c/k.tar.gz#kfan_env"}, "kfan (proxy, spark), crc32c 2.9", ("crc32c/_crc32c.so",))
    other = {**probe, "version": "3.12.1", "soabi": "cpython-312-x86_64-linux-gnu", "errors": {"spark.checks": "ImportError: crc32c"}}
    told = ship.explain([other], shipped)
    assert "crc32c/_crc32c.so" in told and "cpython-312-x86_64-linux-gnu" in told and "PYSPARK_PYTHON" in told and "--platform" in told
    assert "spark.archives=/c/k.tar.gz#kfan_env" in told
    failure = (
        "An error occurred while calling o42.collectAndServe.\n: org.apache.spark.SparkException: Job aborted due to stage failure: ...\n"
        "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n  File ...\n"
        "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different version (3, 12)\n"
        "\tat org.apache.spark.api.python.BasePythonRunner...\n"
    )
    assert ship.first_error(failure).startswith("pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH]")
    assert "Cannot run program" in ship.first_error(
        'java.io.IOException: Cannot run program "/no/python": error=2, No such file or directory'
    )
