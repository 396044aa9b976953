"""The ``kfan`` command: serve, demo, cluster (and the lesser ones: replay, users, capture, bench)."""

from __future__ import annotations

import argparse
import gc
import logging
import math
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import trio

from proxy.core.advertised import MAX_PORT
from proxy.runtime.audit import Audit, FileSink
from proxy.runtime.lifeline import LIFELINE_CLOSED, LIFELINE_ENV, watch_lifeline
from proxy.runtime.logs import setup_logging
from proxy.runtime.metrics import ListenFailed
from proxy.runtime.telemetry import ClientTelemetry, load_subscriptions
from proxy.server import config
from proxy.server.audit_topic import TopicSink
from proxy.server.config import parse_address, parse_addresses
from proxy.server.connection import Limits
from proxy.server.governance import AclFile, Governance, read_acls
from proxy.server.prelogin import PreLoginLimits
from proxy.server.quotas import Quotas, read_quotas
from proxy.server.reload import Reloader
from proxy.server.security_options import security_from
from proxy.server.serve import Running, ServerConfig, serve
from proxy.server.workers import leave_metrics_dir, run_workers
from proxy.tools import demo
from proxy.tools.bench.options import add_arguments as add_bench_arguments

from .capture.recorder import CaptureConfig

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
    c.add_argument(
        "--log-json",
        type=config.parse_bool,
        default=False,
        metavar="BOOL",
        help="one JSON object per log line (kfan demo passes its own on)",
    )
    r = sub.add_parser(
        "replay", help="check a capture: through the current core with Spark (--report), or against a running kfan (--target)"
    )
    r.add_argument("capture", metavar="DIR", help="capture directory (kfan serve --capture, or kfan capture import)")
    r.add_argument("--report", metavar="OUT", help="run the Spark job in local mode; writes OUT.json and OUT.html")
    r.add_argument("--master", default=None, help="Spark master for --report (default local[*])")
    r.add_argument(
        "--spark-archive",
        metavar="auto|none|ARCHIVE",
        help="with --master spark://...: what the executors get: auto (default, or $KFAN_SPARK_ARCHIVE) ships kfan and its "
        "dependencies, none ships nothing (kfan installed on the workers), ARCHIVE a prebuilt archive's path or URL",
    )
    r.add_argument("--target", type=parse_address, metavar="HOST:PORT", help="send the recorded requests to this kfan and compare answers")
    r.add_argument(
        "--apis",
        choices=("all", "read-only"),
        default="all",
        help="with --target: which recorded requests to send (read-only: metadata, fetches, offsets, describe and list requests)",
    )
    users = sub.add_parser("users", help="the users file kfan checks clients' SASL logins against (--client-users)")
    users_sub = users.add_subparsers(dest="users_command", required=True)
    add = users_sub.add_parser("add", help="add a user, or replace its credentials; the password is read from standard input")
    add.add_argument("name")
    add.add_argument(
        "--mechanism",
        action="append",
        choices=("SCRAM-SHA-256", "SCRAM-SHA-512"),
        help="SCRAM credential to store (repeatable; default both). PLAIN logins are checked against either.",
    )
    add.add_argument("--iterations", type=int, default=4096, help="PBKDF2 iterations of the SCRAM credential (at least 4096)")
    add.add_argument("--client-users", required=True, type=Path, metavar="FILE", help="the users file (created when missing)")
    cap = sub.add_parser("capture", help="capture files")
    cap_sub = cap.add_subparsers(dest="capture_command", required=True)
    imp = cap_sub.add_parser("import", help="turn a tcpdump of direct client-to-broker traffic into a capture")
    imp.add_argument("pcap", metavar="FILE", help="pcap or pcapng file (tcpdump -w)")
    imp.add_argument(
        "--port", type=int, action="append", required=True, help="a broker port in the file (repeatable: brokers on several ports)"
    )
    imp.add_argument("--out", required=True, metavar="DIR", help="capture directory to write")
    b = sub.add_parser(
        "bench",
        help="measure the direct path and the path through kfan side by side: throughput, kfan's CPU per MB, latency",
    )
    add_bench_arguments(b)
    return parser


