"""The options of ``kfan bench`` (kept apart from the bench itself, so ``kfan`` builds its parser without importing a Kafka client)."""

from __future__ import annotations

import argparse

DEFAULT_RECORDS = 12_000_000  # about 2 minutes of throughput phases on 2 cores with the embedded cluster
DEFAULT_PARTITIONS = 24


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"must be 2 or more (a p99 needs two values), got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="measure against this cluster (default: an embedded 3-broker cluster in this process)",
    )
    parser.add_argument("--topic", help="with --bootstrap: use this existing topic (default: create one, deleted at the end)")
    parser.add_argument(
        "--partitions", type=_positive, default=DEFAULT_PARTITIONS, help=f"partitions of the created topic (default {DEFAULT_PARTITIONS})"
    )
    parser.add_argument("--record-size", type=_positive, default=1024, metavar="BYTES", help="record value size (default 1024)")
    parser.add_argument(
        "--records",
        type=_positive,
        default=DEFAULT_RECORDS,
        help=f"records each path produces and consumes in the throughput phases, over all rounds (default {DEFAULT_RECORDS:,})",
    )
    parser.add_argument("--acks", choices=("all", "1", "0"), default="all", help="producer acks (default all)")
    parser.add_argument(
        "--broker-ids",
        choices=("kfan", "cluster"),
        default="kfan",
        help="what kfan shows its clients as brokers (kfan serve --broker-ids; default kfan)",
    )
    parser.add_argument(
        "--duration",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="cap on each path's produce time and consume time, over all rounds; the rates count what moved by then (default 60)",
    )
    parser.add_argument(
        "--latency-records", type=_at_least_two, default=300, help="records per path in the produce latency phase (default 300)"
    )
    parser.add_argument(
        "--slow-fetch-records",
        type=_at_least_two,
        default=300,
        help="records per path in the slow-broker fetch phase (embedded cluster only; default 300)",
    )
    parser.add_argument(
        "--clients",
        type=int,
        default=0,
        metavar="N",
        help="then connect N clients at once to kfan and measure its memory (default 0: skip)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line on stdout")
