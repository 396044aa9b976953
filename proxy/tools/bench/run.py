"""``kfan bench``: set up, run every phase on both paths, report, clean up.

The brokers and topic come from :mod:`.target`, kfan is a ``kfan serve``
child started here (:mod:`.processes`), the phases are in :mod:`.measure` and
:mod:`.slow_fetch`, the figures and their printing in :mod:`.report`. Progress
goes to stderr; the table and the JSON line to stdout.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import time
from contextlib import AbstractContextManager, ExitStack
from typing import TextIO

from proxy.tools.bench import measure, report, slow_fetch
from proxy.tools.bench.errors import BenchError
from proxy.tools.bench.measure import Moved
from proxy.tools.bench.processes import ROOT, SERVING, Kfan, cpu_seconds, start_kfan
from proxy.tools.bench.target import Target, embedded, external

PATHS = ("direct", "kfan")
# librdkafka's mock keeps about 5 MB per partition and drops older records: a
# round writes less, so that what it wrote is still there when it is read back.
RUN_BYTES_PER_PARTITION = 2_000_000
TTY_REFRESH_S = 0.1
PLAIN_REFRESH_S = 15.0  # without a terminal, a running phase still says it is alive now and then


class Progress:
    """One line per phase on stderr: rewritten in place on a terminal (cut to its width), plain lines otherwise.

    Without a terminal a phase prints its start, its end, and every
    PLAIN_REFRESH_S an update, so a log shows it is alive.
    """

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.phase = ""
        self._last = 0.0

    def start(self, phase: str, about: str) -> None:
        self.phase = phase
        self._last = time.monotonic()
        self._write(f"{phase}: {about} ...", final=not self.tty)

    def update(self, text: str) -> None:
        now = time.monotonic()
        if now - self._last < (TTY_REFRESH_S if self.tty else PLAIN_REFRESH_S):
            return
        self._last = now
        self._write(f"{self.phase}: {text}", final=not self.tty)

    def say(self, text: str) -> None:
        """Like update, but every line is shown: for phases that already say little."""
        self._last = time.monotonic()
        self._write(f"{self.phase}: {text}", final=not self.tty)

    def done(self, text: str) -> None:
        self._write(f"{self.phase}: {text}", final=True)

    def note(self, text: str) -> None:
        self._write(text, final=True)

    def _write(self, text: str, final: bool) -> None:
        if self.tty:
            if not final:
                # A line longer than the terminal wraps, and the carriage return would rewrite only its last row.
                text = text[: shutil.get_terminal_size().columns - 1]
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def run(args: argparse.Namespace) -> int:
    if args.topic and not args.bootstrap:
        raise SystemExit("kfan bench: --topic needs --bootstrap (the embedded cluster gets a topic of its own)")
    if args.clients < 0:
        raise SystemExit("kfan bench: --clients must be 0 or more")
    progress = Progress(sys.stderr)
    started = time.monotonic()
    try:
        result, context = _measure(args, progress)
    except BenchError as e:
        progress.note(f"kfan bench: failed: {e}")
        return 1
    except KeyboardInterrupt:
        progress.note("kfan bench: interrupted")
        return 130
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    progress.note(f"kfan bench: done in {result['elapsed_s']:.0f} s")
    if not args.json:
        print(report.table(result, context))
    print(report.json_line(result), flush=True)
    return 0


def _measure(args: argparse.Namespace, progress: Progress) -> tuple[report.Result, list[str]]:
    with ExitStack() as stack:
        progress.start("setup", "brokers, topic, kfan")
        where: AbstractContextManager[Target] = (
            embedded(args.partitions) if args.bootstrap is None else external(args.bootstrap, args.partitions, args.topic)
        )
        target = stack.enter_context(where)
        try:
            kfan = start_kfan(target.bootstrap, "--broker-ids", args.broker_ids, log_level="WARNING", cwd=ROOT)
        except RuntimeError as e:
            raise BenchError(str(e)) from None
        stack.callback(_stop, kfan, progress)  # before the brokers go (the stack unwinds in reverse)
        brokers = (
            f"embedded cluster: {target.brokers} brokers (librdkafka's mock, in this process)"
            if target.kind == "embedded"
            else f"cluster at {target.bootstrap}: {target.brokers} brokers"
        )
        progress.done(f"{target.topic}, {target.partitions} partitions ({target.topic_note}); kfan at {kfan.bootstrap}")
        paths = {"direct": target.bootstrap, "kfan": kfan.bootstrap}

        result: report.Result = {
            "bootstrap_kind": target.kind,
            "bootstrap": target.bootstrap if target.kind == "external" else None,
            "brokers": target.brokers,
            "topic": target.topic,
            "partitions": target.partitions,
            "record_size": args.record_size,
            "records": args.records,
            "rounds": None,  # set once run
            "acks": args.acks,
            "broker_ids": args.broker_ids,
            "duration_cap_s": args.duration,
            "latency_records": args.latency_records,
            "slow_fetch_records": args.slow_fetch_records if target.kind == "embedded" else None,
            "cpus": os.cpu_count(),
        }
        result["rounds"], produced, consumed = _throughput(args, target, kfan, paths, progress)
        result |= report.throughput_figures("produce", produced["direct"], produced["kfan"])
        result |= report.throughput_figures("consume", consumed["direct"], consumed["kfan"])

        progress.start("latency", f"{args.latency_records} produce calls per path, one 100 B record each, paths alternating")
        latencies = measure.produce_latency(paths, target.topic, target.partitions, args.latency_records, args.acks, progress.update)
        _check(kfan, "produce latency")
        result |= report.latency_figures("latency", latencies)
        progress.done(_p50s(result, "latency"))

        slow: dict[str, list[float]] | None = None
        if target.kind == "embedded":
            progress.start(
                "slow fetch",
                f"consumer latency, {args.slow_fetch_records} records per path; own cluster and kfan, brokers 2, 3 answer Fetch"
                f" {slow_fetch.SLOW_MS} ms late",
            )
            slow = slow_fetch.measure(args.slow_fetch_records, progress.update, args.broker_ids)
        result |= report.latency_figures("slow_fetch", slow)
        if slow is not None:
            progress.done(_p50s(result, "slow_fetch"))

        if args.clients:
            result |= _many_clients(args, target, kfan, progress)
        context = [
            f"kfan bench: {brokers}; kfan: one process ({kfan.bootstrap}, pid {kfan.pid}, --broker-ids {args.broker_ids}) from {ROOT}",
            f"topic {target.topic}: {target.partitions} partitions ({target.topic_note})",
            f"{args.records:,} records of {args.record_size} B (+{measure.KEY_BYTES} B key) per path, acks={args.acks},"
            f" in {result['rounds']} rounds of produce then consume, the first path swapped every round; {os.cpu_count()} CPUs",
        ]
        if any(result[f"{k}_records_{p}"] < args.records for k in ("produce", "consume") for p in PATHS):
            context.append(
                f"--duration {args.duration:g} s reached: "
                + ", ".join(f"{k} {p} {result[f'{k}_records_{p}']:,} records" for k in ("produce", "consume") for p in PATHS)
            )
        return result, context
    raise AssertionError("unreachable")  # pragma: no cover (ExitStack does not swallow exceptions here)


def _throughput(
    args: argparse.Namespace, target: Target, kfan: Kfan, paths: dict[str, str], progress: Progress
) -> tuple[int, dict[str, list[Moved]], dict[str, list[Moved]]]:
    """Rounds of produce-then-consume per path; the rounds executed and every timed run.

    The path that goes first alternates every round, so slow drift (caches,
    heat, a neighbour) favours neither. A round writes at most
    RUN_BYTES_PER_PARTITION per partition and path, which the brokers must
    still hold when it is read back. Rounds stop early once a path has spent
    ``--duration`` seconds producing or consuming.
    """
    record_bytes = args.record_size + measure.KEY_BYTES
    per_round = max(1, min(args.records, target.partitions * RUN_BYTES_PER_PARTITION // record_bytes))
    rounds = min(args.records, max(2, math.ceil(args.records / per_round)))
    produced: dict[str, list[Moved]] = {p: [] for p in PATHS}
    consumed: dict[str, list[Moved]] = {p: [] for p in PATHS}
    progress.start("throughput", f"{args.records:,} records per path in {rounds} rounds, produce then consume, paths alternating")
    offsets = measure.EndOffsets(target.bootstrap, target.topic, target.partitions)
    clients: dict[str, measure.Path] = {}
    done = 0
    try:
        for name in PATHS:
            cpu = (lambda: cpu_seconds(kfan.pid)) if name == "kfan" else None
            clients[name] = measure.Path(name, paths[name], target.topic, target.partitions, args.acks, args.record_size, cpu)
            clients[name].warm_up(offsets)
        for r in range(rounds):
            spent = max(sum(m.seconds for m in runs[name]) for runs in (produced, consumed) for name in PATHS)
            if spent >= args.duration:
                progress.note(f"throughput: stopped after {r} of {rounds} rounds: --duration {args.duration:g} s reached")
                break
            records = args.records // rounds + (1 if r < args.records % rounds else 0)

            def update(text: str, r: int = r) -> None:
                progress.update(f"round {r + 1}/{rounds}: {text}")

            for name in PATHS if r % 2 == 0 else PATHS[::-1]:
                path = clients[name]
                left = args.duration - sum(m.seconds for m in produced[name])
                written = path.produce(records, offsets, left, update)
                _check(kfan, f"produce ({name})")
                produced[name].append(written.moved)
                left = args.duration - sum(m.seconds for m in consumed[name])
                consumed[name].append(path.consume(written.ranges, left, update))
                _check(kfan, f"consume ({name})")
            done = r + 1
    finally:
        for path in clients.values():
            path.close()
        offsets.close()
    progress.done(
        f"{done} rounds; produce "
        + ", ".join(f"{n} {report.mbps(produced[n]):.1f} MB/s" for n in PATHS)
        + "; consume "
        + ", ".join(f"{n} {report.mbps(consumed[n]):.1f} MB/s" for n in PATHS)
    )
    return done, produced, consumed


def _many_clients(args: argparse.Namespace, target: Target, kfan: Kfan, progress: Progress) -> report.Result:
    try:
        from proxy.tools.bench.clients import many_clients
    except ImportError as e:
        raise BenchError(f"--clients: the many-clients phase is not available ({e})") from None
    progress.start("clients", f"{args.clients} connections to kfan at once")
    figures = many_clients(kfan.host, kfan.port, kfan.pid, target.topic, target.partitions, args.clients, progress.say)
    _check(kfan, "many clients")
    progress.done(", ".join(f"{k} {v}" for k, v in figures.items()))
    return report.clients_figures(figures)


def _p50s(result: report.Result, prefix: str) -> str:
    return (
        f"p50 direct {result[f'{prefix}_p50_ms_direct']} ms, kfan {result[f'{prefix}_p50_ms_kfan']} ms,"
        f" overhead {result[f'{prefix}_p50_overhead_ms']} ms"
    )


def _check(kfan: Kfan, phase: str) -> None:
    if not kfan.alive():
        raise BenchError(f"{phase}: kfan exited ({kfan.process.returncode}); its last lines:\n" + "".join(kfan.log[-30:]))


def _stop(kfan: Kfan, progress: Progress) -> None:
    code = kfan.stop()
    # It logs at WARNING: whatever it said is worth showing next to the figures.
    said = [line for line in kfan.log if not re.match(SERVING, line)]
    if said:
        progress.note(f"kfan logged {len(said)} lines (WARNING and above); the last:\n" + "".join(said[-10:]).rstrip())
    if code not in (0, None):
        progress.note(f"kfan bench: kfan exited with status {code} when stopped")
