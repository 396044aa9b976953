"""One client connection: read frames, plan, send, gather, merge, answer in order.

The reader reads frames continuously, plans each request (the pure core,
:func:`proxy.core.plan_request`), resolves coordinators and submits
sub-requests to this connection's links in the client's order, then hands
the wait-and-merge to a task of its own: many requests are in flight at once.
The writer writes responses strictly in request order (:mod:`.ordering`).
acks=0 Produce requests hold a place in that order but write nothing. In-flight requests and
held bytes (frames arriving, requests in flight with their decoded form,
responses unwritten; see :mod:`.budget`) are bounded: when either is full the
reader stops reading, and TCP pushes back on the client.

Every wait has a deadline: a frame must arrive whole within ``frame_timeout``,
an idle connection is closed after ``idle_timeout`` (Kafka's
connections.max.idle.ms), and a request may keep a broker no longer than its
own fields allow, capped by ``max_hold``. A client's EOF or reset ends the
connection at once, and with it every request in flight and every broker link.

A failure while handling one request ends at most this connection (logged
with the request's api key, version and correlation id, and counted); nothing
escapes :meth:`ClientConnection.run`. The stream is any ``trio.abc.Stream``
and broker links open through ``connect_broker``, so the whole connection
runs over memory streams in tests.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from backends.cluster import Cluster
from backends.link import Pending
from backends.links import BrokerConnect, Lane, LinkPool
from backends.sasl import relogin_confirmed

from . import metrics
from .budget import Budget, MemoryPool
from .capture import Capture
from .capture.rows import CaptureRow, topology_document
from .client_auth import Answer, ClientAuthConfig, ClientSession, Refused
from .core import (
    BrokerAnswer,
    Context,
    Destination,
    Forward,
    Identity,
    LocalReply,
    Response,
    Unsupported,
)
from .core.layout import TopicPartition
from .forwarder import Forwarder, Handles
from .frame_io import receive_into, send_frame
from .kafka.frames import MAPPED_FROM, FrameReader, FrameTooLarge
from .kafka.headers import RequestHeader, peek_request, response_header
from .kafka.records import Invalid
from .kafka.wire import Malformed, Parts
from .ordering import ResponseOrderer, ResponseSlot
from .prelogin import Admitted, PreLogin, PreLoginLimits, host_of
from .reclaim import release_later
from .security.tls import looks_like_tls

log = logging.getLogger("kfan.connection")
_ids = itertools.count(1)
# How long a connection kfan ends after an answer (a failed login) waits for the client to close it.
CLOSE_LINGER = 1.0


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
    validate_records: bool = True  # --validate-records crc: bad produced batches stop at kfan
    fetch_ahead_bytes: int = 16 * 1024 * 1024  # records sub-fetches sent ahead may bring in, per connection
    login: PreLoginLimits = field(default_factory=PreLoginLimits)  # what a connection not logged in yet may hold


class _Close(Exception):
    """End this client connection (the reason is logged and counted where it is raised)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        if reason != "eof":  # the client's own doing
            metrics.CLIENT_CLOSES.labels(reason).inc()


