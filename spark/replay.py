"""Replay kfan captures through the current core with PySpark; report regressions.

Each captured exchange is checked by :func:`spark.checks.check_exchange` on
the executors, with kfan's current core (or the one :func:`run` is given);
the driver aggregates by API key and version (counts,
regressions with the first examples, latency percentiles, fan-out widths) and
writes ``OUT.json`` and ``OUT.html``. Exit status 1 when any exchange
regressed.

Local mode (what `kfan replay DIR --report OUT` runs):

    python spark/replay.py CAPTURE_DIR --report OUT

On a cluster, ``--master spark://HOST:7077`` (or spark-submit's): kfan and the
dependencies the executors import are shipped to them with ``spark.archives``
(:mod:`spark.ship`; ``--spark-archive`` overrides), and a probe job checks
that the executors import them before the replay starts:

    kfan replay s3a://bucket/captures --report /tmp/replay --master spark://HOST:7077
"""

from __future__ import annotations

import argparse
import html
import json
import math
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark.checks import Core
    from spark.ship import Shipment

EXAMPLES = 3
PEER_EXAMPLES = 20  # corrupt batches from clients or brokers listed in the report
LATENCY_BUCKETS_MS = [0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, math.inf]


def _check_rows(rows: Iterable[Any], core: Core) -> Iterator[tuple[Any, ...]]:
    """On an executor: one result tuple per capture row (a Spark Row) of a partition."""
    from proxy.capture.rows import CaptureRow
    from spark.checks import check_exchange

    for row in rows:
        d = row.asDict(recursive=True)
        r = check_exchange(CaptureRow.from_dict(d), core)
        yield (
            r.api_key,
            r.api_version,
            float(r.latency_ms),
            r.fanout,
            r.regressed,
            json.dumps([[f.check, f.detail] for f in r.findings]),
            d["conn_id"],
            d["correlation_id"],
            json.dumps([[f.check, f.detail] for f in r.peer_findings]),
        )


