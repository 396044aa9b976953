"""One client connection's requests on their way to the brokers and back (trio).

:class:`Forwarder` sends a plan's sub-requests over the connection's links
(:class:`backends.links.LinkPool`), waits for the answers (:mod:`.gather`;
a Fetch as :class:`proxy.core.fetch.FetchWait` decides), merges them with the
plan's merge, and applies the reply's effects (:mod:`.effects`): the
cluster's to the cluster, remembered watermarks and fetch-ahead to this
connection's Fetch memory (:mod:`.fetches`). It makes no protocol decision
of its own; the connection around it reads requests and writes responses in
order.

The brokers' answers count against the connection's budget from their arrival
(:mod:`backends.link`) until their request's reply is merged (the response
then counts as itself) or they are dropped.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

import trio

from backends.cluster import Cluster
from backends.link import LinkError, Pending
from backends.links import Lane, LinkPool
from backends.sasl import AuthenticationFailed

from . import metrics
from .budget import Budget
from .core import (
    ANY_BROKER,
    BrokerAnswer,
    BrokerUnavailable,
    Context,
    Destination,
    Failed,
    FetchForward,
    Forward,
    Identity,
    LocalReply,
    NeedCoordinators,
    Plan,
    RememberWatermarks,
    Reply,
    Response,
    plan_request,
)
from .core.fetch import FetchWait
from .effects import apply_effects
from .fetches import Fetches
from .gather import FETCH_GRACE, Gathered, gather, gather_fetch
from .kafka import errors

log = logging.getLogger("kfan.connection")

Handles = dict[Destination, Pending | Failed]
Answers = Mapping[Destination, BrokerAnswer]


class Forwarder:
    def __init__(
        self,
        cluster: Cluster,
        links: LinkPool,
        identity: Identity,
        *,
        request_timeout: float,
        max_hold: float,
        client: int,
        client_identity: bool = False,
        validate_records: bool = True,
        fetch_ahead_bytes: int = 0,
        budget: Budget | None = None,
        nursery: trio.Nursery | None = None,
    ) -> None:
        """``client_identity``: the links log in as the client, so a refused login is the client's (error 58), not a broker failure.

        ``budget``: the connection's (its links count answers against it); ``nursery``: where sub-fetches
        kept unused are expired (without one, only the next Fetch drops them).
        """
        self.budget = budget
        self._nursery = nursery
        self.cluster = cluster
        self.client_identity = client_identity
        self.validate_records = validate_records
        self.fetch_ahead_bytes = fetch_ahead_bytes
        self.identity = identity
        self.links = links
        self.request_timeout = request_timeout  # beyond the time the request itself allows the broker
        self.max_hold = max_hold
        self.client = client  # the connection's id, for the log
        self.fetches = Fetches(links, budget, nursery)  # the connection's memory between its Fetches

    async def plan(self, payload: bytes | memoryview) -> tuple[Context, LocalReply | Forward]:
        """Plan one request, learning what the plan needs first (the context it was planned with too).

        Waits in the connection's reader on purpose: later requests wait with
        it, so each broker gets this client's requests in the client's order.
        """
        plan: Plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, LocalReply | Forward) and plan.unknown_topics:
            # Topics created since the last refresh: a broker would know them.
            await self.cluster.refresh(timeout=2.0)
            plan = plan_request(ctx := self._context(), payload)
        if isinstance(plan, NeedCoordinators):
            # A batch naming groups or transactions kfan has not seen: one bulk lookup, then plan by broker.
            await self.links.coordinators.find(plan.coordinators)
            plan = plan_request(ctx := self._context(coordinators_looked_up=True), payload)
        assert not isinstance(plan, NeedCoordinators)
        return ctx, plan

    def _context(self, coordinators_looked_up: bool = False) -> Context:
        cluster = self.cluster
        return Context(
            self.identity,
            cluster.topology,
            cluster.api_versions,
            self.links.coordinators.known,  # kfan's shared view, or this connection's own (its client's identity)
            coordinators_looked_up,
            self.fetches.watermarks,
            self.validate_records,
            self.fetch_ahead_bytes,
            cluster.rack,
            # One clock reading per request, not one per partition it names.
            functools.partial(cluster.read_replicas.get, now=trio.current_time()),
            self.client_identity,
        )

    def broker_wait(self, plan: Forward) -> float:
        """Seconds the request lets a broker take, by its own fields, capped by ``max_hold``."""
        return min(plan.broker_wait_ms / 1000, self.max_hold)

    async def submit(self, plan: Forward) -> Handles:
        """Send every sub-request now, in order; coordinators are resolved first."""
        out: Handles = {}
        fresh: list[tuple[Destination, int]] = []  # sub-fetches to send, once there is room for their answers
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
            if destination is ANY_BROKER and self.links.link(broker, Lane.MAIN) is None:
                broker = self.links.another_broker(broker) or broker  # any broker will do: one kfan is not backing off from
            link = await self.links.link_when_ready(broker, Lane.MAIN)
            if link is None:
                out[destination] = Failed(plan.route.failure.code(written=False))
                continue
            out[destination] = link.submit(sub)
        if isinstance(plan, FetchForward):
            await self.fetches.send(plan, fresh, out)
        return out

    async def reply(self, plan: Forward, handles: Handles, submitted_at: float) -> tuple[Reply | None, Handles, Answers]:
        """The client's reply (None: no error code of it can say a broker failed), the handles and answers it came from."""
        used: list[Handles] = [handles]
        try:
            return await self._reply(plan, handles, submitted_at, used)
        finally:
            # The answers are merged (the response counts what it keeps of them) or not wanted.
            self.fetches.done_with(h for hs in used for h in hs.values() if isinstance(h, Pending))

    async def _reply(
        self, plan: Forward, handles: Handles, submitted_at: float, used: list[Handles]
    ) -> tuple[Reply | None, Handles, Answers]:
        answers, handles, learned = await self._answers(plan, handles, submitted_at)
        used.append(handles)
        if learned:
            # Before the merge: partitions still out report the watermarks last seen.
            apply_effects([RememberWatermarks(learned)], self.cluster, self.links.coordinators, self.fetches)
        reply = self._merge(plan, answers)
        if (reply is None or reply.broker_failed) and ANY_BROKER in plan.subs and plan.route.read_only:
            # Any broker can answer this, and asking again changes nothing: one
            # broker's failure is not worth the client's (a Metadata answer has
            # no error code, so a failure would cost it its connection).
            failed = handles[ANY_BROKER]
            broker = self.links.another_broker(failed.broker if isinstance(failed, Pending) else None)
            link = None if broker is None else self.links.link(broker, Lane.MAIN)
            if link is not None:
                handles = {ANY_BROKER: link.submit(plan.subs[ANY_BROKER])}
                used.append(handles)
                answers, handles, _ = await self._answers(plan, handles, trio.current_time())
                reply = self._merge(plan, answers)
        if reply is not None:
            apply_effects(reply.effects, self.cluster, self.links.coordinators, self.fetches)
        return reply, handles, answers

    async def _answers(self, plan: Forward, handles: Handles, submitted_at: float) -> Gathered:
        """The brokers' answers, the handles they came by (a Fetch may have asked again), and the watermarks learned."""

        async def receive(destination: Destination, pending: Pending) -> BrokerAnswer:
            try:
                payload = await pending.wait()
            except LinkError as e:
                log.info("client %s: %s", self.client, e)
                if destination is ANY_BROKER:
                    self.links.default_failed(pending.broker)
                if self.client_identity and isinstance(e, AuthenticationFailed):
                    return Failed(errors.SASL_AUTHENTICATION_FAILED)
                self.cluster.request_refresh()
                return Failed(plan.route.failure.code(pending.written))
            if pending.done_at is not None and pending.created_at >= submitted_at:
                latency = pending.done_at - pending.created_at
                metrics.BROKER_LATENCY.labels(str(pending.broker), str(plan.header.api_key)).observe(latency)
            return Response(payload)

        now = trio.current_time()
        if isinstance(plan, FetchForward):
            # A Fetch is answered as a broker would answer it (see core.fetch.FetchWait).
            outstanding = {d for d, h in handles.items() if isinstance(h, Pending)}
            fresh = {d for d in outstanding if handles[d].created_at >= submitted_at}  # type: ignore[union-attr]
            failed = {d: h for d, h in handles.items() if isinstance(h, Failed)}
            wait = FetchWait(plan, now, self.broker_wait(plan), FETCH_GRACE, outstanding, fresh, failed)
            found = await gather_fetch(wait, handles, receive, functools.partial(self.fetches.ask_again, plan))
            self.fetches.settle(found.handles, found.answers)
            return found
        # A request that lets the broker take its time (JoinGroup up to its
        # rebalance timeout) gets that long on top of ours.
        answers, late = await gather(handles, receive, now + self.broker_wait(plan) + self.request_timeout)
        for d in late:
            # A broker past every deadline it was given is hung (or stalled
            # mid-answer): close its link, so the next request opens a fresh one.
            pending = handles[d]
            if isinstance(pending, Pending):
                self.links.close(pending.broker, Lane.MAIN)
            answers[d] = Failed(errors.REQUEST_TIMED_OUT)
        return Gathered(answers, handles, {})

    def _merge(self, plan: Forward, answers: Answers) -> Reply | None:
        try:
            return plan.merge(plan, answers)
        except BrokerUnavailable as e:
            log.info("client %s: %s (api_key=%s v%s)", self.client, e, plan.header.api_key, plan.header.api_version)
            return None
