"""The ``kfan`` command: serve, demo, cluster."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from . import config
from .capture import CaptureConfig
from .config import parse_address, parse_addresses
from .connection import Limits
from .server import Running, ServerConfig, serve

log = logging.getLogger("kfan")


def _topic(text: str) -> tuple[str, int]:
    name, _, partitions = text.rpartition(":")
    if not name or not partitions.isdigit() or int(partitions) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {text!r}")
    return name, int(partitions)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kfan", description="A stateless Kafka protocol proxy: one endpoint in front of a multi-broker cluster."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the proxy in front of a Kafka cluster")
    config.add_options(s)
    d = sub.add_parser("demo", help="run an embedded 3-broker cluster with kfan in front of it")
    config.add_options(d, skip=("bootstrap", "workers"))
    c = sub.add_parser("cluster", help="run the embedded cluster alone, to point `kfan serve` at")
    c.add_argument("--brokers", type=int, default=3)
    c.add_argument(
        "--topic",
        type=_topic,
        action="append",
        default=[],
        metavar="NAME:PARTITIONS",
        help="create a topic (repeatable); leaders spread round-robin",
    )
    c.add_argument(
        "--host",
        default=None,
        metavar="ADDRESS",
        help="also reachable at this local address, same ports (the brokers listen on 127.0.0.1; kfan relays)",
    )
    c.add_argument("--log-level", default="INFO")
    r = sub.add_parser(
        "replay", help="check a capture: through the current core with Spark (--report), or against a running kfan (--target)"
    )
    r.add_argument("capture", metavar="DIR", help="capture directory (kfan serve --capture, or kfan capture import)")
    r.add_argument("--report", metavar="OUT", help="run the Spark job in local mode; writes OUT.json and OUT.html")
    r.add_argument("--master", default=None, help="Spark master for --report (default local[*])")
    r.add_argument("--target", type=parse_address, metavar="HOST:PORT", help="send the recorded requests to this kfan and compare answers")
    r.add_argument(
        "--apis",
        choices=("all", "read-only"),
        default="all",
        help="with --target: which recorded requests to send (read-only: metadata, fetches, offsets, describe and list requests)",
    )
    r.add_argument("--break", dest="broken", default=None, help=argparse.SUPPRESS)  # tests only: a deliberately broken core
    cap = sub.add_parser("capture", help="capture files")
    cap_sub = cap.add_subparsers(dest="capture_command", required=True)
    imp = cap_sub.add_parser("import", help="turn a tcpdump of direct client-to-broker traffic into a capture")
    imp.add_argument("pcap", metavar="FILE", help="pcap or pcapng file (tcpdump -w)")
    imp.add_argument(
        "--port", type=int, action="append", required=True, help="a broker port in the file (repeatable: brokers on several ports)"
    )
    imp.add_argument("--out", required=True, metavar="DIR", help="capture directory to write")
    return parser


def _replay(args: argparse.Namespace) -> int:
    if not args.report and not args.target:
        raise SystemExit("kfan replay: give --report OUT (Spark job) and/or --target HOST:PORT (live replay)")
    status = 0
    if args.report:
        from spark.replay import main as spark_replay

        argv = [args.capture, "--report", args.report]
        argv += ["--master", args.master] if args.master else []
        argv += ["--break", args.broken] if args.broken else []
        status = spark_replay(argv)
    if args.target:
        from .live import run

        status = max(status, run(Path(args.capture), args.target, args.apis))
    return status


def _capture_import(args: argparse.Namespace) -> int:
    from .pcap import import_pcap

    try:
        n = import_pcap(Path(args.pcap), set(args.port), Path(args.out))
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan capture import: {e}") from None
    print(f"kfan capture import: {n} exchanges written to {args.out}")
    return 0 if n else 1


def _config(options: dict[str, Any], bootstrap: list[tuple[str, int]], reuse_port: bool = False) -> ServerConfig:
    return ServerConfig(
        bootstrap=bootstrap,
        listen=options["listen"],
        advertise=options["advertise"],
        node_id=options["node_id"],
        metadata_refresh_s=options["metadata_refresh"],
        limits=Limits(
            max_frame_bytes=options["max_frame_bytes"], max_inflight=options["max_inflight"], request_timeout=options["request_timeout"]
        ),
        metrics_listen=options["metrics_listen"],
        reuse_port=reuse_port,
        shutdown_timeout_s=options["shutdown_timeout"],
        capture=None
        if options["capture"] is None
        else CaptureConfig(options["capture"], sample=options["capture_sample"], records=options["capture_records"]),
    )


async def _until_signal(body: Callable[[trio.Nursery], Awaitable[Running | None]], shutdown_timeout: float = 0.0) -> None:
    """Run until SIGINT or SIGTERM; then drain the server (if any) and cancel everything."""
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            running = await body(nursery)
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                if running is not None:
                    await running.shutdown(shutdown_timeout)
                nursery.cancel_scope.cancel()
                break


def _serve(options: dict[str, Any]) -> int:
    if not options["bootstrap"]:
        raise SystemExit("kfan serve: --bootstrap (or KFAN_BOOTSTRAP, or bootstrap in the config file) is required")
    if options["workers"] > 1:
        from .workers import run_workers

        return run_workers(options)
    config = _config(options, options["bootstrap"], reuse_port=os.environ.get("KFAN_WORKER") is not None)

    async def body(nursery: trio.Nursery) -> Running:
        running: Running = await nursery.start(serve, config)
        print(
            f"kfan: serving on {running.identity.host}:{running.identity.port}, {len(running.cluster.topology.brokers)} brokers behind it",
            flush=True,
        )
        return running

    trio.run(_until_signal, body, config.shutdown_timeout_s)
    return 0


def _demo(options: dict[str, Any]) -> int:
    from backends.mock import MockCluster

    with MockCluster(3) as mock:
        mock.create_topic("demo", 6)
        config = _config(options, parse_addresses(mock.bootstrap))

        async def body(nursery: trio.Nursery) -> Running:
            running: Running = await nursery.start(serve, config)
            addr = f"{running.identity.host}:{running.identity.port}"
            leaders = running.cluster.topology.leaders.get("demo", {})
            print(
                f"""
