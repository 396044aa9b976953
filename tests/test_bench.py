"""`kfan bench` end to end, in a short mode: the report is complete and consistent (never how fast anything was).

Each case runs the command as its users do, a child process, against one
kind of brokers: the embedded cluster (no arguments), the embedded cluster
run alone by `kfan cluster` (no CreateTopics: the brokers auto-create the
topic), Tansu (a real single broker; `--json`) and Apache Kafka's three brokers. The checks: every figure
of the table is there and matches the JSON line, every number is finite and
positive where it must be, ratios are kfan / direct and overheads kfan -
direct (within the rounding), "one core carries" is 1000 / CPU ms per MB.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from proxy.tools.bench.report import MBPS_DIGITS, RATIO_DIGITS
from tests.support import ROOT
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.tools import run_tool
from tests.support.processes import follow_output, stop_process
from tests.support.tansu import Tansu

# Small counts: seconds per case. The throughput phases still take two rounds or more (the paths swap),
# and every record is read back. 40 MB per path: kfan's CPU time, counted in clock ticks (10 ms),
# must come to several ticks in each of produce and consume, or its figures would be 0.
RECORDS = 40_000
# --duration caps each path's produce and consume time: generous, so that every record moves on a
# machine however busy (the checks want all of them: a figure, never how fast it was).
DURATION_S = 300
SHORT = ["--records", str(RECORDS), "--latency-records", "30", "--slow-fetch-records", "40", "--duration", str(DURATION_S)]
TIMEOUT_S = 900  # bounds a hang only

PATH_FIGURES = ["produce_mbps", "consume_mbps", "latency_p50_ms", "latency_p99_ms"]
SLOW_FIGURES = ["slow_fetch_p50_ms", "slow_fetch_p99_ms"]
SIZING = ["kfan_cpu_ms_per_mb_produce", "kfan_cpu_ms_per_mb_consume", "one_core_produce_mbps", "one_core_consume_mbps"]
TABLE_ROWS = {
    "produce throughput, MB/s": ("produce_mbps", "produce_ratio", 2),
    "consume throughput, MB/s": ("consume_mbps", "consume_ratio", 2),
    "produce latency p50, ms": ("latency_p50_ms", "latency_p50_overhead_ms", 3),
    "produce latency p99, ms": ("latency_p99_ms", "latency_p99_overhead_ms", 3),
    "slow-broker fetch p50, ms": ("slow_fetch_p50_ms", "slow_fetch_p50_overhead_ms", 3),
    "slow-broker fetch p99, ms": ("slow_fetch_p99_ms", "slow_fetch_p99_overhead_ms", 3),
}


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "bench", *SHORT, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=TIMEOUT_S,
    )


def json_line(stdout: str) -> dict[str, Any]:
    last = stdout.strip().splitlines()[-1]
    result = json.loads(last)
    assert isinstance(result, dict)
    return result


def check_figures(r: dict[str, Any], kind: str, slow_fetch: bool, partitions: int | None = 24) -> None:
    assert r["bootstrap_kind"] == kind
    assert r["record_size"] == 1024 and r["records"] == RECORDS and r["acks"] == "all" and r["latency_records"] == 30
    if partitions is not None:
        assert r["partitions"] == partitions
    assert r["partitions"] >= 1 and r["rounds"] >= 2
    # Nothing hit the --duration cap: every record was produced and read back, on both paths.
    for kind_ in ("produce", "consume"):
        assert r[f"{kind_}_records_direct"] == r[f"{kind_}_records_kfan"] == RECORDS
    for figure in PATH_FIGURES + (SLOW_FIGURES if slow_fetch else []):
        for path in ("direct", "kfan"):
            value = r[f"{figure}_{path}"]
            assert isinstance(value, float) and math.isfinite(value) and value > 0, (figure, path, value)
    for figure in SLOW_FIGURES if not slow_fetch else []:
        assert r[f"{figure}_direct"] is None and r[f"{figure}_kfan"] is None
        assert r[figure.replace("_ms", "_overhead_ms")] is None
    for key in SIZING:
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, (key, r[key])
    # Derived figures: from unrounded values, each rounded once; checked against the rounded ones.
    for kind_ in ("produce", "consume"):
        direct, kfan = r[f"{kind_}_mbps_direct"], r[f"{kind_}_mbps_kfan"]
        # Each rate is off by up to half its last digit: at 2 MB/s that alone moves the ratio by 0.5%.
        half = 0.5 * 10.0**-MBPS_DIGITS
        slack = 0.5 * 10.0**-RATIO_DIGITS + kfan / direct * (half / kfan + half / direct)
        assert abs(r[f"{kind_}_ratio"] - kfan / direct) <= slack * 1.01, kind_
        assert math.isclose(r[f"one_core_{kind_}_mbps"], 1000 / r[f"kfan_cpu_ms_per_mb_{kind_}"], rel_tol=2e-3, abs_tol=0.06), kind_
    for figure in ["latency_p50_ms", "latency_p99_ms"] + (SLOW_FIGURES if slow_fetch else []):
        overhead = r[figure.replace("_ms", "_overhead_ms")]
        assert math.isclose(overhead, r[f"{figure}_kfan"] - r[f"{figure}_direct"], abs_tol=2e-3), figure


def check_table(stdout: str, r: dict[str, Any]) -> None:
    """Every row of the table is there and shows the JSON line's figures."""
    for label, (figure, derived, digits) in TABLE_ROWS.items():
        row = next((line for line in stdout.splitlines() if line.startswith(label)), None)
        assert row is not None, f"no row {label!r} in:\n{stdout}"
        shown = row[len(label) :].split()
        for path, text in zip(("direct", "kfan"), shown[:2], strict=True):
            value = r[f"{figure}_{path}"]
            assert text == ("n/a" if value is None else f"{value:.{digits}f}"), (label, path, text, value)
        if r[derived] is not None:
            assert f"{r[derived]:{'+' if 'overhead' in derived else ''}.3f}" in row, (label, row)
    cpu = re.search(r"kfan CPU per MB moved: produce (\S+) ms, consume (\S+) ms", stdout)
    assert cpu is not None and (float(cpu[1]), float(cpu[2])) == (r["kfan_cpu_ms_per_mb_produce"], r["kfan_cpu_ms_per_mb_consume"])
    sizing = re.search(r"sizing: one kfan core carries (\S+) MB/s of produce or (\S+) MB/s of consume", stdout)
    assert sizing is not None and (float(sizing[1]), float(sizing[2])) == (r["one_core_produce_mbps"], r["one_core_consume_mbps"])


