"""The one owner of a client request's life, from its bytes to its answer (trio).

The connection hands each request read to :meth:`Forwarder.take`, once.
In the connection's reader it is planned (:mod:`.planning`), given its
place in the response order (:mod:`.ordering`) and its sub-requests are
sent (:mod:`.dispatch`): later requests wait, so each broker gets this
client's requests in the client's order. A task of its own then collects
the answers, merges them with the plan's merge, applies the reply's effects
(:mod:`.effects`) and fills the request's slot; many requests are in flight
at once. acks=0 Produce requests hold a place in the order but write nothing.

The brokers' answers count against the connection's budget from their
arrival (:mod:`backends.link`) until their request's reply is merged (the
response then counts as itself) or they are dropped.

Boundaries: it makes no protocol decision (the core does) and never ends the
connection itself. A request that cannot be planned or sent raises
:class:`Unanswerable`; one whose answer no error code can give marks its
slot's ``close``; the connection acts on both (:mod:`.connection`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from backends.cluster import Cluster
from backends.link import Pending
from backends.links import LinkPool
from backends.undecodable import report_undecodable
from proxy.capture.recorder import Capture
from proxy.capture.rows import CaptureRow, topology_document
from proxy.core import (
    ANY_BROKER,
    BrokerAnswer,
    BrokerUnavailable,
    Destination,
    Effect,
    FetchForward,
    Forward,
    Identity,
    LocalReply,
    RememberWatermarks,
    Reply,
    Response,
    undecodable,
)
from proxy.core.layout import TopicPartition
from proxy.kafka.apis import api_name
from proxy.kafka.headers import RequestHeader, response_header
from proxy.kafka.records import Invalid
from proxy.kafka.wire import Parts
from proxy.runtime import metrics
from proxy.runtime.budget import Budget
from proxy.runtime.telemetry import ClientTelemetry
from proxy.server.deadlines import AnswerDeadlines
from proxy.server.dispatch import Dispatcher, log_limited
from proxy.server.effects import apply_effects
from proxy.server.fetches import Fetches
from proxy.server.gather import Gathered, Handles
from proxy.server.governance import ClientGovernance
from proxy.server.ordering import ResponseOrderer, ResponseSlot
from proxy.server.planning import Planner, Unanswerable
from proxy.server.quotas import ClientThrottle

log = logging.getLogger("kfan.connection")

__all__ = ["Forwarder", "Unanswerable"]


class Forwarder:
    """Every request of one client connection, each from its bytes to its answer in its slot."""

    def __init__(
        self,
        cluster: Cluster,
        links: LinkPool,
        identity: Identity,
        orderer: ResponseOrderer,
        budget: Budget,
        nursery: trio.Nursery,
        *,
        client: int,
        peer: str = "?",
        capture: Capture | None = None,
        request_timeout: float,
        max_hold: float,
        validate_records: bool = True,
        fetch_ahead_bytes: int = 0,
        client_identity: bool = False,
        telemetry: ClientTelemetry | None = None,
        principal: Callable[[], str] = str,
        governed: ClientGovernance | None = None,
        throttle: ClientThrottle | None = None,
    ) -> None:
        """``nursery``: the connection's, where answers are awaited and kept sub-fetches expire.

        ``client_identity``: the links log in as the client (``--broker-identity client``); ``principal``: who the
        client is at kfan (its login, its certificate; "" when neither); ``governed``: its ACLs and audit log;
        ``throttle``: its requests counted against kfan's quotas (``--quota-file``)."""
        self.cluster = cluster
        self.links = links
        self.identity = identity
        self.orderer = orderer
        self.budget = budget
        self.client = client  # the connection's id, for the log
        self.peer = peer
        self.capture = capture
        self.request_timeout = request_timeout
        self.nursery = nursery
        self.fetches = Fetches(links, budget, nursery)
        self.governed = governed
        self.throttle = throttle
        self.planner = Planner(
            cluster,
            links,
            identity,
            self.fetches,
            client,
            validate_records,
            fetch_ahead_bytes,
            client_identity,
            telemetry,
            principal,
            governed,
            throttle,
        )
        self.dispatcher = Dispatcher(
            cluster, links, self.fetches, request_timeout=request_timeout, max_hold=max_hold, client=client, client_identity=client_identity
        )
        self._single = SingleBroker(self)
        # Sub-requests of requests that want no answer (Produce acks=0), until written to their brokers.
        self._unanswered: list[Handles] = []
        self._logged_refused = False

    async def take(self, payload: bytes | memoryview) -> None:
        """Plan one request, place it in the response order and send it; its answer follows in a task of its own.

        Call it with room in the order (:meth:`ResponseOrderer.make_room`). Raises :class:`Unanswerable`.
        """
        read_at = time.time_ns() if self.capture is not None and self.capture.sampled() else None
        if self.governed is not None:
            await self.governed.before_request()  # --audit-overflow block: the client waits for the audit log
        cpu = time.thread_time() if self.throttle is not None else 0.0  # kfan's CPU time on it, for a request quota
        ctx, plan = await self.planner.plan(payload)
        if self.governed is not None:
            self.governed.planned(plan.header, ctx.access, plan.decisions)
            self.governed.software = self.planner.software
        self._apply(plan.at_plan)  # before the next request is planned (a share session's epochs)
        if plan.refused:
            self._logged_refused = _refused_records(plan.refused, self._logged_refused, self.client, self.peer)
        await self.budget.acquire(plan.cost)
        h = plan.header
        slot = ResponseSlot(plan.cost, h.api_key)
        if self.throttle is not None:
            self.throttle.read(slot, h, len(payload), time.thread_time() - cpu)
        if read_at is not None:
            slot.captured = (read_at, bytes(payload), ctx.topology)
        metrics.count(metrics.CLIENT_REQUESTS, (h.api_key, h.api_version))
        metrics.observe(metrics.FANOUT, (h.api_key,), len(plan.subs) if isinstance(plan, Forward) else 0)
        await self.orderer.place(slot)
        if isinstance(plan, LocalReply):
            _count_errors(plan.errors)
            self._answer(slot, plan.header, plan.body if plan.expect_response else None)
            if self.governed is not None:
                await self.governed.answered(plan.header, ctx.access is not None, plan.decisions, plan.errors, len(payload) + 4, slot)
            return
        submitted_at = trio.current_time()
        try:
            handles = await self.dispatcher.submit(plan)
        except Exception as e:
            log.error("client %s: unexpected error sending %s", self.client, _describe(h), exc_info=True)
            raise Unanswerable("internal_error") from e
        if not plan.expect_response:
            self._unanswered.append(handles)
        elif self._single.take(plan, handles, slot, submitted_at):
            return  # answered where its answer lands
        self.nursery.start_soon(self._complete, plan, handles, slot, submitted_at, len(payload) + 4)

    async def send_unanswered(self) -> None:
        """Until the sub-requests of requests that want no answer are written (the client is leaving)."""
        for handles in list(self._unanswered):
            await _sent(handles, self.request_timeout)

    async def _complete(self, plan: Forward, handles: Handles, slot: ResponseSlot, submitted_at: float, bytes_in: int) -> None:
        try:
            reply = await self._complete_one(plan, handles, slot, submitted_at)
            errors = reply.errors if reply is not None else {}
            if self.governed is not None:
                await self.governed.answered(plan.header, plan.ctx.access is not None, plan.decisions, errors, bytes_in, slot)
        except Exception:
            _failed_answering(self.client, plan.header, slot)

    async def _complete_one(self, plan: Forward, handles: Handles, slot: ResponseSlot, submitted_at: float) -> Reply | None:
        if not plan.expect_response:
            await _sent(handles, self.request_timeout)
            self._unanswered.remove(handles)
            self._answer(slot, plan.header, None, handles)
            return None
        reply, found = await self._reply(plan, handles, submitted_at, slot)
        self._deliver(plan, slot, reply, found)
        return reply

    def _deliver(self, plan: Forward, slot: ResponseSlot, reply: Reply | None, found: Gathered) -> None:
        if reply is None:
            # No error code of this response can say a broker failed: close, as a broker would on its own failure.
            # A broker's failure fails every client's request to it at once: one line stands for them.
            h = plan.header
            what = f"no error code of a {api_name(h.api_key)} v{h.api_version} answer can say its brokers failed: closing"
            log_limited(self.client, ("unanswerable", h.api_key), what)
            slot.close = "broker_answer"
            slot.done.set()
            return
        _count_errors(reply.errors)
        for (broker, locality), n in reply.fetched.items():
            metrics.count(metrics.FETCH_BYTES, (broker, locality), n)
        self._answer(slot, plan.header, reply.body, found.handles, found.answers, plan.route.shares_answers)

    async def _reply(self, plan: Forward, handles: Handles, submitted_at: float, slot: ResponseSlot) -> tuple[Reply | None, Gathered]:
        """The client's reply (None: no error code of it can say a broker failed), and the answers it came from."""
        used: list[Handles] = [handles]
        try:
            found = await self.dispatcher.answers(plan, handles, submitted_at)
            used.append(found.handles)
            if found.watermarks:
                # Before the merge: partitions still out report the watermarks last seen.
                self._apply([RememberWatermarks(found.watermarks)])
            reply = _merge(plan, found, self.dispatcher.shares(plan), self.client, slot if self.throttle else None)
            if (reply is None or reply.broker_failed) and ANY_BROKER in plan.subs and plan.route.read_only:
                # Any broker can answer this, and asking again changes nothing: one
                # broker's failure is not worth the client's (a Metadata answer has
                # no error code, so a failure would cost it its connection).
                again = self.dispatcher.submit_elsewhere(plan, found.handles[ANY_BROKER])
                if again is not None:
                    used.append(again)
                    found = await self.dispatcher.answers(plan, again, trio.current_time())
                    reply = _merge(plan, found, self.dispatcher.shares(plan), self.client, slot if self.throttle else None)
            if reply is not None:
                self._apply(reply.effects)
            return reply, found
        finally:
            # The answers are merged (the response counts what it keeps of them) or not wanted.
            self.fetches.done_with(h for hs in used for h in hs.values() if isinstance(h, Pending))

    def _apply(self, effects: Iterable[Effect]) -> None:
        apply_effects(effects, self.cluster, self.links.coordinators, self.fetches)

    def _answer(
        self,
        slot: ResponseSlot,
        h: RequestHeader,
        body: Parts | None,
        handles: Handles | None = None,
        answers: Mapping[Destination, BrokerAnswer] | None = None,
        shares_answers: bool = False,
    ) -> None:
        if self.throttle is not None:
            body = self.throttle.answering(slot, h, body)
        if body is not None:
            slot.parts = [response_header(h.api_key, h.api_version, h.correlation_id), *body]
            # An unwritten response is held for the client too: a client that
            # does not read its answers stops being read.
            response_bytes = sum(len(p) for p in slot.parts)
            self.budget.add(response_bytes)
            slot.size += response_bytes
        slot.done.set()
        if slot.captured is not None and self.capture is not None:
            conn_id = f"{os.getpid()}-{self.client}"
            self.capture.offer(_capture_row(slot, h, conn_id, self.identity, handles or {}, answers or {}, shares_answers))


