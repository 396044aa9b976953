"""Reconnect backoff and failure-log limits per broker, shared by every link to it.

A broker that cannot be reached is tried again after a delay that doubles
with each failed attempt, as Kafka's clients do (``reconnect.backoff.ms`` 50,
``reconnect.backoff.max.ms`` 1000, ±20% jitter), so an outage costs a few
connection attempts per second per broker, not one per client request. The
state is per broker address and shared by all of kfan's links to it (every
client connection's, and the control plane's): while it backs off, a link is
not opened and the request gets the retriable error an unreachable broker
gives it. When the delay has passed, one attempt goes ahead; the others keep
failing at once until it ends. A link that becomes ready (connected, and
logged in where it logs in) resets the backoff (:func:`.transport.settle`
tells the attempt how the link's opening ended).

Only reaching the broker counts: a login the broker refuses is one identity's
failure (``--broker-identity client``), not the broker's, and changes nothing.

Lines about a broker failing are limited the same way (:class:`FailureLog`):
one per broker per interval, with the count of those left out.

And the TCP handshakes under way to one broker are bounded (:func:`connecting`,
``CONNECTS_AT_ONCE``): kfan opens links for many clients, and when a broker
comes back or leadership moves, hundreds of them at once. A broker's listen
backlog (Kafka's ``socket.listen.backlog.size``, 50) drops the SYNs past it,
and each dropped one costs a retransmit of 1 s, then 3 s, then 7 s, which
ran past the connect timeout: 500 connects at once to a broker of the suite
had 326 wait over a second; 16 at a time, all 500 were in within 0.47 s.

The logic is pure (an injected clock and random source); :func:`reconnects`
and :func:`failure_log` hand out the instances of the running trio run, which
is the process's, and in tests each run's own.
"""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator, Callable, Hashable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import trio

from proxy.runtime import metrics

RECONNECT_BACKOFF_S = 0.05  # Kafka's reconnect.backoff.ms
RECONNECT_BACKOFF_MAX_S = 1.0  # Kafka's reconnect.backoff.max.ms
JITTER = 0.2  # Kafka's clients: ±20% of each delay
FAILURE_LOG_INTERVAL_S = 10.0
# TCP handshakes under way to one broker address per process: well under Kafka's listen backlog (50), so a
# few processes (--workers) together stay under it too.
CONNECTS_AT_ONCE = 16


@dataclass
class _State:
    failures: int = 0  # consecutive rounds of failed attempts
    retry_at: float = -math.inf
    round: int = 0  # attempts granted in one round fail as one
    trying: bool = False  # the attempt after a backoff is out


class Attempt:
    """One granted connection attempt: say how it ended, once."""

    __slots__ = ("_backoff", "_key", "_round", "_trial", "_ended")

    def __init__(self, backoff: ReconnectBackoff, key: Hashable, round_: int, trial: bool) -> None:
        self._backoff = backoff
        self._key = key
        self._round = round_
        self._trial = trial
        self._ended = False

    def connected(self) -> None:
        if not self._end():
            self._backoff._connected(self._key)

    def failed(self) -> None:
        if not self._end():
            self._backoff._failed(self._key, self._round, self._trial)

    def abandoned(self) -> None:
        """Cancelled before it could tell (the client left): neither success nor failure."""
        if not self._end():
            self._backoff._abandoned(self._key, self._trial)

    def _end(self) -> bool:
        ended, self._ended = self._ended, True
        return ended


