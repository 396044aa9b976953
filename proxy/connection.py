"""One client connection: read frames, route, answer in order.

The reader task reads frames continuously, plans each request (pure core),
resolves coordinators and submits sub-requests to this connection's links in
the client's order, then hands the wait-and-merge to a task of its own: many
requests are in flight at once. The writer task writes responses strictly in
request order. acks=0 Produce requests hold a place in that order but write
nothing. In-flight requests and held bytes (frames arriving, requests in
flight with their decoded form, responses unwritten; see :mod:`.budget`) are
bounded: when either is full the reader stops reading, and TCP pushes back on
the client.

Every wait has a deadline: a frame must arrive whole within ``frame_timeout``,
an idle connection is closed after ``idle_timeout`` (Kafka's
connections.max.idle.ms), and a request may keep a broker no longer than its
own fields allow, capped by ``max_hold``. A client's EOF or reset ends the
connection at once, and with it every request in flight and every broker link.

Links to brokers are opened lazily, per broker and per lane (Fetch long-polls
get a lane of their own so they never stall other requests), and die with the
connection's nursery. A failure while handling one request ends at most this
connection (logged with the request's api key, version and correlation id,
and counted); nothing escapes :meth:`ClientConnection.run`.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import trio

from backends.cluster import Cluster, CoordinatorError
from backends.link import Link, LinkError, Pending
from backends.topology import Topology

from . import metrics, routing
from .budget import Budget, MemoryPool
from .capture import Capture
from .core import (
    ANY,
    NO_ANSWER_YET,
    Answer,
    BrokerUnavailable,
    Context,
    Coordinator,
    Identity,
    Marks,
    Outcome,
    Plan,
    Target,
    Unsupported,
    answer_marks,
    broker_failure_code,
    fetch_satisfied,
    plan_request,
)
from .kafka import apis, errors
from .kafka.frames import FrameReader, frame
from .kafka.headers import RequestHeader, peek_request, response_header
from .kafka.wire import Malformed, Parts
from .partitioned import TopicPartition

log = logging.getLogger("kfan.connection")
_ids = itertools.count(1)
_refused_logged_at = -math.inf  # when a refusal past --max-connections was last logged


@dataclass(frozen=True)
class Limits:
    max_frame_bytes: int = 100 * 1024 * 1024
    max_inflight: int = 256
    max_connection_bytes: int = 64 * 1024 * 1024  # held per connection before its reader waits
    request_timeout: float = 30.0  # beyond the time the request itself allows the broker
    max_hold: float = 300.0  # the longest a request's own fields may let a broker keep it
    idle_timeout: float = 600.0  # Kafka's connections.max.idle.ms
    frame_timeout: float = 30.0  # a frame begun must arrive whole within this
    max_buffered_bytes: int = 512 * 1024 * 1024  # held for all connections of the process
    max_connections: int = 10_000


# How long an answered, unused sub-fetch may stand in for a new one: the
# client's next Fetch normally follows at once; older data is fetched afresh.
FETCH_AHEAD_TTL = 1.0
# A broker's Fetch answer may lag its max_wait by the network; past this, kfan
# answers the client without it.
FETCH_GRACE = 0.02


class _Close(Exception):
    """End this client connection (the reason is logged and counted where it is raised)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        if reason != "eof":  # the client's own doing
            metrics.CLIENT_CLOSES.labels(reason).inc()


class _Slot:
    """A place in the response order."""

    __slots__ = ("done", "parts", "close", "size", "started", "api_key", "captured")

    def __init__(self, size: int) -> None:
        self.done = trio.Event()
        self.parts: Parts | None = None
        self.close: str | None = None  # end the connection here, for this reason
        self.size = size  # bytes held for it: the request's cost, then its response's too
        self.started = trio.current_time()
        self.api_key = -1
        # When sampled: wall-clock ns at read, the request, and the topology its plan used
        # (not the one current when it is answered: a refresh in between may have moved leaders).
        self.captured: tuple[int, bytes, Topology] | None = None