def run(
    capture: str, report: Path, master: str | None = None, core: Core | None = None, shipment: Shipment | None = None
) -> dict[str, Any]:
    """Check every exchange of ``capture`` with ``core`` (default: kfan's, :data:`spark.checks.DEFAULT_CORE`);
    write REPORT.json and REPORT.html; return the summary.

    ``shipment``: kfan for the executors of a cluster (:func:`spark.ship.prepare`), checked
    with a probe job before the replay; raises :class:`spark.ship.ShippingError` when they
    cannot import it."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, DoubleType, IntegerType, StringType, StructField, StructType
    from pyspark.sql.window import Window

    from spark.checks import DEFAULT_CORE
    from spark.ship import EXECUTOR_MODULES, check_executors

    builder = (
        SparkSession.builder.appName("kfan-replay").config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    )
    if master:
        builder = builder.master(master)
    for key, value in (shipment.conf if shipment else {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    core = core or DEFAULT_CORE
    try:
        if shipment is not None:
            # The core's own module too: a core defined outside kfan's packages is not shipped.
            check_executors(spark.sparkContext, shipment, [*EXECUTOR_MODULES, core.replan.__module__])
        # Complete files only: the one still being written is *.parquet.inprogress.
        if "://" in capture:
            exchanges = spark.read.parquet(capture.rstrip("/") + "/*.parquet")
        else:
            files = sorted(str(f) for f in Path(capture).resolve().glob("*.parquet"))
            if not files:
                raise SystemExit(f"kfan replay: no complete capture file (*.parquet) in {capture}")
            exchanges = spark.read.parquet(*files)
        schema = StructType(
            [
                StructField("api_key", IntegerType()),
                StructField("api_version", IntegerType()),
                StructField("latency_ms", DoubleType()),
                StructField("fanout", IntegerType()),
                StructField("regressed", BooleanType()),
                StructField("findings", StringType()),
                StructField("conn_id", StringType()),
                StructField("correlation_id", IntegerType()),
                StructField("peer_findings", StringType()),
            ]
        )
        results = spark.createDataFrame(exchanges.rdd.mapPartitions(partial(_check_rows, core=core)), schema).cache()
        per_api = (
            results.groupBy("api_key", "api_version")
            .agg(
                F.count("*").alias("exchanges"),
                F.sum(F.col("regressed").cast("int")).alias("regressions"),
                F.percentile_approx("latency_ms", [0.5, 0.9, 0.99]).alias("latency_ms_p50_p90_p99"),
                F.max("latency_ms").alias("latency_ms_max"),
            )
            .orderBy("api_key", "api_version")
            .collect()
        )
        ranked = results.filter("regressed").withColumn(
            "n", F.row_number().over(Window.partitionBy("api_key", "api_version").orderBy("conn_id", "correlation_id"))
        )
        examples = ranked.filter(F.col("n") <= EXAMPLES).collect()
        peers = results.filter(F.col("peer_findings") != "[]")
        peer_count = peers.count()
        peer_examples = peers.orderBy("conn_id", "correlation_id").limit(PEER_EXAMPLES).collect()
        fanout = results.groupBy("api_key", "fanout").count().orderBy("api_key", "fanout").collect()
        bucket = F.lit(len(LATENCY_BUCKETS_MS) - 1)
        for i, edge in reversed(list(enumerate(LATENCY_BUCKETS_MS[:-1]))):
            bucket = F.when(F.col("latency_ms") <= edge, F.lit(i)).otherwise(bucket)
        latency = results.groupBy(bucket.alias("bucket")).count().orderBy("bucket").collect()
    finally:
        spark.stop()

    summary: dict[str, Any] = {
        "capture": capture,
        "exchanges": sum(r["exchanges"] for r in per_api),
        "regressions": sum(r["regressions"] for r in per_api),
        "apis": [],
        "fanout": [{"api_key": r["api_key"], "width": r["fanout"], "count": r["count"]} for r in fanout],
        "latency_histogram_ms": [{"le": LATENCY_BUCKETS_MS[r["bucket"]], "count": r["count"]} for r in latency],
        # Corrupt batches a client or a broker sent: findings of their own, not kfan regressions.
        "peer_findings": {
            "exchanges": peer_count,
            "examples": [
                {"conn_id": e["conn_id"], "correlation_id": e["correlation_id"], "findings": json.loads(e["peer_findings"])}
                for e in peer_examples
            ],
        },
    }
    for r in per_api:
        p = r["latency_ms_p50_p90_p99"] or [None, None, None]
        summary["apis"].append(
            {
                "api_key": r["api_key"],
                "api_version": r["api_version"],
                "exchanges": r["exchanges"],
                "regressions": r["regressions"],
                "latency_ms": {"p50": p[0], "p90": p[1], "p99": p[2], "max": r["latency_ms_max"]},
                "examples": [
                    {"conn_id": e["conn_id"], "correlation_id": e["correlation_id"], "findings": json.loads(e["findings"])}
                    for e in examples
                    if e["api_key"] == r["api_key"] and e["api_version"] == r["api_version"]
                ],
            }
        )
    report.parent.mkdir(parents=True, exist_ok=True)
    Path(str(report) + ".json").write_text(json.dumps(summary, indent=2, default=str))
    Path(str(report) + ".html").write_text(render_html(summary))
    return summary


def _bars(title: str, items: list[tuple[str, int]]) -> str:
    """A horizontal bar chart as inline SVG (no plotting library needed to read the report)."""
    if not items:
        return f"<h3>{html.escape(title)}</h3><p>no data</p>"
    top = max(c for _, c in items) or 1
    row, width = 22, 420
    parts = [f'<h3>{html.escape(title)}</h3><svg width="{width + 260}" height="{row * len(items) + 10}" role="img">']
    for i, (label, count) in enumerate(items):
        w = max(1, int(width * count / top))
        y = i * row + 5
        parts.append(f'<text x="0" y="{y + 15}" font-size="13">{html.escape(label)}</text>')
        parts.append(f'<rect x="150" y="{y}" width="{w}" height="{row - 6}" fill="#4a7bd0"/>')
        parts.append(f'<text x="{155 + w}" y="{y + 15}" font-size="13">{count}</text>')
    parts.append("</svg>")
    return "".join(parts)


def render_html(summary: dict[str, Any]) -> str:
    from proxy.kafka.apis import api_name

    def name(key: int) -> str:
        try:
            return api_name(key)
        except (AssertionError, KeyError, ModuleNotFoundError):
            return str(key)

    verdict = "no regressions" if summary["regressions"] == 0 else f"{summary['regressions']} regressed exchanges"
    rows = []
    for a in summary["apis"]:
        lat = a["latency_ms"]
        ex = "<br>".join(html.escape(f"{e['conn_id']}#{e['correlation_id']}: {e['findings']}") for e in a["examples"])
        rows.append(
            f"<tr><td>{name(a['api_key'])}</td><td>{a['api_key']}</td><td>{a['api_version']}</td><td>{a['exchanges']}</td>"
            f"<td>{a['regressions']}</td><td>{_fmt(lat['p50'])}</td><td>{_fmt(lat['p90'])}</td><td>{_fmt(lat['p99'])}</td>"
            f"<td><code>{ex}</code></td></tr>"
        )
    latency = [(f"≤ {b['le']} ms" if b["le"] != math.inf else "> 5000 ms", b["count"]) for b in summary["latency_histogram_ms"]]
    fanout = [(f"{name(f['api_key'])} × {f['width']}", f["count"]) for f in summary["fanout"]]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kfan replay</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head>
<body><h1>kfan replay: {html.escape(verdict)}</h1>
<p>{summary["exchanges"]} exchanges from <code>{html.escape(str(summary["capture"]))}</code></p>
<table><tr><th>API</th><th>key</th><th>version</th><th>exchanges</th><th>regressions</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>first regressions</th></tr>
{"".join(rows)}</table>
{_peer_section(summary)}
{_bars("Client latency (ts_end - ts_start)", latency)}
{_bars("Fan-out width (sub-requests per exchange)", fanout)}
</body></html>"""