class ReconnectBackoff:
    def __init__(
        self,
        *,
        initial: float = RECONNECT_BACKOFF_S,
        maximum: float = RECONNECT_BACKOFF_MAX_S,
        jitter: float = JITTER,
        clock: Callable[[], float],
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.jitter = jitter
        self._clock = clock
        self._rng = rng
        self._states: dict[Hashable, _State] = {}

    def attempt(self, key: Hashable) -> Attempt | None:
        """Leave to connect to ``key`` now; None while it backs off (or its one attempt after the backoff is out)."""
        state = self._states.get(key)
        if state is None:
            return Attempt(self, key, 0, False)
        if state.trying or self._clock() < state.retry_at:
            return None
        state.trying = True
        return Attempt(self, key, state.round, True)

    def retry_in(self, key: Hashable) -> float:
        """Seconds until ``key`` may be tried again (0: now)."""
        state = self._states.get(key)
        return 0.0 if state is None else max(0.0, state.retry_at - self._clock())

    def delay(self, failures: int) -> float:
        """The backoff after ``failures`` consecutive failed rounds, jittered and capped, as Kafka's ExponentialBackoff."""
        term = self.initial * 2 ** min(failures - 1, 64)
        factor = 1 - self.jitter + 2 * self.jitter * self._rng()
        return min(term * factor, self.maximum)

    def _connected(self, key: Hashable) -> None:
        self._states.pop(key, None)

    def _failed(self, key: Hashable, round_: int, trial: bool) -> None:
        state = self._states.setdefault(key, _State())
        if trial:
            state.trying = False
        if round_ != state.round:
            return  # an attempt of a round already counted (many links failed at once)
        state.round += 1
        state.failures += 1
        state.retry_at = self._clock() + self.delay(state.failures)

    def _abandoned(self, key: Hashable, trial: bool) -> None:
        state = self._states.get(key)
        if trial and state is not None:
            state.trying = False


def backed_off(broker: int) -> None:
    """A link to ``broker`` not opened: kfan backs off from it."""
    metrics.BROKER_CONNECTS.labels(str(broker), "backed_off").inc()


class FailureLog:
    """At most one line per key per ``interval``; the lines left out are counted for the next one."""

    def __init__(self, *, interval: float = FAILURE_LOG_INTERVAL_S, clock: Callable[[], float]) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[Hashable, tuple[float, int]] = {}  # key -> (last logged at, left out since)

    def note(self, key: Hashable) -> int | None:
        """A failure of ``key``: None to leave its line out, else how many were left out since the last one."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.interval:
            self._last[key] = (last[0], last[1] + 1)
            return None
        self._last[key] = (now, 0)
        return 0 if last is None else last[1]


def left_out(count: int) -> str:
    """The suffix of a line that stands for others: ' (and 312 more failures since)'."""
    return f" (and {count} more failure{'s' if count != 1 else ''} since)" if count else ""


@asynccontextmanager
async def connecting(key: Hashable) -> AsyncIterator[None]:
    """Hold one of ``key``'s ``CONNECTS_AT_ONCE`` places for a TCP handshake (waiting for one if all are taken)."""
    limiters = _run_local(_CONNECTING, dict[Hashable, trio.CapacityLimiter])
    limiter = limiters.get(key)
    if limiter is None:
        limiter = limiters[key] = trio.CapacityLimiter(CONNECTS_AT_ONCE)
    try:
        async with limiter:
            yield
    finally:
        if limiter.borrowed_tokens == 0 and limiter.statistics().tasks_waiting == 0 and limiters.get(key) is limiter:
            del limiters[key]  # nothing under way: an address no broker has any more is not kept


_RECONNECTS: trio.lowlevel.RunVar[ReconnectBackoff] = trio.lowlevel.RunVar("kfan_reconnects")
_FAILURE_LOG: trio.lowlevel.RunVar[FailureLog] = trio.lowlevel.RunVar("kfan_failure_log")
_CONNECTING: trio.lowlevel.RunVar[dict[Hashable, trio.CapacityLimiter]] = trio.lowlevel.RunVar("kfan_connecting")
T = TypeVar("T")


def reconnects() -> ReconnectBackoff:
    """This run's (the process's) reconnect backoff, by broker address."""
    return _run_local(_RECONNECTS, lambda: ReconnectBackoff(clock=trio.current_time))


def failure_log() -> FailureLog:
    """This run's (the process's) limit on lines about failing brokers, by broker address."""
    return _run_local(_FAILURE_LOG, lambda: FailureLog(clock=trio.current_time))


def _run_local(var: trio.lowlevel.RunVar[T], make: Callable[[], T]) -> T:
    try:
        return var.get()
    except LookupError:
        value = make()
        var.set(value)
        return value