class ClientConnection:
    def __init__(
        self,
        stream: trio.SocketStream,
        cluster: Cluster,
        identity: Identity,
        limits: Limits,
        capture: Capture | None = None,
        pool: MemoryPool | None = None,
    ) -> None:
        self.stream = stream
        self.capture = capture
        self.cluster = cluster
        self.identity = identity
        self.limits = limits
        self.id = next(_ids)
        self._links: dict[tuple[int, str], Link] = {}
        self._home: int | None = None
        self._pool = pool if pool is not None else MemoryPool(limits.max_buffered_bytes)
        self._budget = Budget(limits.max_connection_bytes, self._pool)
        self._partial = 0  # bytes of frames still arriving, counted in the pool
        self._last_active = trio.current_time()
        self._frame_started = 0.0
        self._inflight = 0
        self._draining = False
        self._receiving: trio.CancelScope | None = None
        # Per broker, the sub-fetch in flight (or just answered) that no client answer used yet.
        self._fetch_ahead: dict[int, tuple[Hashable, Pending, float]] = {}
        # Each partition's marks as its leader last reported them on this connection.
        self._marks: dict[TopicPartition, Marks] = {}

    async def run(self) -> None:
        """Serve the client until it leaves or must go; never raises (but for cancellation)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                send, receive = trio.open_memory_channel[_Slot](self.limits.max_inflight)
                nursery.start_soon(self._write, receive, nursery.cancel_scope)
                async with send:
                    await self._read(send)
        except* _Close:
            pass
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as eg:
            log.debug("client %s: connection lost: %r", self.id, eg.exceptions[0])
        except* Exception as eg:
            # The last resort: a bug met while serving this client ends this
            # client's connection, never the process.
            metrics.CLIENT_CLOSES.labels("internal_error").inc()
            log.error("client %s: closing after an unexpected error", self.id, exc_info=eg)
        finally:
            metrics.INFLIGHT.dec(self._inflight)  # requests the connection's end abandoned
            self._budget.release_all()
            self._pool.sub(self._partial)
            self._partial = 0
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    # --- reading -------------------------------------------------------------

    def _sync_partial(self, reader: FrameReader) -> None:
        """Count the bytes of frames still arriving in the process-wide pool."""
        held = reader.buffered()
        if held and not self._partial:
            self._frame_started = trio.current_time()
        self._pool.add(held - self._partial)
        self._partial = held

    async def _receive(self, reader: FrameReader) -> bytes | None:
        """The client's next bytes (b"" at EOF), or None when draining; closes on a deadline."""
        while True:
            if self._draining:
                return None
            if self._partial:
                deadline = self._frame_started + self.limits.frame_timeout
            else:
                deadline = self._last_active + self.limits.idle_timeout
            with trio.CancelScope(deadline=deadline) as self._receiving:
                await self._pool.wait_to_read(self._budget.used + self._partial)
                data = await self.stream.receive_some(65536)
                self._last_active = trio.current_time()
                return data
            self._receiving = None
            if self._draining:
                return None
            now = trio.current_time()
            if self._partial and now >= self._frame_started + self.limits.frame_timeout:
                log.warning("client %s: a frame was not completed within %.0f s, closing", self.id, self.limits.frame_timeout)
                raise _Close("frame_timeout")
            if not self._partial and not self._inflight and now >= self._last_active + self.limits.idle_timeout:
                log.info("client %s: idle for %.0f s, closing", self.id, self.limits.idle_timeout)
                raise _Close("idle_timeout")
            # Requests in flight: the connection is not idle. Look again later.
            self._last_active = max(self._last_active, now - self.limits.idle_timeout / 2)

    async def _read(self, send: trio.MemorySendChannel[_Slot]) -> None:
        reader = FrameReader(self.limits.max_frame_bytes)
        while True:
            try:
                payload = reader.next_frame()
            except Malformed as e:
                log.warning("client %s: malformed frame, closing: %s", self.id, e)
                raise _Close("malformed") from e
            self._sync_partial(reader)
            if payload is None:
                data = await self._receive(reader)
                if data is None:
                    return  # draining: every complete request read is answered; no new ones
                if not data:
                    # A broker closes on EOF too: what the client still waits for
                    # is abandoned at once, with its broker links.
                    if reader.pending_partial():
                        log.warning("client %s: connection ended inside a frame", self.id)
                    raise _Close("eof")
                reader.feed(data)
                self._sync_partial(reader)
                continue
            metrics.BYTES.labels("client_in").inc(len(payload) + 4)
            read_at = time.time_ns() if self.capture is not None and self.capture.sampled() else None
            try:
                plan = plan_request(ctx := self._context(), payload)
                if plan.unknown_topics:
                    # Topics created since the last refresh: a broker would know them.
                    await self.cluster.refresh(timeout=2.0)
                    plan = plan_request(ctx := self._context(), payload)
                if plan.unknown_coordinators:
                    # A batch naming groups or transactions kfan has not seen: one bulk lookup, then plan by broker.
                    await self.cluster.find_coordinators(plan.unknown_coordinators)
                    plan = plan_request(ctx := self._context(coordinators_looked_up=True), payload)
            except (Malformed, Unsupported) as e:
                key, version, cid = peek_request(payload)
                log.warning("client %s: closing on request api_key=%s v%s correlation_id=%s: %s", self.id, key, version, cid, e)
                raise _Close("malformed" if isinstance(e, Malformed) else "unsupported") from e
            except Exception as e:
                key, version, cid = peek_request(payload)
                log.error(
                    "client %s: unexpected error planning api_key=%s v%s correlation_id=%s", self.id, key, version, cid, exc_info=True
                )
                raise _Close("internal_error") from e
            await self._budget.acquire(plan.cost)
            slot = _Slot(plan.cost)
            h = plan.header
            slot.api_key = h.api_key
            if read_at is not None:
                slot.captured = (read_at, bytes(payload), ctx.topology)
            metrics.CLIENT_REQUESTS.labels(str(h.api_key), str(h.api_version)).inc()
            metrics.FANOUT.labels(str(h.api_key)).observe(len(plan.subs))
            metrics.INFLIGHT.inc()
            self._inflight += 1
            await send.send(slot)
            if plan.reply is not None:
                for (code, broker), n in plan.reply_errors.items():
                    metrics.ERRORS.labels(str(code), str(broker)).inc(n)
                self._answer(slot, plan, plan.reply if plan.expect_response else None)
                continue
            submitted_at = trio.current_time()
            try:
                pendings = await self._submit(plan)
            except Exception as e:
                log.error("client %s: unexpected error sending %s", self.id, _describe(h), exc_info=True)
                raise _Close("internal_error") from e
            self._nursery.start_soon(self._complete, plan, pendings, slot, submitted_at)

    def drain(self) -> None:
        """Stop reading requests; answer those already read, then close (graceful shutdown)."""
        self._draining = True
        if self._receiving is not None:
            self._receiving.cancel()

    def _context(self, coordinators_looked_up: bool = False) -> Context:
        return Context(
            self.identity, self.cluster.topology, self.cluster.api_versions, self.cluster.known_coordinator, coordinators_looked_up
        )

    async def _submit(self, plan: Plan) -> dict[Target, Pending | int]:
        """Send every sub-request now, in order; coordinators are resolved first."""
        out: dict[Target, Pending | int] = {}
        lane = "fetch" if plan.header.api_key == apis.FETCH else "main"
        for target, sub in plan.subs.items():
            broker: int
            if isinstance(target, Coordinator):
                try:
                    broker = await self.cluster.coordinator(target)
                except CoordinatorError as e:
                    out[target] = e.code
                    continue
            elif target is ANY:
                home = self._home_broker()
                if home is None:
                    out[target] = broker_failure_code(plan.header.api_key, written=False)
                    continue
                broker = home
            else:
                assert isinstance(target, int)
                broker = target
            if (
                plan.fetch_min_bytes is not None
                and (ahead := self._fetch_ahead_for(broker, plan.fetch_keys[target], self._hold(plan))) is not None
            ):
                out[target] = ahead
                continue
            link = self._link(broker, lane)
            if link is None:
                out[target] = broker_failure_code(plan.header.api_key, written=False)
                continue
            out[target] = pending = link.submit(sub)
            if plan.fetch_min_bytes is not None:
                self._fetch_ahead[broker] = (plan.fetch_keys[target], pending, trio.current_time())
        return out

    def _hold(self, plan: Plan) -> float:
        """Seconds the request lets a broker keep it, by its own fields, capped by ``max_hold``."""
        return min(plan.hold_ms / 1000, self.limits.max_hold)

    def _fetch_ahead_for(self, broker: int, wanted: Hashable, max_wait: float) -> Pending | None:
        """The sub-fetch this connection already has in flight to ``broker`` for
        exactly these partitions and offsets. Reusing it, rather than asking
        again, is what lets a slow broker's data arrive at all while a fast
        broker keeps answering first (no starvation)."""
        entry = self._fetch_ahead.get(broker)
        if entry is None:
            return None
        key, pending, sent_at = entry
        now = trio.current_time()
        if pending.done_at is None and now - sent_at > self.limits.request_timeout + max_wait:
            # Far past any max_wait: the broker is hung. Closing the link fails
            # this sub-fetch (a retriable error for its partitions) and the next
            # Fetch opens a fresh one.
            if (link := self._links.get((broker, "fetch"))) is not None:
                link.close()
            del self._fetch_ahead[broker]
            return pending
        fresh = pending.done_at is None or now - pending.done_at < FETCH_AHEAD_TTL
        if fresh and key == wanted:
            return pending
        del self._fetch_ahead[broker]
        return None

    def _home_broker(self) -> int | None:
        if self._home is None or self._home not in self.cluster.topology.brokers:
            self._home = self.cluster.any_broker()
        return self._home

    def _link(self, broker: int, lane: str) -> Link | None:
        link = self._links.get((broker, lane))
        if link is not None and link.failed is None:
            return link
        b = self.cluster.topology.brokers.get(broker)
        if b is None:
            return None
        link = Link(broker, b.host, b.port, max_frame_bytes=self.limits.max_frame_bytes, keep_requests=self.capture is not None)
        self._links[(broker, lane)] = link
        self._nursery.start_soon(link.run)
        return link

    # --- completing ----------------------------------------------------------------

    async def _complete(self, plan: Plan, pendings: Mapping[Target, Pending | int], slot: _Slot, submitted_at: float) -> None:
        try:
            await self._complete_one(plan, pendings, slot, submitted_at)
        except Exception:
            # A bug met while answering one request ends this connection (in
            # order: the responses before it are still written), nothing more.
            log.error("client %s: unexpected error answering %s", self.id, _describe(plan.header), exc_info=True)
            slot.close = "internal_error"
            slot.done.set()

    async def _complete_one(self, plan: Plan, pendings: Mapping[Target, Pending | int], slot: _Slot, submitted_at: float) -> None:
        if not plan.expect_response:
            with trio.move_on_after(self.limits.request_timeout):
                for p in pendings.values():
                    if not isinstance(p, int):
                        await p.sent.wait()
            self._answer(slot, plan, None, pendings)
            return
        answers = await self._gather(plan, pendings, submitted_at)
        outcome = self._merge(plan, answers)
        if (outcome is None or outcome.broker_failed) and ANY in plan.subs and plan.header.api_key in routing.READ_ONLY:
            # Any broker can answer this, and asking again changes nothing: one
            # broker's failure is not worth the client's (a Metadata answer has
            # no error code, so a failure would cost it its connection).
            failed = pendings[ANY]
            again = self._ask_another_broker(plan, failed.broker if isinstance(failed, Pending) else None)
            if again is not None:
                pendings = {ANY: again}
                answers = await self._gather(plan, pendings, trio.current_time())
                outcome = self._merge(plan, answers)
        if outcome is None:
            # No error code of this response can say a broker failed: close, as a broker would on its own failure.
            slot.close = "broker_answer"
            slot.done.set()
            return
        self._marks.update(outcome.fetch_marks)
        for (code, broker), n in outcome.errors.items():
            metrics.ERRORS.labels(str(code), str(broker)).inc(n)
        if outcome.metadata is not None:
            self.cluster.fold_metadata(outcome.metadata)
        if outcome.coordinators:
            self.cluster.learn(outcome.coordinators)
        for c in outcome.moved:
            self.cluster.forget(c)
        if outcome.stale_topics or outcome.refresh:
            self.cluster.request_refresh()
        self._answer(slot, plan, outcome.body, pendings, answers)

    def _merge(self, plan: Plan, answers: Mapping[Target, Answer]) -> Outcome | None:
        """The client's response from the brokers' answers; None when no error code of it can say a broker failed."""
        assert plan.merge is not None
        try:
            return plan.merge(answers, self._marks) if plan.fetch_min_bytes is not None else plan.merge(answers)
        except BrokerUnavailable as e:
            log.info("client %s: %s (%s)", self.id, e, _describe(plan.header))
            return None

    async def _gather(self, plan: Plan, pendings: Mapping[Target, Pending | int], submitted_at: float) -> dict[Target, Answer]:
        """The brokers' answers, as they come. A Fetch is answered as soon as a
        broker would answer it (min_bytes in, or an error): sub-fetches still
        long-polling an idle broker do not hold back data another returned."""
        answers: dict[Target, Answer] = {}
        send, receive = trio.open_memory_channel[tuple[Target, Answer]](math.inf)

        async def wait(target: Target, p: Pending) -> None:
            try:
                answer: Answer = await p.wait()
                if p.done_at is not None and p.created_at >= submitted_at:
                    metrics.BROKER_LATENCY.labels(_broker_label(target), str(plan.header.api_key)).observe(p.done_at - p.created_at)
            except LinkError as e:
                log.info("client %s: %s", self.id, e)
                answer = broker_failure_code(plan.header.api_key, p.written)
                if target is ANY:
                    self._home = None
                self.cluster.request_refresh()
            send.send_nowait((target, answer))

        fetch = plan.fetch_min_bytes is not None
        cut_short = timed_out = False
        now = trio.current_time()
        # A request that lets the broker hold it (JoinGroup up to its rebalance
        # timeout) gets that long on top of ours. A Fetch is answered by its
        # max_wait, as a broker would; sub-fetches sent for it get a short grace
        # past that, older ones (still out from an earlier Fetch) none. Those
        # still out count as "no data yet" and stay for the client's next Fetch.
        soft = now + self._hold(plan)
        hard = soft + (FETCH_GRACE if fetch else self.limits.request_timeout)
        outstanding: set[Target] = set()
        fresh = {t for t, p in pendings.items() if not isinstance(p, int) and p.created_at >= submitted_at}
        current = dict(pendings)
        async with trio.open_nursery() as nursery:
            for target, p in pendings.items():
                if isinstance(p, int):
                    answers[target] = p
                else:
                    nursery.start_soon(wait, target, p)
                    outstanding.add(target)
            while outstanding:
                now = trio.current_time()
                if (
                    fetch
                    and answers
                    and fetch_satisfied(plan.header, answers, plan.fetch_min_bytes or 0)
                    and all(plan.fetch_partitions[t] <= self._marks.keys() for t in outstanding)
                ):
                    # Answered early only if every partition still out has marks
                    # to report (see core._finish_fetch); at first, wait for all.
                    cut_short = True
                    break
                if fetch and now >= soft and not outstanding & fresh:
                    cut_short = True
                    break
                wake = soft if fetch and now < soft else hard
                with trio.move_on_at(wake):
                    target, answer = await receive.receive()
                    outstanding.discard(target)
                    if (
                        fetch
                        and target not in fresh
                        and trio.current_time() < soft
                        and not fetch_satisfied(plan.header, {target: answer}, 1)
                    ):
                        # An earlier Fetch's sub-fetch came back empty inside this
                        # one's max_wait: ask that broker again, as a broker would
                        # keep waiting for new data. Its marks are news all the same.
                        self._marks.update(answer_marks(plan.header, answer))
                        again = self._refetch(plan, target)
                        if again is not None:
                            current[target] = again
                            fresh.add(target)
                            outstanding.add(target)
                            nursery.start_soon(wait, target, again)
                            continue
                    answers[target] = answer
                    continue
                if wake == hard:
                    timed_out = True
                    break
            nursery.cancel_scope.cancel()
        if timed_out and not fetch:
            # A broker past every deadline it was given is hung (or stalled
            # mid-answer): close its link, so the next request opens a fresh one.
            for target in outstanding:
                p = current[target]
                if isinstance(p, Pending) and (link := self._links.get((p.broker, "main"))) is not None:
                    link.close()
        cut_short = cut_short or (fetch and timed_out)
        for target in pendings:
            answers.setdefault(target, NO_ANSWER_YET if cut_short else errors.REQUEST_TIMED_OUT)
        if fetch:
            self._settle_fetch_ahead(current, answers)
        return answers

    def _ask_another_broker(self, plan: Plan, failed: int | None) -> Pending | None:
        broker = self.cluster.any_broker(exclude=failed)
        link = None if broker is None else self._link(broker, "main")
        if link is None:
            return None
        self._home = broker
        return link.submit(plan.subs[ANY])

    def _refetch(self, plan: Plan, target: Target) -> Pending | None:
        assert isinstance(target, int)
        link = self._link(target, "fetch")
        if link is None:
            return None
        pending = link.submit(plan.subs[target])
        self._fetch_ahead[target] = (plan.fetch_keys[target], pending, trio.current_time())
        return pending

    def _settle_fetch_ahead(self, pendings: Mapping[Target, Pending | int], answers: Mapping[Target, Answer]) -> None:
        """A sub-fetch whose answer went to the client is spent; one still in
        flight stays, for the client's next Fetch of the same offsets."""
        for target, p in pendings.items():
            answer = answers.get(target)
            if isinstance(answer, int) and answer == NO_ANSWER_YET:
                continue
            entry = self._fetch_ahead.get(target)  # type: ignore[arg-type]
            if entry is not None and entry[1] is p:
                del self._fetch_ahead[target]  # type: ignore[arg-type]

    def _answer(
        self,
        slot: _Slot,
        plan: Plan,
        body: Parts | None,
        pendings: Mapping[Target, Pending | int] | None = None,
        answers: Mapping[Target, Answer] | None = None,
    ) -> None:
        h = plan.header
        if body is not None:
            slot.parts = [response_header(h.api_key, h.api_version, h.correlation_id), *body]
            # An unwritten response is held for the client too: a client that
            # does not read its answers stops being read.
            response_bytes = sum(len(p) for p in slot.parts)
            self._budget.add(response_bytes)
            slot.size += response_bytes
        slot.done.set()
        if slot.captured is not None and self.capture is not None:
            ts_start, request, topology = slot.captured
            # Each broker answer as the merge saw it (None: failed, or not in yet).
            used = {t: (a if isinstance(a, bytes | bytearray | memoryview) else None) for t, a in (answers or {}).items()}
            subrequests = [
                (p.broker, p.request[4:], None if used.get(t) is None else bytes(used[t]))  # type: ignore[arg-type]
                for t, p in (pendings or {}).items()
                if isinstance(p, Pending) and p.request is not None
            ]
            self.capture.offer(
                ts_start=ts_start,
                conn_id=f"{os.getpid()}-{self.id}",
                api_key=h.api_key,
                api_version=h.api_version,
                correlation_id=h.correlation_id,
                request=request,
                response=None if slot.parts is None else b"".join(bytes(x) for x in slot.parts),
                subrequests=subrequests,
                # The topology used, plus kfan's own identity (replay rewrites answers with it).
                topology={
                    **json.loads(topology.to_json()),
                    "kfan": {"node_id": self.identity.node_id, "host": self.identity.host, "port": self.identity.port},
                },
            )

    # --- writing ---------------------------------------------------------------------

    async def _write(self, receive: trio.MemoryReceiveChannel[_Slot], scope: trio.CancelScope) -> None:
        async for slot in receive:
            await slot.done.wait()
            metrics.INFLIGHT.dec()
            self._inflight -= 1
            if slot.close is not None:
                raise _Close(slot.close)
            if slot.parts is not None:
                data = frame(slot.parts)
                # A client that stops reading its answers must not hold them (and us) for ever.
                with trio.move_on_after(self.limits.frame_timeout) as writing:
                    await self.stream.send_all(data)
                if writing.cancelled_caught:
                    log.warning("client %s: did not read a response within %.0f s, closing", self.id, self.limits.frame_timeout)
                    raise _Close("frame_timeout")
                self._last_active = trio.current_time()  # idle counts from the last byte either way
                metrics.BYTES.labels("client_out").inc(len(data))
            if slot.api_key >= 0:
                metrics.CLIENT_LATENCY.labels(str(slot.api_key)).observe(trio.current_time() - slot.started)
            self._budget.release(slot.size)
        # The client closed its side and every response is written.
        scope.cancel()


