"""A plan's sub-requests out to the brokers, and their answers back (trio).

:class:`Dispatcher` sends each sub-request of a :class:`proxy.core.Forward`
over the connection's links (:class:`backends.links.LinkPool`), resolving
coordinators and "any broker" first, in the client's order; a Fetch's
sub-fetches go through the connection's Fetch memory (:mod:`.fetches`),
which may reuse one already out. It then collects the answers under their
deadlines (:mod:`.gather`): a broker past every deadline it was given is
hung and its link closed, and a link's failure becomes the
:class:`~proxy.core.Failed` code the route says the client is told.

Boundaries: it merges nothing and applies no effect; what it learns on the
way (a Fetch's watermarks) it returns. The request's owner
(:class:`proxy.server.forwarder.Forwarder`) decides what happens next.
"""

from __future__ import annotations

import functools
import logging

import trio

from backends import backoff
from backends.cluster import Cluster
from backends.flights import FlightKey
from backends.link import Link, LinkClosed, LinkError, Pending
from backends.links import Lane, LinkPool
from backends.sasl import AuthenticationFailed
from backends.sequences import Turn, in_turn
from proxy.core import ANY_BROKER, BrokerAnswer, Destination, Failed, FetchForward, Forward, Response, SubRequest, produce
from proxy.core.fetch_wait import FetchWait
from proxy.core.produce import ProducerBatch, ProducerPartition
from proxy.kafka import apis, errors
from proxy.runtime import metrics
from proxy.server.fetches import Fetches
from proxy.server.gather import FETCH_GRACE, Gathered, Handles, gather, gather_fetch

log = logging.getLogger("kfan.connection")