def _replay(args: argparse.Namespace) -> int:
    if not args.report and not args.target:
        raise SystemExit("kfan replay: give --report OUT (Spark job) and/or --target HOST:PORT (live replay)")
    status = 0
    if args.report:
        from spark.replay import main as spark_replay

        argv = [args.capture, "--report", args.report]
        argv += ["--master", args.master] if args.master else []
        argv += ["--spark-archive", args.spark_archive] if args.spark_archive else []
        status = spark_replay(argv)
    if args.target:
        from proxy.tools.live_replay import run

        status = max(status, run(Path(args.capture), args.target, args.apis))
    return status


def _capture_import(args: argparse.Namespace) -> int:
    from proxy.tools.pcap import import_pcap

    try:
        n = import_pcap(Path(args.pcap), set(args.port), Path(args.out))
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan capture import: {e}") from None
    print(f"kfan capture import: {n} exchanges written to {args.out}")
    return 0 if n else 1


def _users_add(args: argparse.Namespace) -> int:
    from .security.users import add_user

    if sys.stdin.isatty():
        import getpass

        password = getpass.getpass(f"password for {args.name}: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise SystemExit("kfan users add: an empty password (give it on standard input)")
    mechanisms = tuple(args.mechanism or ("SCRAM-SHA-256", "SCRAM-SHA-512"))
    try:
        add_user(args.client_users, args.name, password, mechanisms, iterations=args.iterations)
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan users add: {e}") from None
    print(f"kfan users add: {args.name} ({', '.join(mechanisms)}) written to {args.client_users}")
    return 0


def _limits(options: Mapping[str, Any]) -> Limits:
    return Limits(
        max_frame_bytes=options["max_frame_bytes"],
        max_inflight=options["max_inflight"],
        max_connection_bytes=options["max_connection_bytes"],
        request_timeout=options["request_timeout"],
        max_hold=options["max_hold"],
        idle_timeout=options["idle_timeout"],
        frame_timeout=options["frame_timeout"],
        max_buffered_bytes=options["max_buffered_bytes"],
        max_connections=options["max_connections"],
        validate_records=options["validate_records"] == "crc",
        fetch_ahead_bytes=options["fetch_ahead_bytes"],
        max_age=options["connection_max_age"],
        max_age_jitter=options["connection_max_age_jitter"],
        login=PreLoginLimits(
            max_receive_bytes=options["client_auth_max_receive_bytes"],
            timeout=options["client_auth_timeout"],
            max_per_address=options["max_unauthenticated_per_address"],
            max_bytes=options["max_unauthenticated_bytes"],
        ),
    )


def _broker_port_base(options: dict[str, Any]) -> int:
    base: int = options["broker_port_base"]
    if base and options["broker_ids"] != "cluster":
        raise ValueError("--broker-port-base is used only with --broker-ids cluster")
    if not 0 <= base <= MAX_PORT:
        raise ValueError(f"--broker-port-base {base} is not a port")
    return base


def _config(options: dict[str, Any], bootstrap: list[tuple[str, int]], reuse_port: bool = False) -> ServerConfig:
    return ServerConfig(
        bootstrap=bootstrap,
        listen=options["listen"],
        advertise=options["advertise"],
        node_id=options["node_id"],
        cluster_ids=options["broker_ids"] == "cluster",
        broker_port_base=_broker_port_base(options),
        metadata_refresh_s=options["metadata_refresh"],
        rack=options["rack"] or "",
        read_replica_max_age_s=options["read_replica_max_age"],
        limits=_limits(options),
        metrics_listen=options["metrics_listen"],
        reuse_port=reuse_port,
        shutdown_timeout_s=options["shutdown_timeout"],
        drain_period_s=options["drain_period"],
        capture=None
        if options["capture"] is None
        else CaptureConfig(options["capture"], sample=options["capture_sample"], records=options["capture_records"]),
        security=security_from(options),
        telemetry=_telemetry(options),
        governance=_governance(options),
        quotas=Quotas(options["quota_file"]) if options["quota_file"] is not None else None,
    )


def _governance(options: dict[str, Any]) -> Governance:
    """The ACLs kfan authorizes with and its audit log, as the options say (an invalid ACL file stops kfan here)."""
    acl_file = None
    if options["authorizer"] == "acls":
        if options["acl_file"] is None:
            raise ValueError("--authorizer acls needs --acl-file")
        acl_file = AclFile(options["acl_file"], options["acl_file_check"])
    elif options["acl_file"] is not None:
        raise ValueError("--acl-file is read only with --authorizer acls")
    audit = None
    if options["audit_log"] is not None and options["audit_topic"] is not None:
        raise ValueError("give --audit-log or --audit-topic, not both")
    if options["audit_log"] is not None or options["audit_topic"] is not None:
        sink = FileSink(options["audit_log"]) if options["audit_log"] is not None else TopicSink(options["audit_topic"])
        audit = Audit(sink, options["audit_apis"], options["audit_queue_events"], block=options["audit_overflow"] == "block")
    return Governance(acl_file, options["authorizer_log"], audit)


def _reconfigure(running: Running, options: Mapping[str, Any], changed: frozenset[str]) -> None:
    """Apply reloaded options, once everything they name has been read and checked (raises, changing nothing)."""
    limits = _limits(options)
    security = security_from(options)
    if options["quota_file"] is not None:
        read_quotas(options["quota_file"])
    if options["authorizer"] == "acls":
        if options["acl_file"] is None:
            raise ValueError("--authorizer acls needs --acl-file")
        read_acls(options["acl_file"])
    running.reconfigure(options, changed, limits, security)


def _reloading(running: Running, options: Mapping[str, Any], flags: Mapping[str, Any], nursery: trio.Nursery) -> None:
    """Reload the configuration on SIGHUP and when the --config file changes."""
    running.reloader = Reloader(flags, dict(os.environ), options, lambda o, changed: _reconfigure(running, o, changed), adjust=_as_worker)
    nursery.start_soon(running.reloader.watch)


def _telemetry(options: dict[str, Any]) -> ClientTelemetry | None:
    path = options["telemetry_subscriptions"]
    if path is None:
        return None
    try:
        subscriptions = load_subscriptions(path)
    except ValueError as e:
        raise SystemExit(f"kfan: --telemetry-subscriptions: {e}") from None
    return ClientTelemetry(subscriptions, max_bytes=options["telemetry_max_bytes"], max_instances=options["telemetry_max_client_instances"])


async def _until_signal(body: Callable[[trio.Nursery], Awaitable[Running | None]], shutdown_timeout: float = 0.0) -> str:
    """Run until SIGINT or SIGTERM (or, for a child on a lifeline, until the process that started it is
    gone); then drain the server (if any) and cancel everything; the reason it stopped. SIGHUP is ignored, with a line.

    Signals are heard while the body still starts too: a kfan that cannot
    reach (or log in to) any broker must still stop when told.
    """
    async with trio.open_nursery() as nursery:
        stop_send, stop_receive = trio.open_memory_channel[str](math.inf)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            started: list[Running | None] = []

            async def start() -> None:
                started.append(await body(nursery))

            async def hear(signals: AsyncIterator[int]) -> None:
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        running = started[0] if started else None
                        if running is None or running.reloader is None:
                            log.warning("received SIGHUP while starting: ignored (send it again once kfan serves)")
                            continue
                        log.info("received SIGHUP: reloading the configuration")
                        running.reloader.reload("SIGHUP")
                        if running.governance is not None and running.governance.audit is not None:
                            running.governance.audit.reopen()  # after logrotate moved it
                    else:
                        stop_send.send_nowait(f"received {signal.Signals(signum).name}")

            nursery.start_soon(start)
            nursery.start_soon(hear, signals)
            if os.environ.get(LIFELINE_ENV) == "stdin":
                nursery.start_soon(watch_lifeline, stop_send)
            reason = await stop_receive.receive()
            log.info("%s, stopping", reason)
            if started and started[0] is not None:
                running = started[0]
                await running.shutdown(running.live.shutdown_timeout_s if running.live is not None else shutdown_timeout)
            nursery.cancel_scope.cancel()
    return reason


def ignore_sighup() -> None:
    """Ignore SIGHUP from the start (the signal receivers take over once trio runs, and restore this after):
    a SIGHUP while kfan starts is as harmless as one after. Its children inherit it."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@contextmanager
def _exit_if_listen_fails(command: str) -> Iterator[None]:
    """An address that cannot be bound ends kfan with one line naming it and the OS error, not a traceback."""
    try:
        yield
    except (ListenFailed, BaseExceptionGroup) as e:
        failed = _listen_failure(e)
        if failed is None:
            raise
        raise SystemExit(f"kfan {command}: {failed}") from None


def _listen_failure(e: BaseException) -> ListenFailed | None:
    if isinstance(e, ListenFailed):
        return e
    if isinstance(e, BaseExceptionGroup):
        for inner in e.exceptions:
            if (found := _listen_failure(inner)) is not None:
                return found
    return None


def _as_worker(options: dict[str, Any]) -> dict[str, Any]:
    """A worker of `--workers N` serves no metrics (its parent does), whatever its config file says."""
    if os.environ.get("KFAN_WORKER") is None:
        return options
    return {**options, "metrics_listen": None, "workers": 1}


def _serve(options: dict[str, Any], flags: Mapping[str, Any]) -> int:
    if not options["bootstrap"]:
        raise SystemExit("kfan serve: --bootstrap (or KFAN_BOOTSTRAP, or bootstrap in the config file) is required")
    options = _as_worker(options)
    try:
        # Checked here, before any worker starts: a bad combination is one message, not N.
        config = _config(options, options["bootstrap"], reuse_port=options["reuse_port"] or os.environ.get("KFAN_WORKER") is not None)
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan serve: {e}") from None
    if options["workers"] > 1:
        with _exit_if_listen_fails("serve"):
            return run_workers(options, flags)

    async def body(nursery: trio.Nursery) -> Running:
        running: Running = await nursery.start(serve, config)
        _reloading(running, options, flags, nursery)
        settle_heap()
        print(
            f"kfan: serving on {running.identity.host}:{running.identity.port}, {len(running.cluster.topology.brokers)} brokers behind it",
            flush=True,
        )
        return running

    with _exit_if_listen_fails("serve"):
        reason = trio.run(_until_signal, body, config.shutdown_timeout_s)
    if reason == LIFELINE_CLOSED and os.environ.get("KFAN_WORKER") is not None:
        leave_metrics_dir(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
    return 0


def settle_heap() -> None:
    """What kfan loaded to start (modules, kio's schemas: over 100,000 objects) lives as long as the
    process: take it out of the cyclic collector's reach. Each full pass over it took about 30 ms of
    CPU, a stall every client shared; per-request objects are freed by reference counting anyway."""
    gc.collect()
    gc.freeze()


def _demo(options: dict[str, Any], flags: Mapping[str, Any]) -> int:
    async def run() -> None:
        async with demo.BrokerProcess(demo.DEMO_BROKERS, [demo.DEMO_TOPIC], log_json=options["log_json"]) as brokers:
            config = _config(options, parse_addresses(brokers.bootstrap))

            async def body(nursery: trio.Nursery) -> Running:
                nursery.start_soon(brokers.watch)
                running: Running = await nursery.start(serve, config)
                _reloading(running, options, flags, nursery)
                settle_heap()
                demo.print_banner(f"{running.identity.host}:{running.identity.port}", running.cluster.topology.leaders.get("demo", {}))
                return running

            await _until_signal(body, config.shutdown_timeout_s)

    try:
        with _exit_if_listen_fails("demo"):
            trio.run(run)
    except demo.BrokersDidNotStart as e:
        raise SystemExit(f"kfan demo: {e}") from None
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "cluster":
        setup_logging(args.log_level, args.log_json)
        ignore_sighup()
        return demo.run_cluster(args, _until_signal)
    if args.command == "users":
        return _users_add(args)
    if args.command == "bench":
        try:
            from proxy.tools.bench.run import run as bench
        except ModuleNotFoundError as e:  # the demo extra: bench drives confluent-kafka clients and the mock cluster
            raise SystemExit(f"kfan bench needs {e.name}: pip install 'kfan[demo]'") from e

        setup_logging("WARNING", False)
        return bench(args)
    if args.command in ("replay", "capture"):
        setup_logging("WARNING", False)
        return _replay(args) if args.command == "replay" else _capture_import(args)
    try:
        options = config.resolve(vars(args))
    except (OSError, ValueError) as e:
        raise SystemExit(f"kfan {args.command}: {e}") from None
    setup_logging(options["log_level"], options["log_json"])
    ignore_sighup()
    return {"serve": _serve, "demo": _demo}[args.command](options, vars(args))


if __name__ == "__main__":
    sys.exit(main())