def _describe(h: RequestHeader) -> str:
    return f"api_key={h.api_key} v{h.api_version} correlation_id={h.correlation_id}"


def _broker_label(target: Target) -> str:
    return str(target) if isinstance(target, int) else "-1"


async def serve_client(
    stream: trio.SocketStream,
    cluster: Cluster,
    identity: Identity,
    limits: Limits,
    registry: set[ClientConnection] | None = None,
    capture: Capture | None = None,
    pool: MemoryPool | None = None,
) -> None:
    if registry is not None and len(registry) >= limits.max_connections:
        # As a broker over max.connections: the new connection is closed at once.
        metrics.CLIENT_CLOSES.labels("max_connections").inc()
        global _refused_logged_at
        now = trio.current_time()
        if now - _refused_logged_at >= 10:  # a connection storm must not flood the log
            _refused_logged_at = now
            log.warning("refusing client connections: %d open, the limit (--max-connections)", len(registry))
        await trio.aclose_forcefully(stream)
        return
    conn = ClientConnection(stream, cluster, identity, limits, capture, pool)
    log.debug("client %s connected", conn.id)
    metrics.CLIENT_CONNECTIONS.inc()
    if registry is not None:
        registry.add(conn)
    try:
        await conn.run()
    finally:
        metrics.CLIENT_CONNECTIONS.dec()
        if registry is not None:
            registry.discard(conn)
    log.debug("client %s gone", conn.id)