class SingleBroker:
    """A connection's requests sent to one broker (most requests), each answered where its answer lands
    (:mod:`.deadlines`): no task, channel or deadline scope of its own. A Fetch, a request any broker may answer,
    and a governed or throttled client's requests are not: they need a task to wait in."""

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder
        self._deadlines = AnswerDeadlines(forwarder.nursery)

    def take(self, plan: Forward, handles: Handles, slot: ResponseSlot, submitted_at: float) -> bool:
        """Whether it answers ``plan`` (else the forwarder's task does)."""
        f = self._forwarder
        if len(handles) != 1 or isinstance(plan, FetchForward) or plan.route.shares_answers:
            return False
        if f.governed is not None or f.throttle is not None:
            return False
        ((destination, pending),) = handles.items()
        if destination is ANY_BROKER or not isinstance(pending, Pending):
            return False
        answer = functools.partial(self._answer, plan, slot, submitted_at, destination)
        self._deadlines.expect(pending, f.dispatcher.deadline(plan, submitted_at), answer)
        return True

    def _answer(self, plan: Forward, slot: ResponseSlot, submitted_at: float, d: Destination, pending: Pending, late: bool) -> None:
        f = self._forwarder
        try:
            if f.nursery.cancel_scope.cancel_called:
                f.fetches.done_with([pending])  # the connection is ending: nobody reads this answer
                return
            try:
                answer = f.dispatcher.late(plan, pending) if late else f.dispatcher.answer_of(plan, submitted_at, d, pending)
                found = Gathered({d: answer}, {d: pending}, {})
                reply = _merge(plan, found, False, f.client)
                if reply is not None:
                    f._apply(reply.effects)
            finally:
                f.fetches.done_with([pending])
            f._deliver(plan, slot, reply, found)
        except Exception:
            _failed_answering(f.client, plan.header, slot)


