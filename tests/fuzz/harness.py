"""What the fuzz targets share: running one input under a contract, a watchdog, and the tally.

A *finding* is an input that broke a contract: an exception the contract
does not allow, a call that takes more than :data:`SLOW_SECONDS` of CPU time
(quadratic work on hostile input; CPU time, not the wall clock, which on a
loaded machine counts seconds spent waiting for a core), a call still running after the watchdog's limit, or an
output that breaks an invariant. Findings are grouped by *signature*:
target, kind, exception type and the innermost frame of kfan's own code.
"""

from __future__ import annotations

import contextlib
import signal
import struct
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SLOW_SECONDS = 1.0  # any single plan or merge taking more CPU time than this is a finding
# ...plus this much per MB of input: decoding and encoding a huge valid input runs at about 1 µs a byte,
# linear work; quadratic work on the 16,000 elements of such an input costs minutes, far past the bound.
SLOW_SECONDS_PER_MB = 2.0
HANG_SECONDS = 20.0  # the watchdog (wall clock) stops a call after this long
KEEP = 3  # reproducers kept per signature


class Hang(BaseException):
    """Raised by the watchdog inside a call that ran too long (a BaseException: kfan's ``except Exception`` must not eat it)."""


class Broken(Exception):
    """An output that breaks an invariant (raised by the fuzz targets' own checks)."""


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Interrupt the block with :class:`Hang` after ``seconds`` (main thread only; elsewhere a no-op)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Finding:
    target: str
    kind: str  # "exception", "slow", "hang" or "broken"
    error: str  # exception type and message
    location: str  # innermost frame in kfan's code
    reproducer: dict[str, str]  # hex of the input(s)
    trace: str
    seconds: float
    case: int

    @property
    def signature(self) -> tuple[str, str, str, str]:
        where = self.location
        if self.kind in ("hang", "slow"):
            where = where.rsplit(" v", 1)[0]  # one finding per API, whatever the version
        return (self.target, self.kind, self.error.split(":", 1)[0], where)


@dataclass
class Tally:
    """Per-target totals of a campaign; merged across worker processes."""

    inputs: dict[str, int] = field(default_factory=dict)
    counts: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    examples: dict[tuple[str, str, str, str], list[Finding]] = field(default_factory=dict)
    slowest: tuple[float, str, str, int] = (0.0, "", "", -1)  # seconds, target, hex prefix, case

    def count(self, target: str, n: int = 1) -> None:
        self.inputs[target] = self.inputs.get(target, 0) + n

    def add(self, finding: Finding) -> None:
        sig = finding.signature
        self.counts[sig] = self.counts.get(sig, 0) + 1
        kept = self.examples.setdefault(sig, [])
        if len(kept) < KEEP:
            kept.append(finding)

    def timed(self, seconds: float, target: str, reproducer: dict[str, str], case: int) -> None:
        if seconds > self.slowest[0]:
            first = next(iter(reproducer.values()), "")
            self.slowest = (seconds, target, first[:64], case)

    def merge(self, other: Tally) -> None:
        for k, v in other.inputs.items():
            self.inputs[k] = self.inputs.get(k, 0) + v
        for sig, n in other.counts.items():
            self.counts[sig] = self.counts.get(sig, 0) + n
            kept = self.examples.setdefault(sig, [])
            kept.extend(other.examples.get(sig, [])[: KEEP - len(kept)])
        if other.slowest[0] > self.slowest[0]:
            self.slowest = other.slowest

    def unexpected(self) -> int:
        return sum(self.counts.values())

    def report(self, examples: int = KEEP) -> str:
        lines = []
        for target, n in sorted(self.inputs.items()):
            bad = sum(c for sig, c in self.counts.items() if sig[0] == target)
            lines.append(f"{target:>16}: {n} inputs, {bad} findings")
        for sig, n in sorted(self.counts.items(), key=lambda kv: -kv[1]):
            target, kind, error, location = sig
            lines.append(f"\n[{kind}] {target}: {error} at {location} -- {n} inputs")
            for f in self.examples[sig][:examples]:
                lines.append(f"  case {f.case} ({f.seconds:.3f} s, {f.location}): {f.error[:200]}")
                for name, hexed in f.reproducer.items():
                    lines.append(f"    {name}: {hexed if len(hexed) <= 600 else hexed[:600] + f'... ({len(hexed) // 2} bytes)'}")
            lines.append("  " + self.examples[sig][0].trace.rstrip().replace("\n", "\n  "))
        seconds, target, prefix, case = self.slowest
        lines.append(f"\nslowest input: {seconds:.3f} s, {target}, case {case}, {prefix}")
        return "\n".join(lines)


