"""A long fuzz campaign: ``python -m tests.fuzz --cases N [--answers M] [--sasl L] [--held H] [--seed S] [--seconds T] [--jobs J]``.

Runs N client-frame cases (target a), M broker-answer cases (target b, one in
eight on the control plane's decoders), SASL logins both ways (target c',
``--sasl``), state clients grow (target d: caches, kept sub-fetches, ``--held``) and, unless ``--no-large``, one pass of
huge valid requests (quadratic work). Cases are split over J processes; case
``i`` of seed ``S`` is the same input whatever J is. Prints the inputs tried
per target, every distinct finding with its first reproducers (hex) and a
traceback, the slowest input and the peak memory. Exits 1 if anything
unexpected happened.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from . import broker_answers, client_frames, held_state, sasl
from .harness import HANG_SECONDS, SLOW_SECONDS, SLOW_SECONDS_PER_MB, Tally


def _work(job: tuple[str, str, int, int, int, float | None, float]) -> tuple[Tally, int]:
    target, seed, start, stop, step, seconds, hang = job
    deadline = None if seconds is None else time.monotonic() + seconds
    tally = Tally()
    indexes = range(start, stop, step)
    if target == "client":
        client_frames.campaign(seed, indexes, tally, hang, deadline)
    elif target == "answers":
        broker_answers.campaign(seed, indexes, tally, hang, deadline)
    elif target == "sasl":
        sasl.campaign(seed, indexes, tally, hang, deadline)
    elif target == "held":
        held_state.campaign(seed, indexes, tally, hang, deadline)
    else:
        broker_answers.large_campaign(tally, hang)
    return tally, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=None, help="client-frame cases (target a); default 200000, unbounded with --seconds")
    p.add_argument("--answers", type=int, default=None, help="broker-answer cases (target b); default: cases / 4")
    p.add_argument("--sasl", type=int, default=None, help="SASL cases (target c': logins both ways); default: cases / 20")
    p.add_argument("--held", type=int, default=None, help="held-state cases (target d: caches, kept sub-fetches); default: cases / 20")
    p.add_argument("--seed", default="0", help="campaign seed (any string)")
    p.add_argument(
        "--seconds", type=float, default=None, help="stop each target's cases after this long (the huge-request pass is not cut short)"
    )
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    p.add_argument("--hang", type=float, default=HANG_SECONDS, help="watchdog: stop any single call after this many seconds")
    p.add_argument("--no-large", action="store_true", help="skip the pass of huge valid requests")
    p.add_argument("--examples", type=int, default=3, help="reproducers printed per finding")
    args = p.parse_args(argv)
    cases = args.cases if args.cases is not None else (10**12 if args.seconds is not None else 200_000)
    answers = args.answers if args.answers is not None else cases // 4
    logins = args.sasl if args.sasl is not None else cases // 20
    held = args.held if args.held is not None else cases // 20
    jobs = max(1, args.jobs)
    work: list[tuple[str, str, int, int, int, float | None, float]] = []
    if not args.no_large:
        work.append(("large", args.seed, 0, 0, 1, None, args.hang))  # first: it overlaps the rest
    for target, n in (("client", cases), ("answers", answers), ("sasl", logins), ("held", held)):
        if n > 0:
            work.extend((target, args.seed, j, n, jobs, args.seconds, args.hang) for j in range(jobs))
    counts = (
        f"{cases} client cases, {answers} answer cases, {logins} SASL cases, {held} held-state cases"
        if args.cases is not None or args.seconds is None
        else "cases"
    )
    limit = f" (at most {args.seconds} s per target)" if args.seconds is not None else ""
    print(
        f"fuzz campaign: seed {args.seed!r}, {counts}{limit}, {jobs} processes, slow > {SLOW_SECONDS} s (+{SLOW_SECONDS_PER_MB} s per MB of a huge input), watchdog {args.hang} s",
        flush=True,
    )
    started = time.monotonic()
    total = Tally()
    peak_kib = 0
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for tally, rss in pool.map(_work, work):
            total.merge(tally)
            peak_kib = max(peak_kib, rss)
    elapsed = time.monotonic() - started
    print(total.report(args.examples))
    print(f"peak memory (max RSS of a worker): {peak_kib / 1024:.1f} MiB")
    print(f"elapsed: {elapsed:.1f} s")
    bad = total.unexpected()
    print(f"unexpected: {bad}" + (" -- FAIL" if bad else " -- ok"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