kfan demo: an embedded 3-broker Kafka cluster with kfan in front of it.

  Connect any Kafka client to:  {addr}
  (the clients see one broker; kfan splits requests across the three behind it)

  Topic "demo", 6 partitions, led by:
"""
                + "".join(f"    partition {p} -> broker {b}\n" for p, b in sorted(leaders.items()))
                + f"""
  Try it from another terminal (Python with confluent-kafka, which the
  setup already installed in .venv), copy-paste:

.venv/bin/python - <<'PY'
import os
from confluent_kafka import Producer, Consumer
p = Producer({{"bootstrap.servers": "{addr}"}})
for i in range(12):
    p.produce("demo", key=str(i), value=f"hello {{i}}")
p.flush()
c = Consumer({{"bootstrap.servers": "{addr}", "group.id": f"demo-{{os.getpid()}}", "auto.offset.reset": "earliest"}})
c.subscribe(["demo"])
got = 0
while got < 12:
    m = c.poll(5)
    if m is not None and m.error() is None:
        got += 1
        print("partition", m.partition(), m.key(), m.value())
c.close()
PY

  or with kcat:  kcat -b {addr} -L

Ctrl-C stops it.
""",
                flush=True,
            )
            return running

        trio.run(_until_signal, body, config.shutdown_timeout_s)
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from backends.mock import MockCluster

    with MockCluster(args.brokers) as mock:
        for name, partitions in args.topic:
            mock.create_topic(name, partitions)
        ports = [parse_address(a)[1] for a in mock.bootstrap.split(",")]
        bootstrap = mock.bootstrap
        if args.host:
            for broker, port in enumerate(ports, start=1):
                mock.set_broker_address(broker, args.host, port)
            bootstrap = ",".join(f"{args.host}:{port}" for port in ports)
        print(f"kfan cluster: {args.brokers} brokers at {bootstrap}", flush=True)
        for name, partitions in args.topic:
            print(f"  topic {name}: {partitions} partitions, leaders round-robin", flush=True)
        print(f"Run: kfan serve --bootstrap {bootstrap}", flush=True)

        async def body(nursery: trio.Nursery) -> None:
            if args.host:
                for port in ports:
                    await nursery.start(_relay, args.host, port)
            return None

        trio.run(_until_signal, body)
    return 0


async def _relay(host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Forward connections on host:port to the mock broker on 127.0.0.1:port."""

    async def pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(dst)

    async def handle(client: trio.SocketStream) -> None:
        try:
            broker = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.aclose_forcefully(client)
            return
        async with trio.open_nursery() as n:
            n.start_soon(pipe, client, broker)
            n.start_soon(pipe, broker, client)

    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started()
    await trio.serve_listeners(handle, listeners)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event)


def setup_logging(level: str, as_json: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if as_json:
        formatter: logging.Formatter = _JsonFormatter()
        formatter.converter = time.gmtime
    else:
        formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, str(level).upper(), logging.INFO))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "cluster":
        setup_logging(args.log_level, False)
        return _cluster(args)
    if args.command in ("replay", "capture"):
        setup_logging("WARNING", False)
        return _replay(args) if args.command == "replay" else _capture_import(args)
    try:
        options = config.resolve(vars(args))
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan {args.command}: {e}") from None
    setup_logging(options["log_level"], options["log_json"])
    return {"serve": _serve, "demo": _demo}[args.command](options)


if __name__ == "__main__":
    sys.exit(main())