class _Receiver:
    """The client's bytes under their deadlines: a frame begun must arrive whole
    within ``frame_timeout``; a connection with nothing in flight is closed
    after ``idle_timeout``. Bytes of frames still arriving count in the pool."""

    def __init__(self, stream: trio.abc.Stream, limits: Limits, budget: Budget, pool: MemoryPool, client: int) -> None:
        self.stream = stream
        self.limits = limits
        self.budget = budget
        self.pool = pool
        self.client = client
        self.partial = 0  # bytes of frames still arriving, counted in the pool
        self.last_active = trio.current_time()  # the last byte either way
        self._frame_started = 0.0
        self._draining = trio.Event()
        self._receiving: trio.CancelScope | None = None
        self.login_deadline = math.inf  # a connection not logged in by then is closed

    def drain(self) -> None:
        self._draining.set()
        if self._receiving is not None:
            self._receiving.cancel()

    def sync_partial(self, reader: FrameReader) -> None:
        held = reader.buffered()
        if held and not self.partial:
            self._frame_started = trio.current_time()
        self.pool.add(held - self.partial)
        self.partial = held

    def release(self) -> None:
        self.pool.sub(self.partial)
        self.partial = 0

    async def receive(self, busy: Callable[[], bool], reader: FrameReader) -> int | None:
        """Read the client's next bytes into ``reader``: how many (0 at EOF), or None when draining; closes on a deadline.

        ``busy()``: requests are in flight, so the connection is not idle.
        """
        limits = self.limits
        while not self._draining.is_set():
            deadline = self._frame_started + limits.frame_timeout if self.partial else self.last_active + limits.idle_timeout
            with trio.CancelScope(deadline=min(deadline, self.login_deadline)) as self._receiving:
                await self.pool.wait_to_read(self.budget.used + self.partial)
                n = await receive_into(self.stream, reader)
                self.last_active = trio.current_time()
                return n
            self._receiving = None
            now = trio.current_time()
            if self._draining.is_set():
                break
            if now >= self.login_deadline:
                log.warning("client %s: not logged in within %.0f s, closing", self.client, limits.login.timeout)
                raise _Close("login_timeout")
            if self.partial and now >= self._frame_started + limits.frame_timeout:
                log.warning("client %s: a frame was not completed within %.0f s, closing", self.client, limits.frame_timeout)
                raise _Close("frame_timeout")
            if not self.partial and not busy() and now >= self.last_active + limits.idle_timeout:
                log.info("client %s: idle for %.0f s, closing", self.client, limits.idle_timeout)
                raise _Close("idle_timeout")
            # Requests in flight: the connection is not idle. Look again later.
            self.last_active = max(self.last_active, now - limits.idle_timeout / 2)
        return None