def reconfigure_forwarder(forwarder: Forwarder, limits: Any) -> None:
    """Limits reloaded (:class:`proxy.server.connection.Limits`): the timeouts and per-request settings from now on."""
    forwarder.request_timeout = forwarder.dispatcher.request_timeout = limits.request_timeout
    forwarder.dispatcher.max_hold = limits.max_hold
    forwarder.planner.validate_records = limits.validate_records
    forwarder.planner.fetch_ahead_bytes = limits.fetch_ahead_bytes


def _refused_records(refused: Mapping[TopicPartition, Invalid], logged: bool, client: int, peer: str) -> bool:
    """Count refused produced records; log them, once per connection (a client with a bad encoder would flood the
    log): whether they have been logged."""
    for problem in refused.values():
        metrics.INVALID_BATCHES.labels(problem.reason).inc()
    if not logged:
        where = ", ".join(f"{topic}-{partition} ({problem.reason})" for (topic, partition), problem in list(refused.items())[:5])
        log.warning("client %s (%s): refused produced records that no broker would take: %s", client, peer, where)
    return True


def _merge(plan: Forward, found: Gathered, shares: bool, client: int, slot: ResponseSlot | None = None) -> Reply | None:
    """The client's reply from the answers found; ``shares``: the request may share another client's answer.

    ``slot``: its CPU time counts in the slot's (the client has a request quota to count it against)."""
    if slot is None:
        return _merged_once(plan, found, shares, client)
    cpu = time.thread_time()
    try:
        return _merged_once(plan, found, shares, client)
    finally:
        slot.cpu += time.thread_time() - cpu