class Dispatcher:
    """One client connection's sub-requests to the brokers, and the brokers' answers."""

    def __init__(
        self,
        cluster: Cluster,
        links: LinkPool,
        fetches: Fetches,
        *,
        request_timeout: float,
        max_hold: float,
        client: int,
        client_identity: bool = False,
    ) -> None:
        """``client_identity``: the links log in as the client, so a refused login is the client's (error 58), not a broker failure."""
        self.cluster = cluster
        self.links = links
        self.fetches = fetches
        self.request_timeout = request_timeout  # beyond the time the request itself allows the broker
        self.max_hold = max_hold
        self.client = client  # the connection's id, for the log
        self.client_identity = client_identity
        self._turns: dict[Pending, Turn] = {}  # Produce sub-requests in their producers' order, until answered

    def broker_wait(self, plan: Forward) -> float:
        """Seconds the request lets a broker take, by its own fields, capped by ``max_hold``."""
        return min(plan.broker_wait_ms / 1000, self.max_hold)

    async def submit(self, plan: Forward) -> Handles:
        """Send every sub-request now, in order; coordinators are resolved first."""
        out: Handles = {}
        fresh: list[tuple[Destination, int]] = []  # sub-fetches to send, once there is room for their answers
        sequenced = produce.sequenced(plan.state) if plan.header.api_key == apis.PRODUCE and plan.expect_response else {}
        for destination, sub in plan.subs.items():
            broker = await self.links.resolve(destination)
            if broker is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            if isinstance(broker, Failed):
                out[destination] = broker
                continue
            if isinstance(plan, FetchForward):
                hung_after = self.request_timeout + self.broker_wait(plan)
                reused = self.fetches.reuse(broker, plan.keys[destination], hung_after)
                if reused is not None:
                    out[destination] = reused
                else:
                    fresh.append((destination, broker))
                continue
            flight = self.flight_key(plan) if destination is ANY_BROKER else None
            if flight is not None and (shared := self.cluster.flights.join(flight)) is not None:
                out[destination] = shared  # the same request is out already: its answer is this one's too
                continue
            lane = self._lane(plan)
            if destination is ANY_BROKER and self.links.link(broker, lane) is None:
                broker = self.links.another_broker(broker) or broker  # any broker will do: one kfan is not backing off from
            link = await self.links.link_when_ready(broker, lane)
            if link is None:
                if destination in sequenced:  # not sent: the client sends it again, ahead of its later batches
                    self.cluster.sequences.not_sent(sequenced[destination])
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            if destination in sequenced:
                out[destination] = await self._send_in_turn(plan, link, sub, sequenced[destination])
                continue
            out[destination] = self._send(link, sub, flight)
        if isinstance(plan, FetchForward):
            await self.fetches.send(plan, fresh, out)
        return out

    def flight_key(self, plan: Forward) -> FlightKey | None:
        """What identical requests share (:mod:`backends.flights`): API, version and body; None when this one shares nothing.

        A connection carrying its client's identity shares with nobody: the brokers answer it as that client.
        """
        if not self.shares(plan):
            return None
        h = plan.header
        sub = plan.subs[ANY_BROKER]
        # The sub-request is the client's header (from its client id on) and body: the body alone is the key.
        return (h.api_key, h.api_version, b"".join(bytes(p) for p in sub.tail)[h.body_offset - 8 :])

    def shares(self, plan: Forward) -> bool:
        """Whether ``plan`` may share its answer with identical requests (:meth:`flight_key`)."""
        return plan.route.shares_answers and not self.client_identity

    def _lane(self, plan: Forward) -> Lane:
        if plan.route.share_session:
            return Lane.SHARE
        return Lane.SHARED if self.shares(plan) else Lane.MAIN

    def submit_elsewhere(self, plan: Forward, failed: Pending | Failed) -> Handles | None:
        """Ask another broker what any broker may answer (``failed``: the first one's); None when there is none to ask."""
        avoid: int | None = None
        if isinstance(failed, Pending) and isinstance(failed.failure, LinkClosed):
            # Another client's request it shared (backends.flights): that client left, no broker failed. Asked of
            # this client's own "any broker": a SHARED link to the other one would retire its own (backends.links).
            broker: int | None = self.links.default_broker()
        else:
            avoid = failed.broker if isinstance(failed, Pending) else None
            broker = self.links.another_broker(avoid)
        link = None if broker is None else self.links.link(broker, self._lane(plan))
        if link is None:
            return None
        flight = self.flight_key(plan)
        # Not another client's identical request to the broker that just failed this one: it would fail it again.
        shared = None if flight is None else self.cluster.flights.join(flight, avoid)
        return {ANY_BROKER: shared if shared is not None else self._send(link, plan.subs[ANY_BROKER], flight)}

    async def _send_in_turn(
        self, plan: Forward, link: Link, sub: SubRequest, batches: dict[ProducerPartition, ProducerBatch]
    ) -> Pending | Failed:
        """An idempotent producer's batches, sent once those read before them on other links are answered, and
        not sent (retriable) when the client sends one of those again, or when that takes too long
        (:mod:`backends.sequences`)."""
        read_sent_again = functools.partial(produce.sent_again, plan.header, plan.state.response_layout)
        turn, before = self.cluster.sequences.take_turn(batches, link, read_sent_again)
        pending: Pending | None = None
        try:
            if before and (why := await in_turn(turn, before, self.deadline(plan, trio.current_time()))) is not None:
                _log_held(self.client, why)
                return Failed(plan.route.failure.code(written=False))
            pending = self._send(link, sub, None)
            self._turns[pending] = turn
            return pending
        finally:
            turn.sent(pending)

    def _send(self, link: Link, sub: SubRequest, flight: FlightKey | None) -> Pending:
        """``sub`` out on ``link``; with a flight key, identical requests may share its answer until it lands."""
        pending = link.submit(sub)
        if flight is not None:
            self.cluster.flights.lead(flight, pending)
        return pending

    async def answers(self, plan: Forward, handles: Handles, submitted_at: float) -> Gathered:
        """The brokers' answers, the handles they came by (a Fetch may have asked again), and the watermarks learned."""
        receive = functools.partial(self._receive, plan, submitted_at)
        now = trio.current_time()
        if isinstance(plan, FetchForward):
            # A Fetch is answered as a broker would answer it (see core.fetch.FetchWait).
            outstanding = {d for d, h in handles.items() if isinstance(h, Pending)}
            fresh = {d for d, h in handles.items() if isinstance(h, Pending) and h.created_at >= submitted_at}
            failed = {d: h for d, h in handles.items() if isinstance(h, Failed)}
            wait = FetchWait(plan, now, self.broker_wait(plan), FETCH_GRACE, outstanding, fresh, failed)
            found = await gather_fetch(wait, handles, receive, functools.partial(self.fetches.ask_again, plan))
            self.fetches.settle(found.handles, found.answers)
            return found
        answers, late = await gather(handles, receive, self.deadline(plan, now))
        for d in late:
            pending = handles[d]
            answers[d] = self.late(plan, pending) if isinstance(pending, Pending) else Failed(errors.REQUEST_TIMED_OUT)
        return Gathered(answers, handles, {})

    def deadline(self, plan: Forward, submitted_at: float) -> float:
        """When a request other than a Fetch gives up on its brokers: a request that lets the broker take its
        time (JoinGroup up to its rebalance timeout) gets that long on top of ours."""
        return submitted_at + self.broker_wait(plan) + self.request_timeout

    def late(self, plan: Forward, pending: Pending) -> BrokerAnswer:
        """The answer is past every deadline its broker was given: the broker is hung (or stalled mid-answer),
        so its link is closed and the next request opens a fresh one."""
        # Its link fails only once the closing below is done: until then it must not be
        # joined, by this request asked again of another broker or by anyone else's.
        self.cluster.flights.landed(pending)
        self._turns.pop(pending, None)
        self.links.close(pending.broker, self._lane(plan))
        return Failed(errors.REQUEST_TIMED_OUT)

    async def _receive(self, plan: Forward, submitted_at: float, destination: Destination, pending: Pending) -> BrokerAnswer:
        await pending.answered()
        return self.answer_of(plan, submitted_at, destination, pending)

    def answer_of(self, plan: Forward, submitted_at: float, destination: Destination, pending: Pending) -> BrokerAnswer:
        """One broker's answer, once it is in; a link's failure as the code the client is told."""
        turn = self._turns.pop(pending, None) if self._turns else None
        try:
            payload = pending.value()
        except LinkClosed:
            self.cluster.flights.landed(pending)
            return Failed(plan.route.failure.code(pending.written))  # a shared answer's requester left: asked again
        except LinkError as e:
            self.cluster.flights.landed(pending)
            _log_failure(self.client, pending.broker, e)
            if destination is ANY_BROKER:
                self.links.default_failed(pending.broker)
            if self.client_identity and isinstance(e, AuthenticationFailed):
                return Failed(errors.SASL_AUTHENTICATION_FAILED)
            self.cluster.request_refresh()
            return Failed(plan.route.failure.code(pending.written))
        self.cluster.flights.landed(pending)
        if turn is not None:
            turn.landed(payload)
        if pending.done_at is not None and pending.created_at >= submitted_at:
            latency = pending.done_at - pending.created_at
            metrics.observe(metrics.BROKER_LATENCY, (pending.broker, plan.header.api_key), latency)
        return Response(payload)


def _log_failure(client: int, broker: int, e: LinkError) -> None:
    # A broker's failure fails every client's requests to it at once: one line per broker per interval.
    log_limited(client, ("requests", broker), e)


def _log_held(client: int, what: str) -> None:
    # A leader's move holds back every idempotent producer's pipelined batches at once: one line per interval.
    log_limited(client, ("held", what), what)


def log_limited(client: int, key: tuple[str, object], what: object) -> None:
    """A line about ``client`` that many clients' requests would write at once: one per ``key`` per interval."""
    if (left := backoff.failure_log().note(key)) is not None:
        log.info("client %s: %s%s", client, what, backoff.left_out(left))