def test_embedded_cluster_no_arguments() -> None:
    done = bench()
    assert done.returncode == 0, done.stderr
    r = json_line(done.stdout)
    check_figures(r, "embedded", slow_fetch=True)
    check_table(done.stdout, r)
    assert f"topic {r['topic']}: 24 partitions" in done.stdout
    # Progress went to stderr, one line per phase at least (not a terminal: plain lines).
    for phase in ("setup:", "throughput:", "latency:", "slow fetch:", "done in"):
        assert phase in done.stderr, phase


@pytest.fixture
def kfan_cluster() -> Any:
    """`kfan cluster` alone in a child process, as an operator would run it; its bootstrap."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "proxy", "cluster", "--brokers", "3", "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    log, ready = follow_output(proc, r"Run: kfan serve --bootstrap (\S+)", 60)
    try:
        assert ready is not None, "kfan cluster did not start:\n" + "".join(log)
        yield ready[1]
    finally:
        stop_process(proc, 10)


def test_bootstrap_kfan_cluster(kfan_cluster: str) -> None:
    done = bench("--bootstrap", kfan_cluster)
    assert done.returncode == 0, done.stderr
    r = json_line(done.stdout)
    # librdkafka's mock has no CreateTopics: the topic was auto-created, with the partition count it chose, and said so.
    check_figures(r, "external", slow_fetch=False, partitions=None)
    check_table(done.stdout, r)
    assert r["bootstrap"] == kfan_cluster and r["brokers"] == 3
    assert f"topic {r['topic']}: {r['partitions']} partitions (auto-created" in done.stdout


def test_bootstrap_tansu_json() -> None:
    with Tansu() as tansu:
        done = bench("--bootstrap", tansu.bootstrap, "--json")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout  # --json: the JSON line alone
    r = json_line(done.stdout)
    check_figures(r, "external", slow_fetch=False)
    assert r["brokers"] == 1 and r["bootstrap"] == tansu.bootstrap
    assert "created (replication 1), deleted at the end" in done.stderr


def test_unreachable_cluster_fails_with_a_message() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "bench", "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode != 0
    assert done.stdout == ""
    assert "kfan bench: failed: no broker at 127.0.0.1:1 answered" in done.stderr


def test_bootstrap_apache_kafka(apache_kafka: KafkaCluster) -> None:
    """Against Apache Kafka's three brokers: the topic is created with replication 3 and deleted at the end."""
    done = bench("--bootstrap", apache_kafka.bootstrap)
    assert done.returncode == 0, done.stderr
    r = json_line(done.stdout)
    check_figures(r, "external", slow_fetch=False)
    check_table(done.stdout, r)
    assert r["brokers"] == 3 and r["bootstrap"] == apache_kafka.bootstrap
    assert "created (replication 3), deleted at the end" in done.stderr
    assert r["topic"] not in run_tool("kafka-topics", "--bootstrap-server", apache_kafka.bootstrap, "--list").out.split()