class ClientConnection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        cluster: Cluster,
        identity: Identity,
        limits: Limits,
        capture: Capture | None = None,
        pool: MemoryPool | None = None,
        connect_broker: BrokerConnect | None = None,
        *,
        auth: ClientAuthConfig | None = None,
        peer: str = "?",
        principal: str | None = None,
        admitted: Admitted | None = None,
    ) -> None:
        """``auth``: clients log in with SASL first; ``principal``: who the client's TLS certificate says it is;
        ``admitted``: its place among the process's connections not logged in yet (with ``auth``)."""
        self.stream = stream
        self.capture = capture
        self.cluster = cluster
        self.identity = identity
        self.limits = limits
        self.id = next(_ids)
        self._connect_broker = connect_broker
        self._pool = pool if pool is not None else MemoryPool(limits.max_buffered_bytes)
        self._budget = Budget(limits.max_connection_bytes, self._pool)
        self._receiver = _Receiver(stream, limits, self._budget, self._pool, self.id)
        # Until the SASL login: small frames, a deadline, and bytes held in the pool of those not logged in.
        self._admitted: Admitted | None = None
        if auth is not None:
            self._admitted = admitted or PreLogin(limits.login).admit(host_of(peer))
            assert self._admitted is not None
            self._budget.pool = self._receiver.pool = self._admitted.prelogin.pool
            self._receiver.login_deadline = self._admitted.deadline
        self._orderer = ResponseOrderer(limits.max_inflight)
        self.peer = peer
        self.principal = principal
        name = f"client {self.id} ({peer})"
        self._session = None if auth is None else ClientSession(auth, name, confirm=self._confirm, on_login=self._relogin)
        self._links: LinkPool | None = None
        self._logged_refused = False
        # Sub-requests of requests that want no answer (Produce acks=0), until written to their brokers.
        self._unanswered: list[Handles] = []

    async def run(self) -> None:
        """Serve the client until it leaves or must go; never raises (but for cancellation)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                session = self._session
                carry = session is not None and session.config.carry_identity
                links = self._links = LinkPool(
                    self.cluster,
                    nursery,
                    max_frame_bytes=self.limits.max_frame_bytes,
                    keep_requests=self.capture is not None,
                    connect=self._connect_broker,
                    credentials=session.broker_credentials if carry and session is not None else None,
                    budget=self._budget,  # brokers' answers count as held for this client
                )
                limits = self.limits
                self._forwarder = Forwarder(
                    self.cluster,
                    links,
                    self.identity,
                    request_timeout=limits.request_timeout,
                    max_hold=limits.max_hold,
                    client=self.id,
                    client_identity=carry,
                    validate_records=limits.validate_records,
                    fetch_ahead_bytes=limits.fetch_ahead_bytes,
                    budget=self._budget,
                    nursery=nursery,
                )
                nursery.start_soon(self._write, nursery.cancel_scope)
                async with self._orderer:
                    await self._read()
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
            self._orderer.abandon()  # requests the connection's end abandoned
            self._budget.release_all()
            self._receiver.release()
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)

    def drain(self) -> None:
        """Stop reading requests; answer those already read, then close (graceful shutdown)."""
        self._receiver.drain()

    # --- reading -------------------------------------------------------------

    def _logged_in(self, reader: FrameReader) -> None:
        """The client logged in: the full frame size, no login deadline, and the pool logged-in clients share."""
        admitted, self._admitted = self._admitted, None
        assert admitted is not None
        admitted.leave()
        reader.max_frame_bytes = self.limits.max_frame_bytes
        self._receiver.login_deadline = math.inf
        held = self._budget.used + self._receiver.partial
        admitted.prelogin.pool.sub(held)
        self._pool.add(held)
        self._budget.pool = self._receiver.pool = self._pool

    async def _read(self) -> None:
        reader = FrameReader(self.limits.max_frame_bytes if self._admitted is None else self.limits.login.max_receive_bytes)
        first = True  # no byte read yet
        while True:
            await self._orderer.make_room()  # before reading: at most max_inflight requests read and not yet answered
            try:
                payload = reader.next_frame()
            except FrameTooLarge as e:
                if self._admitted is not None:
                    log.warning("client %s (%s): %s before login (--client-auth-max-receive-bytes), closing", self.id, self.peer, e)
                    raise _Close("login_frame_too_large") from e
                log.warning("client %s: malformed frame, closing: %s", self.id, e)
                raise _Close("malformed") from e
            except Malformed as e:
                log.warning("client %s: malformed frame, closing: %s", self.id, e)
                raise _Close("malformed") from e
            self._receiver.sync_partial(reader)
            if payload is None:
                n = await self._receiver.receive(busy=lambda: self._orderer.inflight > 0, reader=reader)
                if n is None:
                    return  # draining: every complete request read is answered; no new ones
                if not n:
                    # A broker closes on EOF too: what the client still waits for
                    # is abandoned at once, with its broker links. But a request
                    # that wants no answer (Produce acks=0), read whole before the
                    # client left, is one a broker would still carry out: its
                    # sub-requests are written first (clients close right after).
                    if reader.pending_partial():
                        log.warning("client %s: connection ended inside a frame", self.id)
                    await self._send_unanswered()
                    raise _Close("eof")
                if first and looks_like_tls(reader.peek(16)):
                    log.warning("client %s (%s): a TLS handshake on a plaintext listener, closing", self.id, self.peer)
                    raise _Close("tls_on_plaintext")
                first = False
                self._receiver.sync_partial(reader)
                continue
            metrics.BYTES.labels("client_in").inc(len(payload) + 4)
            if self._session is not None:
                answer = await self._admit(payload)
                if self._admitted is not None and self._session.authenticated:
                    self._logged_in(reader)
                if answer is not None:
                    # kfan's own SASL answer, in its place in the response order.
                    slot = ResponseSlot(0, answer.api_key)
                    metrics.CLIENT_REQUESTS.labels(str(answer.api_key), "-").inc()
                    await self._orderer.place(slot)
                    slot.parts, slot.close_after = answer.parts, answer.close
                    slot.done.set()
                    continue
            read_at = time.time_ns() if self.capture is not None and self.capture.sampled() else None
            ctx, plan = await self._plan(payload)
            if plan.refused:
                self._refused_records(plan.refused)
            await self._budget.acquire(plan.cost)
            h = plan.header
            slot = ResponseSlot(plan.cost, h.api_key)
            if read_at is not None:
                slot.captured = (read_at, bytes(payload), ctx.topology)
            metrics.CLIENT_REQUESTS.labels(str(h.api_key), str(h.api_version)).inc()
            metrics.FANOUT.labels(str(h.api_key)).observe(len(plan.subs) if isinstance(plan, Forward) else 0)
            await self._orderer.place(slot)
            if isinstance(plan, LocalReply):
                _count_errors(plan.errors)
                self._answer(slot, plan.header, plan.body if plan.expect_response else None)
                continue
            assert isinstance(plan, Forward)
            submitted_at = trio.current_time()
            try:
                handles = await self._forwarder.submit(plan)
            except Exception as e:
                log.error("client %s: unexpected error sending %s", self.id, _describe(h), exc_info=True)
                raise _Close("internal_error") from e
            if not plan.expect_response:
                self._unanswered.append(handles)
            self._nursery.start_soon(self._complete, plan, handles, slot, submitted_at)

    def _refused_records(self, refused: Mapping[TopicPartition, Invalid]) -> None:
        for problem in refused.values():
            metrics.INVALID_BATCHES.labels(problem.reason).inc()
        if not self._logged_refused:  # once per connection: a client with a bad encoder would flood the log
            self._logged_refused = True
            where = ", ".join(f"{topic}-{partition} ({problem.reason})" for (topic, partition), problem in list(refused.items())[:5])
            log.warning("client %s (%s): refused produced records that no broker would take: %s", self.id, self.peer, where)

    async def _admit(self, payload: bytes | memoryview) -> Answer | None:
        assert self._session is not None
        try:
            return await self._session.admit(payload)
        except Refused as e:
            log.warning("client %s (%s): closing: %s", self.id, self.peer, e)
            raise _Close(e.reason) from None
        except Malformed as e:
            key, version, cid = peek_request(payload) if len(payload) >= 8 else (-1, -1, -1)
            log.warning("client %s: closing on SASL request api_key=%s v%s correlation_id=%s: %s", self.id, key, version, cid, e)
            raise _Close("malformed") from e

    async def _confirm(self, credentials: object) -> str | None:
        """Log a broker link in with the client's credentials (--broker-identity client): None if the broker took them."""
        links = self._links
        assert links is not None
        broker = links.default_broker()
        link = None if broker is None else links.link(broker, Lane.MAIN)
        if link is None:
            return "no broker is reachable"
        with trio.move_on_after(self.limits.request_timeout):
            await link.ready.wait()
        if not link.ready.is_set():
            link.close()
            return f"broker {broker} did not answer the login within {self.limits.request_timeout:.0f} s"
        if link.failed is not None:
            return str(link.failed)
        if self._session is not None and self._session.authenticated:
            # A re-authentication: the open link logs in again with the new credentials, before the client is answered.
            with trio.move_on_after(self.limits.request_timeout):
                return await relogin_confirmed(link)
            link.close()
            return f"broker {broker} did not answer the login within {self.limits.request_timeout:.0f} s"
        return None

    def _relogin(self) -> None:
        """The client logged in again: with its identity carried, so do its broker links."""
        if self._links is not None and self._session is not None and self._session.config.carry_identity:
            self._links.reauthenticate()

    async def _plan(self, payload: bytes | memoryview) -> tuple[Context, LocalReply | Forward]:
        """Plan one request; a request kfan cannot plan closes the connection."""
        try:
            return await self._forwarder.plan(payload)
        except (Malformed, Unsupported) as e:
            key, version, cid = peek_request(payload)
            log.warning("client %s: closing on request api_key=%s v%s correlation_id=%s: %s", self.id, key, version, cid, e)
            raise _Close("malformed" if isinstance(e, Malformed) else "unsupported") from e
        except Exception as e:
            key, version, cid = peek_request(payload)
            log.error("client %s: unexpected error planning api_key=%s v%s correlation_id=%s", self.id, key, version, cid, exc_info=True)
            raise _Close("internal_error") from e

    # --- completing ----------------------------------------------------------------

    async def _complete(self, plan: Forward, handles: Handles, slot: ResponseSlot, submitted_at: float) -> None:
        try:
            await self._complete_one(plan, handles, slot, submitted_at)
        except Exception:
            # A bug met while answering one request ends this connection (in
            # order: the responses before it are still written), nothing more.
            log.error("client %s: unexpected error answering %s", self.id, _describe(plan.header), exc_info=True)
            slot.close = "internal_error"
            slot.done.set()

    async def _complete_one(self, plan: Forward, handles: Handles, slot: ResponseSlot, submitted_at: float) -> None:
        if not plan.expect_response:
            await self._sent(handles)
            self._unanswered.remove(handles)
            self._answer(slot, plan.header, None, handles)
            return
        reply, handles, answers = await self._forwarder.reply(plan, handles, submitted_at)
        if reply is None:
            # No error code of this response can say a broker failed: close, as a broker would on its own failure.
            slot.close = "broker_answer"
            slot.done.set()
            return
        _count_errors(reply.errors)
        for (broker, locality), n in reply.fetched.items():
            metrics.FETCH_BYTES.labels(str(broker), locality).inc(n)
        self._answer(slot, plan.header, reply.body, handles, answers)

    async def _sent(self, handles: Handles) -> None:
        """Until each sub-request is written to its broker (or failed), at most the request timeout."""
        with trio.move_on_after(self.limits.request_timeout):
            for h in handles.values():
                if isinstance(h, Pending):
                    await h.sent.wait()

    async def _send_unanswered(self) -> None:
        for handles in list(self._unanswered):
            await self._sent(handles)

    def _answer(
        self,
        slot: ResponseSlot,
        h: RequestHeader,
        body: Parts | None,
        handles: Handles | None = None,
        answers: Mapping[Destination, BrokerAnswer] | None = None,
    ) -> None:
        if body is not None:
            slot.parts = [response_header(h.api_key, h.api_version, h.correlation_id), *body]
            # An unwritten response is held for the client too: a client that
            # does not read its answers stops being read.
            response_bytes = sum(len(p) for p in slot.parts)
            self._budget.add(response_bytes)
            slot.size += response_bytes
        slot.done.set()
        if slot.captured is not None and self.capture is not None:
            self.capture.offer(_capture_row(slot, h, f"{os.getpid()}-{self.id}", self.identity, handles or {}, answers or {}))

    # --- writing ---------------------------------------------------------------------

    async def _write(self, scope: trio.CancelScope) -> None:
        while (slot := await self._orderer.next_answered()) is not None:
            if slot.close is not None:
                raise _Close(slot.close)
            if slot.parts is not None:
                # A client that stops reading its answers must not hold them (and us) for ever.
                written = 0
                with trio.move_on_after(self.limits.frame_timeout) as writing:
                    written = await send_frame(self.stream, slot.parts)
                if writing.cancelled_caught:
                    log.warning("client %s: did not read a response within %.0f s, closing", self.id, self.limits.frame_timeout)
                    raise _Close("frame_timeout")
                self._receiver.last_active = trio.current_time()  # idle counts from the last byte either way
                metrics.BYTES.labels("client_out").inc(written)
            if slot.close_after is not None:
                # Let the client read the answer and leave first (the reader still sees its EOF,
                # and refuses anything else it sends): closing under an answer in flight lets
                # some clients lose it to a reset or an unannounced TLS end.
                await trio.sleep(CLOSE_LINGER)
                raise _Close(slot.close_after)
            metrics.CLIENT_LATENCY.labels(str(slot.api_key)).observe(trio.current_time() - slot.started)
            self._budget.release(slot.size)
            if slot.size >= MAPPED_FROM:
                release_later(slot.parts)  # the brokers' answers it holds are let go of off the event loop
                slot.parts = None
        # The client closed its side and every response is written.
        scope.cancel()


def _describe(h: RequestHeader) -> str:
    return f"api_key={h.api_key} v{h.api_version} correlation_id={h.correlation_id}"


def _count_errors(counts: Mapping[tuple[int, int], int]) -> None:
    for (code, broker), n in counts.items():
        metrics.ERRORS.labels(str(code), str(broker if isinstance(broker, int) else -1)).inc(n)


def _capture_row(
    slot: ResponseSlot, h: RequestHeader, conn_id: str, identity: Identity, handles: Handles, answers: Mapping[Destination, BrokerAnswer]
) -> CaptureRow:
    assert slot.captured is not None
    ts_start, request, topology = slot.captured
    subrequests = []
    for d, p in handles.items():
        if isinstance(p, Pending) and p.request is not None:
            answer = answers.get(d)  # as the merge saw it (None: failed, or not in yet)
            subrequests.append((p.broker, p.request[4:], bytes(answer.payload) if isinstance(answer, Response) else None))
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
