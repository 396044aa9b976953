"""The ``kfan`` command: serve, demo, cluster."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence

import trio

from backends.cluster import parse_address

from .connection import Limits
from .frames import DEFAULT_MAX_FRAME_BYTES
from .server import Running, ServerConfig, serve

log = logging.getLogger("kfan")


def _addresses(text: str) -> list[tuple[str, int]]:
    return [parse_address(a) for a in text.split(",") if a.strip()]


def _address(text: str) -> tuple[str, int]:
    return parse_address(text)


def _topic(text: str) -> tuple[str, int]:
    name, _, partitions = text.rpartition(":")
    if not name or not partitions.isdigit() or int(partitions) < 1:
        raise argparse.ArgumentTypeError(f"expected NAME:PARTITIONS, got {text!r}")
    return name, int(partitions)


def _add_serve_options(p: argparse.ArgumentParser, listen_default: str) -> None:
    p.add_argument(
        "--listen",
        type=_address,
        default=_address(listen_default),
        metavar="HOST:PORT",
        help=f"where clients connect (default {listen_default})",
    )
    p.add_argument(
        "--advertise",
        type=_address,
        default=None,
        metavar="HOST:PORT",
        help="the address clients are told to use (default: the listen address)",
    )
    p.add_argument("--node-id", type=int, default=0, help="the node id kfan reports as its own (default 0)")
    p.add_argument("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES, help="largest request accepted (default 100 MiB)")
    p.add_argument("--metadata-refresh", type=float, default=30.0, metavar="SECONDS", help="topology refresh interval (default 30)")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kfan", description="A stateless Kafka protocol proxy: one endpoint in front of a multi-broker cluster."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the proxy in front of a Kafka cluster")
    s.add_argument("--bootstrap", type=_addresses, required=True, metavar="HOST:PORT[,HOST:PORT...]", help="brokers to bootstrap from")
    _add_serve_options(s, "127.0.0.1:9092")
    d = sub.add_parser("demo", help="run an embedded 3-broker cluster with kfan in front of it")
    _add_serve_options(d, "127.0.0.1:9092")
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
    c.add_argument("--log-level", default="INFO")
    return parser


def _config(args: argparse.Namespace, bootstrap: list[tuple[str, int]]) -> ServerConfig:
    return ServerConfig(
        bootstrap=bootstrap,
        listen=args.listen,
        advertise=args.advertise,
        node_id=args.node_id,
        metadata_refresh_s=args.metadata_refresh,
        limits=Limits(max_frame_bytes=args.max_frame_bytes),
    )


async def _until_signal(body: Callable[[trio.Nursery], object]) -> None:
    """Run until SIGINT or SIGTERM, then cancel everything cleanly."""
    async with trio.open_nursery() as nursery:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            await body(nursery)  # type: ignore[misc]
            async for signum in signals:
                log.info("received %s, stopping", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


def _serve(args: argparse.Namespace) -> int:
    config = _config(args, args.bootstrap)

    async def body(nursery: trio.Nursery) -> None:
        running: Running = await nursery.start(serve, config)
        print(
            f"kfan: serving on {running.identity.host}:{running.identity.port}, {len(running.cluster.topology.brokers)} brokers behind it",
            flush=True,
        )

    trio.run(_until_signal, body)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from backends.mock import MockCluster

    with MockCluster(3) as mock:
        mock.create_topic("demo", 6)
        config = _config(args, _addresses(mock.bootstrap))

        async def body(nursery: trio.Nursery) -> None:
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

        trio.run(_until_signal, body)
    return 0


def _cluster(args: argparse.Namespace) -> int:
    from backends.mock import MockCluster

    with MockCluster(args.brokers) as mock:
        for name, partitions in args.topic:
            mock.create_topic(name, partitions)
        print(f"kfan cluster: {args.brokers} brokers at {mock.bootstrap}", flush=True)
        for name, partitions in args.topic:
            print(f"  topic {name}: {partitions} partitions, leaders round-robin", flush=True)
        print(f"Run: kfan serve --bootstrap {mock.bootstrap}", flush=True)

        async def body(nursery: trio.Nursery) -> None:
            return None

        trio.run(_until_signal, body)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return {"serve": _serve, "demo": _demo, "cluster": _cluster}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
