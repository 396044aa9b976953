"""Reconnect backoff and the failure-log limit (:mod:`backends.backoff`), on a virtual clock and seeded randomness;
and how a link's opening is told to the backoff (:func:`backends.transport.settle`).

The delays are Kafka's clients' (``reconnect.backoff.ms`` 50, ``reconnect.backoff.max.ms``
1000, ±20% jitter); the state is per broker address and shared by every link to it.
The process-level behaviour (an outage behind a real kfan) is in tests/test_process_signals.py.
"""

from __future__ import annotations

import os
import random

import pytest
import trio
import trio.testing

from backends import backoff, transport
from backends.backoff import Attempt, FailureLog, ReconnectBackoff, left_out
from backends.link import LinkError
from backends.sasl import AuthenticationFailed
from tests.support.sockets import tcp_sockets
from tests.support.waiting import wait_for_async

BROKER = ("broker-1", 9092)
OTHER = ("broker-2", 9092)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backoff_on(clock: Clock, seed: int = 7) -> ReconnectBackoff:
    return ReconnectBackoff(clock=clock, rng=random.Random(seed).random)


def granted(b: ReconnectBackoff) -> Attempt:
    attempt = b.attempt(BROKER)
    assert attempt is not None, "an attempt should be allowed now"
    return attempt


def backed_off_once(clock: Clock) -> ReconnectBackoff:
    """A backoff whose broker failed once, and whose delay has passed: the next attempt is the trial."""
    b = backoff_on(clock)
    granted(b).failed()
    clock.now += 1
    return b


def test_delays_double_from_50_ms_to_1_s_within_20_percent() -> None:
    b = ReconnectBackoff(clock=Clock(), rng=random.Random(1).random)
    for failures, term in [(1, 0.05), (2, 0.1), (3, 0.2), (4, 0.4), (5, 0.8)]:
        delays = [b.delay(failures) for _ in range(200)]
        assert all(0.8 * term <= d <= 1.2 * term for d in delays), (failures, min(delays), max(delays))
        assert max(delays) - min(delays) > 0.2 * term, "jittered, not constant"
    assert all(b.delay(n) <= 1.0 for n in (6, 7, 50, 10_000)), "capped at reconnect.backoff.max.ms"
    assert min(b.delay(10_000) for _ in range(200)) >= 0.8


def test_edges_of_the_jitter() -> None:
    assert ReconnectBackoff(clock=Clock(), rng=lambda: 0.0).delay(3) == pytest.approx(0.16)
    assert ReconnectBackoff(clock=Clock(), rng=lambda: 1.0).delay(3) == pytest.approx(0.24)


def test_a_failed_connect_holds_every_link_off_until_the_delay_passes() -> None:
    clock = Clock()
    b = backoff_on(clock)
    granted(b).failed()
    wait = b.retry_in(BROKER)
    assert 0.04 <= wait <= 0.06
    assert b.attempt(BROKER) is None, "a link to it is not opened while it backs off"
    assert b.attempt(OTHER) is not None, "other brokers are not held off"
    clock.now += wait - 0.001
    assert b.attempt(BROKER) is None
    clock.now += 0.002
    trial = granted(b)
    assert b.attempt(BROKER) is None, "one attempt at a time after a backoff"
    trial.failed()
    assert 0.08 <= b.retry_in(BROKER) <= 0.12, "the delay doubled"


def test_a_connection_made_resets_the_backoff() -> None:
    clock = Clock()
    b = backoff_on(clock)
    for _ in range(10):
        granted(b).failed()
        clock.now += b.retry_in(BROKER)
    assert b.retry_in(BROKER) == 0.0
    granted(b).connected()
    assert [b.attempt(BROKER) is not None for _ in range(5)] == [True] * 5, "free to connect again, concurrently"
    granted(b).failed()
    assert b.retry_in(BROKER) <= 0.06, "counting starts over at 50 ms"


def test_links_failing_together_count_as_one_failure() -> None:
    clock = Clock()
    b = backoff_on(clock)
    attempts = [granted(b) for _ in range(40)]  # 40 client links open at once, the broker just died
    for a in attempts:
        a.failed()
    assert b.retry_in(BROKER) <= 0.06, "one round of failures, not 40 doublings"


def test_an_abandoned_trial_frees_the_next_attempt_without_growing_the_delay() -> None:
    b = backed_off_once(Clock())
    trial = granted(b)
    trial.abandoned()  # its client left while it connected
    trial.failed()  # said twice: the first word counts
    granted(b).failed()  # the next link may try at once
    assert 0.08 <= b.retry_in(BROKER) <= 0.12, "the abandoned attempt was not a failure"