def _merged_once(plan: Forward, found: Gathered, shares: bool, client: int) -> Reply | None:
    shared = _shared_answer(found) if shares else None
    whose = (plan.ctx.identity, plan.ctx.access)  # a client's own ACLs may have amended it
    if shared is not None and shared.merged is not None and shared.merged[0] == whose:
        # Merged already for another client that waited for the same answer (1000 partitions'
        # Metadata: 20 ms of decoding and encoding each); its effects are applied already.
        first = shared.merged[1]
        assert isinstance(first, Reply)
        return dataclasses.replace(first, effects=[])
    reply = _merged(plan, found, client)
    if shared is not None and reply is not None:
        shared.merged = (whose, reply)
    return reply


def _merged(plan: Forward, found: Gathered, client: int) -> Reply | None:
    reply: Reply | None = None
    with undecodable.collect() as noted:  # answers the merge failed for not decoding: logged and counted
        try:
            reply = plan.merge(plan, found.answers)
        except BrokerUnavailable as e:
            # Where any broker may answer, it is asked again; the log tells only of a client closed for it (_deliver).
            log.debug("client %s: %s (api_key=%s v%s)", client, e, plan.header.api_key, plan.header.api_version)
    if noted:
        report_undecodable(plan.header, found.answers, found.handles, noted)
    return reply


def _shared_answer(found: Gathered) -> Pending | None:
    """The answer a request that shares answers (:mod:`backends.flights`) may share with others, when it is in."""
    pending = found.handles.get(ANY_BROKER)
    answer = found.answers.get(ANY_BROKER)
    return pending if isinstance(pending, Pending) and isinstance(answer, Response) else None


async def _sent(handles: Handles, timeout: float) -> None:
    """Until each sub-request is written to its broker (or failed), at most ``timeout``."""
    with trio.move_on_after(timeout):
        for h in handles.values():
            if isinstance(h, Pending):
                await h.sent.wait()


def _failed_answering(client: int, h: RequestHeader, slot: ResponseSlot) -> None:
    """A bug met while answering one request ends this connection (in order: the responses before it are
    still written), nothing more."""
    log.error("client %s: unexpected error answering %s", client, _describe(h), exc_info=True)
    slot.close = "internal_error"
    slot.done.set()


def _describe(h: RequestHeader) -> str:
    return f"api_key={h.api_key} v{h.api_version} correlation_id={h.correlation_id}"


def _count_errors(counts: Mapping[tuple[int, int], int]) -> None:
    for (code, broker), n in counts.items():
        metrics.count(metrics.ERRORS, (code, broker if isinstance(broker, int) else -1), n)


def _capture_row(
    slot: ResponseSlot,
    h: RequestHeader,
    conn_id: str,
    identity: Identity,
    handles: Handles,
    answers: Mapping[Destination, BrokerAnswer],
    shares_answers: bool = False,
) -> CaptureRow:
    """``shares_answers``: the request may have shared another client's (backends.flights), whose header the sub-request
    bears: what this client's own would have been is recorded (its request as it came, with the cid sent)."""
    assert slot.captured is not None
    ts_start, request, topology = slot.captured
    subrequests = []
    for d, p in handles.items():
        if isinstance(p, Pending) and p.request is not None:
            answer = answers.get(d)  # as the merge saw it (None: failed, or not in yet)
            sent = p.request[4:12] + request[8:] if shares_answers else p.request[4:]
            subrequests.append((p.broker, sent, bytes(answer.payload) if isinstance(answer, Response) else None))
    return CaptureRow(
        ts_start=ts_start,
        ts_end=time.time_ns(),
        conn_id=conn_id,
        api_key=h.api_key,
        api_version=h.api_version,
        correlation_id=h.correlation_id,
        request=request,
        response=None if slot.parts is None else b"".join(bytes(x) for x in slot.parts),
        subrequests=subrequests,
        topology=topology_document(topology, identity.node_id, identity.host, identity.port),
    )