def _peer_section(summary: dict[str, Any]) -> str:
    peers = summary.get("peer_findings") or {"exchanges": 0, "examples": []}
    if not peers["exchanges"]:
        return "<h2>Corrupt batches from clients or brokers</h2><p>none</p>"
    lines = [f"{e['conn_id']}#{e['correlation_id']}: {e['findings']}" for e in peers["examples"]]
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return f"<h2>Corrupt batches from clients or brokers (not kfan regressions)</h2><p>{peers['exchanges']} exchanges</p><ul>{items}</ul>"


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def main(argv: list[str] | None = None, core: Core | None = None) -> int:
    """``kfan replay DIR --report OUT``; ``core`` (default kfan's) is for tests that check the checks."""
    parser = argparse.ArgumentParser(description="Replay kfan captures through the current core and report regressions.")
    parser.add_argument("capture", help="capture directory (local path or any URL Spark reads)")
    parser.add_argument("--report", required=True, type=Path, help="writes REPORT.json and REPORT.html")
    parser.add_argument("--master", default=None, help="Spark master (default: spark-submit's, or local[*])")
    parser.add_argument(
        "--spark-archive",
        default=os.environ.get("KFAN_SPARK_ARCHIVE") or "auto",
        metavar="auto|none|ARCHIVE",
        help="what a cluster's executors get (not local mode): auto builds an archive of kfan and its dependencies, "
        "none ships nothing (kfan installed on the workers), or a prebuilt archive's path or URL (default $KFAN_SPARK_ARCHIVE, else auto)",
    )
    args = parser.parse_args(argv)
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        print(
            "kfan replay: Spark needs a Java runtime (17 or later); install one, e.g. apt-get install -y default-jre-headless",
            file=sys.stderr,
        )
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("kfan replay: PySpark is not installed; pip install 'kfan[spark]'", file=sys.stderr)
        return 2
    # Under spark-submit (its scripts set SPARK_ENV_LOADED) the master is spark-submit's; run directly, local mode.
    master = args.master or (None if os.environ.get("SPARK_ENV_LOADED") else "local[*]")
    if master and master.startswith("local"):
        # Local workers run this interpreter (its venv has kio and the rest).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Driver and executors share this machine: no need to find a routable address.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Executors import proxy/, backends/ and spark/ from the project in local mode.
    root = str(Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    sys.path.insert(0, root)
    from spark.ship import ShippingError, is_local, prepare

    try:
        submitted = {} if master else _submitted_conf()
        shipment = None if is_local(master or submitted.get("spark.master", "local")) else prepare(args.spark_archive, submitted)
        summary = run(args.capture, args.report, master, core, shipment)
    except ShippingError as e:
        print(f"kfan replay: {e}", file=sys.stderr)
        return 2
    print(f"kfan replay: {summary['exchanges']} exchanges, {summary['regressions']} regressed; report {args.report}.html")
    for a in summary["apis"]:
        for e in a["examples"]:
            print(f"  regressed: api_key {a['api_key']} v{a['api_version']} {e['conn_id']}#{e['correlation_id']}: {e['findings'][0]}")
    peers = summary["peer_findings"]
    if peers["exchanges"]:
        print(f"kfan replay: {peers['exchanges']} exchanges carried corrupt batches from a client or broker (not kfan regressions):")
        for e in peers["examples"]:
            for check, detail in e["findings"]:
                print(f"  {check}: {detail} ({e['conn_id']}#{e['correlation_id']})")
    return 1 if summary["regressions"] else 0


def _submitted_conf() -> dict[str, str]:
    """Under spark-submit: the settings it was given (its master, --archives), read before the session starts."""
    from pyspark import SparkConf, SparkContext

    # Without spark-submit's JVM a SparkConf is empty: connect to it first (the session reuses the connection).
    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


if __name__ == "__main__":
    sys.exit(main())