def test_failure_log_keeps_one_line_per_broker_per_interval_and_counts_the_rest() -> None:
    clock = Clock()
    limit = FailureLog(interval=10, clock=clock)
    assert limit.note(BROKER) == 0
    assert [limit.note(BROKER) for _ in range(312)] == [None] * 312
    assert limit.note(OTHER) == 0, "each broker has its own line"
    clock.now += 9.9
    assert limit.note(BROKER) is None
    clock.now += 0.1
    assert limit.note(BROKER) == 313
    assert limit.note(BROKER) is None
    clock.now += 60
    assert limit.note(BROKER) == 1
    assert left_out(0) == ""
    assert left_out(1) == " (and 1 more failure since)"
    assert left_out(313) == " (and 313 more failures since)"


class FakeLink:
    def __init__(self) -> None:
        self.broker_id = 1
        self.ready = trio.Event()
        self.failed: LinkError | None = None


async def _settled(b: ReconnectBackoff, outcome: LinkError | None) -> None:
    attempt = granted(b)
    link = FakeLink()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(transport.settle, attempt, link)  # type: ignore[arg-type]
        await trio.testing.wait_all_tasks_blocked()
        link.failed = outcome
        link.ready.set()


async def test_settle_reads_the_links_opening() -> None:
    clock = Clock()
    b = backoff_on(clock)
    await _settled(b, AuthenticationFailed(1, "PLAIN", "wrong password"))
    assert b.retry_in(BROKER) == 0.0 and b.attempt(BROKER) is not None, "a refused login is the credentials' failure, not the broker's"
    await _settled(b, LinkError("broker 1: ConnectionRefusedError()"))
    assert b.retry_in(BROKER) > 0, "a link failing before it is ready backs off"
    clock.now += 1
    await _settled(b, None)
    assert b.attempt(BROKER) is not None and b.attempt(BROKER) is not None, "a ready link resets the backoff"


async def test_settle_of_a_cancelled_link_frees_its_trial() -> None:
    b = backed_off_once(Clock())
    with trio.move_on_after(0.01):  # the client connection ends while its link connects
        await transport.settle(granted(b), FakeLink())  # type: ignore[arg-type]
    granted(b).failed()  # the next link may try at once
    assert 0.08 <= b.retry_in(BROKER) <= 0.12, "the cancelled attempt was no failure"


def test_state_is_the_processs_trio_runs_own() -> None:
    async def fail_once() -> float:
        b = backoff.reconnects()
        assert backoff.reconnects() is b and backoff.failure_log() is backoff.failure_log()
        granted(b).failed()
        return backoff.reconnects().retry_in(BROKER)

    assert trio.run(fail_once) > 0
    assert trio.run(fail_once) <= 0.06, "a new run (a test's) starts with no backoff from another's clock"


SYN_SENT = "02"  # the kernel's code for a connect whose SYN has no answer yet


async def test_handshakes_under_way_to_one_broker_are_bounded_and_all_complete_once_it_accepts() -> None:
    """Links opened at once to a broker whose listen backlog is full: at most CONNECTS_AT_ONCE SYNs wait on it
    (the kernel drops those past the backlog, and each costs a retransmit of 1 s, then 3, then 7); the others
    wait their turn in kfan, and every one of them connects once the broker accepts again. Real sockets."""
    links = 3 * backoff.CONNECTS_AT_ONCE
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # and nothing accepts yet: a broker whose acceptor is behind
    port = listener.getsockname()[1]
    connected: list[trio.abc.Stream] = []

    def waiting_syns() -> int:
        return sum(1 for s in tcp_sockets(os.getpid()) if s.remote_port == port and s.state == SYN_SENT)

    async def open_link() -> None:
        connected.append(await transport.BrokerSecurity().connect("127.0.0.1", port))

    accepted: list[trio.socket.SocketType] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(links):
                nursery.start_soon(open_link)
            await wait_for_async("the first handshakes to wait on the full backlog", lambda: waiting_syns() >= backoff.CONNECTS_AT_ONCE)
            await trio.sleep(0.3)  # time for any SYN past the bound to go out
            assert waiting_syns() == backoff.CONNECTS_AT_ONCE
            assert len(connected) < links
            while len(connected) < links:  # the broker accepts again
                with trio.move_on_after(0.05):
                    accepted.append((await listener.accept())[0])
    assert len(connected) == links
    for stream in connected:
        await stream.aclose()
    for sock in accepted:
        sock.close()
    listener.close()