_CODEC = ("proxy/kafka/wire.py", "proxy/kafka/schema.py", "proxy/kafka/headers.py")


def location(exc: BaseException) -> str:
    """Where in kfan's code (proxy/, backends/) the exception came from: the entry point called,
    then the innermost frame outside the codec (wire, schema, headers) when it differs. The codec
    raises Malformed from many places; a finding is the code that let it escape."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if str(ROOT) in f.filename and any(f"/{d}/" in f.filename for d in ("proxy", "backends"))]
    if not ours:
        return _where(frames[-1]) if frames else "?"
    outer = [f for f in ours if not any(f.filename.endswith(c) for c in _CODEC)]
    chain = [ours[0], outer[-1] if outer else ours[-1]]
    out: list[str] = []
    for f in chain:
        if _where(f) not in out:
            out.append(_where(f))
    return " > ".join(out)


def _where(f: traceback.FrameSummary) -> str:
    name = str(Path(f.filename).relative_to(ROOT)) if str(ROOT) in f.filename else f.filename
    return f"{name}:{f.lineno} {f.name}"


def check(
    tally: Tally,
    target: str,
    case: int,
    reproducer: Callable[[], dict[str, str]],
    allowed: tuple[type[BaseException], ...],
    fn: Callable[[], Any],
    *,
    hang_seconds: float = HANG_SECONDS,
    slow_seconds: float = SLOW_SECONDS,
    input_bytes: int = 0,
    label: Callable[[], str] | None = None,
) -> tuple[bool, Any]:
    """Run ``fn`` once under the contract; returns (it returned normally, its result).

    Allowed exceptions are outcomes, not findings; anything else, a hang or a
    slow call (over ``slow_seconds``, plus :data:`SLOW_SECONDS_PER_MB` for each MB of
    ``input_bytes``) is recorded in ``tally``. Hangs and slow calls are grouped by
    ``label()`` (what the input is, e.g. its API), not by where the watchdog
    happened to interrupt them.
    """
    start = time.perf_counter()
    cpu_start = time.thread_time()
    error: BaseException | None = None
    result = None
    ok = True
    try:
        with watchdog(hang_seconds):
            result = fn()
    except allowed:
        ok = False
    except (Exception, Hang, RecursionError) as e:
        error = e
    seconds = time.perf_counter() - start
    cpu = time.thread_time() - cpu_start
    tally.timed(cpu, target, _lazy(reproducer) if cpu > tally.slowest[0] else {}, case)
    if error is not None:
        kind = "hang" if isinstance(error, Hang) else "broken" if isinstance(error, Broken) else "exception"
        trace = "".join(traceback.format_exception(error)[-12:])
        where = location(error)
        message = f"{type(error).__name__}: {error}"
        if kind == "hang":
            where, message = (label() if label else "?"), f"{message}, interrupted at {where}"
        tally.add(Finding(target, kind, message, where, reproducer(), trace, seconds, case))
        return False, None
    if cpu > slow_seconds + SLOW_SECONDS_PER_MB * input_bytes / 1e6:
        tally.add(Finding(target, "slow", f"Slow: {cpu:.2f} s of CPU", label() if label else "?", reproducer(), "", cpu, case))
    return ok, result


def api_label(payload: bytes | memoryview) -> str:
    """ "Name vN" of a request payload's api key and version (as far as its first bytes tell)."""
    if len(payload) < 4:
        return "(no header)"
    key, version = struct.unpack_from(">hh", payload)
    try:
        from proxy.kafka.apis import api_name

        return f"{api_name(key)} v{version}"
    except Exception:
        return f"api_key {key} v{version}"


def _lazy(reproducer: Callable[[], dict[str, str]]) -> dict[str, str]:
    return reproducer()
