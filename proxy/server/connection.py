"""One client connection's state machine and its I/O: frames in, answers out in order (trio).

The rule, after h11: everything that changes this connection's state
happens in this module. Its states and what moves it between them:

- **logging in** (SASL required): frames up to ``login.max_receive_bytes``,
  a login deadline, bytes held in the pool of connections not logged in,
  only SASL requests answered (:mod:`.client_auth`) -> **logged in** once the
  session says so (:class:`_Login`). Without SASL a
  connection starts logged in.
- **reading**: frames are read continuously, each request handed once to
  the :class:`~proxy.server.forwarder.Forwarder`, which owns it until its answer.
  The reader waits (and TCP pushes back on the client) while the requests in
  flight (:mod:`.ordering`) or the bytes held (frames arriving, requests in
  flight with their decoded form, responses unwritten; :mod:`.budget`) are at
  their bound. -> **draining** on :meth:`ClientConnection.drain` (graceful
  stop): no new request is read, those read are answered.
- **closing** -> **closed**: a deadline passed (a frame begun must arrive
  whole within ``frame_timeout``; a connection with nothing in flight is
  closed after ``idle_timeout``, Kafka's connections.max.idle.ms), the client
  left (EOF or reset: what it waits for is abandoned at once, with every
  broker link), it sent what kfan cannot serve, or the writer reached an
  answer that ends the connection (a slot's ``close``, or ``close_after``
  once written). ``run``'s end releases everything held for the client.

A failure while handling one request ends at most this connection (logged
with the request's api key, version and correlation id, and counted); nothing
escapes :meth:`ClientConnection.run`. The stream is any ``trio.abc.Stream``
and broker links open through ``connect_broker``, so the whole connection
runs over memory streams in tests.

Boundaries: which connections are served is admission's (:mod:`.admission`);
what a request means and how it is answered is the forwarder's.
"""

from __future__ import annotations

import itertools
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from backends.cluster import Cluster
from backends.links import BrokerConnect, LinkPool
from proxy.capture.recorder import Capture
from proxy.core import Identity
from proxy.kafka.frames import MAPPED_FROM, FrameReader, FrameTooLarge
from proxy.kafka.headers import peek_request
from proxy.kafka.wire import Malformed
from proxy.runtime import metrics
from proxy.runtime.budget import Budget, MemoryPool
from proxy.runtime.frame_io import receive_into, send_frame
from proxy.runtime.reclaim import release_later
from proxy.runtime.telemetry import ClientTelemetry
from proxy.security.tls import looks_like_tls
from proxy.server.broker_login import confirm_login
from proxy.server.client_auth import Answer, ClientAuthConfig, ClientSession, Refused
from proxy.server.forwarder import Forwarder, Unanswerable
from proxy.server.governance import ClientGovernance, Governance
from proxy.server.ordering import ResponseOrderer, ResponseSlot
from proxy.server.prelogin import Admitted, PreLogin, PreLoginLimits, host_of
from proxy.server.quotas import ClientThrottle, Quotas
from proxy.server.token_identity import TokenIdentity

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
    max_age: float = 0.0  # --connection-max-age: close at a safe point once older (0: never)
    max_age_jitter: float = 0.0  # a random part up to this, added to each connection's max age
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
        self.expires_at = math.inf  # past it, the connection is closed when nothing is in flight (max age, drain)
        self.expiry_reason = "max_age"
        self.expired = False  # it is closing for its age, or a drain

    def drain(self) -> None:
        self._draining.set()
        if self._receiving is not None:
            self._receiving.cancel()

    async def pause_until(self, deadline: float) -> bool:
        """Read nothing until ``deadline`` (a throttled client); False when draining. The wait counts against
        neither the idle nor the frame deadline."""
        with trio.CancelScope(deadline=deadline) as self._receiving:
            await self._draining.wait()
        self._receiving = None
        now = trio.current_time()
        self.last_active = now
        if self.partial:
            self._frame_started = now
        return not self._draining.is_set()

    def expiring(self) -> bool:
        """Past the max age (or a drain's deadline): no request is read any more; those read are answered, then the
        connection closes (:attr:`expired`)."""
        if not self.expired and trio.current_time() >= self.expires_at:
            self.expired = True
            log.info("client %s: closing once the requests it sent are answered (%s)", self.client, self.expiry_reason)
        return self.expired

    def expire_by(self, deadline: float) -> None:
        """Close the connection at its first safe point after ``deadline`` (the receiver looks again now)."""
        self.expires_at = deadline
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
            with trio.CancelScope(deadline=min(deadline, self.login_deadline, self.expires_at)) as self._receiving:
                await self.pool.wait_to_read(self.budget.used + self.partial)
                n = await receive_into(self.stream, reader)
                self.last_active = trio.current_time()
                return n
            self._receiving = None
            now = trio.current_time()
            if self._draining.is_set() or self.expiring():
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


class _Login:
    """The logging-in state, with SASL: the client's session, its place among the connections not logged in
    yet (small frames, a deadline, their own memory pool), and the move to logged in."""

    def __init__(self, auth: ClientAuthConfig, conn: ClientConnection, admitted: Admitted | None) -> None:
        self._conn = conn
        self.admitted = admitted or PreLogin(conn.limits.login).admit(host_of(conn.peer))
        assert self.admitted is not None
        conn._budget.pool = conn._receiver.pool = self.admitted.prelogin.pool
        conn._receiver.login_deadline = self.admitted.deadline
        who = f"client {conn.id} ({conn.peer})"
        # A SCRAM login carried to the brokers: as a delegation token, renewed and expired by kfan's own identity.
        self.tokens = TokenIdentity(conn.cluster, who) if auth.carry_identity else None
        mint = self.tokens.credentials if self.tokens is not None else None
        self.session = ClientSession(auth, who, confirm=self._confirm, on_login=self._relogin, mint=mint)
        self.links: LinkPool | None = None  # the connection's, once it runs

    @property
    def pending(self) -> bool:
        """Not logged in yet."""
        return self.admitted is not None

    async def admit(self, payload: bytes | memoryview, reader: FrameReader) -> Answer | None:
        """kfan's own answer to a SASL request (None: not one, the request is served); closes on a refusal."""
        conn = self._conn
        try:
            answer = await self.session.admit(payload)
        except Refused as e:
            log.warning("client %s (%s): closing: %s", conn.id, conn.peer, e)
            conn._audit_connection("refused", reason=e.reason, mechanism=self.session.mechanism)
            raise _Close(e.reason) from None
        except Malformed as e:
            key, version, cid = peek_request(payload) if len(payload) >= 8 else (-1, -1, -1)
            log.warning("client %s: closing on SASL request api_key=%s v%s correlation_id=%s: %s", conn.id, key, version, cid, e)
            raise _Close("malformed") from e
        if self.admitted is not None and self.session.authenticated:
            self._logged_in(reader)
            conn._audit_connection("authenticated", mechanism=self.session.mechanism)
        return answer

    def _logged_in(self, reader: FrameReader) -> None:
        """The client logged in: the full frame size, no login deadline, and the pool logged-in clients share."""
        admitted, self.admitted = self.admitted, None
        assert admitted is not None
        admitted.leave()
        conn = self._conn
        reader.max_frame_bytes = conn.limits.max_frame_bytes
        conn._receiver.login_deadline = math.inf
        held = conn._budget.used + conn._receiver.partial
        admitted.prelogin.pool.sub(held)
        conn._pool.add(held)
        conn._budget.pool = conn._receiver.pool = conn._pool

    async def _confirm(self, credentials: object) -> str | None:
        """Log a broker link in with the client's credentials (--broker-identity client): None if the broker took them."""
        assert self.links is not None
        return await confirm_login(self.links, self._conn.limits.request_timeout, relogin=self.session.authenticated)

    def _relogin(self) -> None:
        """The client logged in again: with its identity carried, so do its broker links."""
        if self.links is not None and self.session.config.carry_identity:
            self.links.reauthenticate()


class ClientConnection:
    """One client connection: its state, its reader and its writer (see the module's docstring)."""

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
        telemetry: ClientTelemetry | None = None,
        governance: Governance | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        """``auth``: clients log in with SASL first; ``principal``: who the client's TLS certificate says it is;
        ``admitted``: its place among the process's connections not logged in yet (with ``auth``); ``governance``;
        ``quotas``: the process's client quotas, which throttle this connection when it goes over them."""
        self.stream = stream
        self.capture = capture
        self.cluster = cluster
        self.identity = identity
        self.limits = limits
        self.id = next(_ids)
        self.peer = peer
        self.principal = principal
        self._telemetry = telemetry  # kfan's client telemetry (KIP-714), when it has subscriptions
        self._governed = None if governance is None else ClientGovernance(governance, self.id, peer, self._principal)
        self._throttle = None if quotas is None else ClientThrottle(quotas, self._principal)
        self._connect_broker = connect_broker
        self._pool = pool if pool is not None else MemoryPool(limits.max_buffered_bytes)
        self._budget = Budget(limits.max_connection_bytes, self._pool)
        self._receiver = _Receiver(stream, limits, self._budget, self._pool, self.id)
        # The max age counts from the opening, or from the reload that changed it (turning it on after a scale-out
        # must not close every old connection at once).
        self._age_from = trio.current_time()
        self._age_jitter = random.random()  # this connection's share of --connection-max-age-jitter, kept across reloads
        self._set_max_age(limits)
        self._orderer = ResponseOrderer(limits.max_inflight)
        self._login = None if auth is None else _Login(auth, self, admitted)
        self._reader: FrameReader | None = None
        self._forwarder: Forwarder | None = None

    async def run(self) -> None:
        """Serve the client until it leaves or must go; never raises (but for cancellation)."""
        self._audit_connection("opened", mechanism="mTLS" if self.principal else None)
        reason = "eof"
        try:
            async with trio.open_nursery() as nursery:
                session = None if self._login is None else self._login.session
                carry = session is not None and session.config.carry_identity
                limits = self.limits
                links = LinkPool(
                    self.cluster,
                    nursery,
                    max_frame_bytes=limits.max_frame_bytes,
                    keep_requests=self.capture is not None,
                    connect=self._connect_broker,
                    credentials=session.broker_credentials if carry and session is not None else None,
                    budget=self._budget,  # brokers' answers count as held for this client
                )
                if self._login is not None:
                    self._login.links = links
                    if self._login.tokens is not None:
                        self._login.tokens.nursery = nursery
                self._forwarder = Forwarder(
                    self.cluster,
                    links,
                    self.identity,
                    self._orderer,
                    self._budget,
                    nursery,
                    client=self.id,
                    peer=self.peer,
                    capture=self.capture,
                    request_timeout=limits.request_timeout,
                    max_hold=limits.max_hold,
                    validate_records=limits.validate_records,
                    fetch_ahead_bytes=limits.fetch_ahead_bytes,
                    client_identity=carry,
                    telemetry=self._telemetry,
                    principal=self._principal,
                    governed=self._governed,
                    throttle=self._throttle,
                )
                nursery.start_soon(self._write, nursery.cancel_scope)
                async with self._orderer:
                    await self._read()
            if self._receiver.expired:
                reason = self._receiver.expiry_reason
                metrics.CLIENT_CLOSES.labels(reason).inc()
        except* _Close as eg:
            reason = eg.exceptions[0].reason  # type: ignore[attr-defined]
        except* (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as eg:
            reason = "connection_lost"
            log.debug("client %s: connection lost: %r", self.id, eg.exceptions[0])
        except* Exception as eg:
            # The last resort: a bug met while serving this client ends this
            # client's connection, never the process.
            reason = "internal_error"
            metrics.CLIENT_CLOSES.labels("internal_error").inc()
            log.error("client %s: closing after an unexpected error", self.id, exc_info=eg)
        finally:
            self._audit_connection("closed", reason=reason)
            self._orderer.abandon()  # requests the connection's end abandoned
            if self._login is not None and self._login.tokens is not None:
                await self._login.tokens.expire()  # shielded, bounded
            self._budget.release_all()
            self._receiver.release()
            with trio.CancelScope(shield=True):
                if reason in ("max_age", "drain"):
                    await self._goodbye()
                await trio.aclose_forcefully(self.stream)

    async def _goodbye(self) -> None:
        """End the connection after its last answer with a FIN, not a reset: what the client sent that was not
        read is discarded for up to ``CLOSE_LINGER`` while it reads the answers and closes (a close with unread
        bytes would reset the connection, and a reset may overtake answers still on their way)."""
        raw = getattr(self.stream, "transport_stream", self.stream)  # under TLS: the socket (closing, no close_notify)
        with trio.move_on_after(CLOSE_LINGER):
            try:
                if isinstance(raw, trio.abc.HalfCloseableStream):
                    await raw.send_eof()
                while await raw.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    def _audit_connection(self, event: str, **fields: Any) -> None:
        if self._governed is not None:
            self._governed.connection_event(f"connection.{event}", **fields)

    def _principal(self) -> str:
        """Who the client is, as far as kfan knows (its login, its certificate), for its telemetry's labels."""
        session = None if self._login is None else self._login.session
        return (session.principal if session is not None else None) or self.principal or ""

    def drain(self) -> None:
        """Stop reading requests; answer those already read, then close (graceful shutdown)."""
        self._receiver.drain()

    def _set_max_age(self, limits: Limits) -> None:
        if self._receiver.expiry_reason != "max_age":
            return  # draining already: the drain's deadline holds
        if limits.max_age > 0:
            self._receiver.expire_by(self._age_from + limits.max_age + self._age_jitter * limits.max_age_jitter)
        else:
            self._receiver.expire_by(math.inf)

    def close_gradually(self, deadline: float) -> None:
        """Close at the first safe point after ``deadline`` (a replica being drained), or at the max age if sooner."""
        self._receiver.expiry_reason = "drain"
        self._receiver.expire_by(min(deadline, self._receiver.expires_at))

    def reconfigure(self, limits: Limits) -> None:
        """Limits reloaded: what is safe to change under a running connection changes now (its deadlines and
        timeouts, the bytes it may hold, the largest frame, record validation, fetching ahead); the bound on
        requests in flight and the login limits stay as the connection opened with."""
        if limits.max_age != self.limits.max_age:
            self._age_from = trio.current_time()
        self.limits = self._receiver.limits = limits
        self._set_max_age(limits)
        self._budget.limit = limits.max_connection_bytes
        if self._reader is not None and not (self._login is not None and self._login.pending):
            self._reader.max_frame_bytes = limits.max_frame_bytes
        forwarder = self._forwarder
        if forwarder is not None:
            forwarder.request_timeout = forwarder.dispatcher.request_timeout = limits.request_timeout
            forwarder.dispatcher.max_hold = limits.max_hold
            forwarder.planner.validate_records = limits.validate_records
            forwarder.planner.fetch_ahead_bytes = limits.fetch_ahead_bytes

    # --- reading -------------------------------------------------------------

    async def _read(self) -> None:
        logging_in = self._login is not None and self._login.pending
        reader = self._reader = FrameReader(self.limits.login.max_receive_bytes if logging_in else self.limits.max_frame_bytes)
        first = True  # no byte read yet
        while True:
            await self._orderer.make_room()  # before reading: at most max_inflight requests read and not yet answered
            if self._receiver.expiring():
                return  # a request not read is not lost: the client sends it again on its next connection
            throttle = self._throttle
            if throttle is not None and throttle.until > trio.current_time() and not await self._receiver.pause_until(throttle.until):
                return  # draining
            try:
                payload = reader.next_frame()
            except FrameTooLarge as e:
                if self._login is not None and self._login.pending:
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
                    await self._forwarder.send_unanswered()
                    raise _Close("eof")
                if first and looks_like_tls(reader.peek(16)):
                    log.warning("client %s (%s): a TLS handshake on a plaintext listener, closing", self.id, self.peer)
                    raise _Close("tls_on_plaintext")
                first = False
                self._receiver.sync_partial(reader)
                continue
            metrics.BYTES.labels("client_in").inc(len(payload) + 4)
            if self._login is not None and (answer := await self._login.admit(payload, reader)) is not None:
                # kfan's own SASL answer, in its place in the response order.
                slot = ResponseSlot(0, answer.api_key)
                metrics.CLIENT_REQUESTS.labels(str(answer.api_key), "-").inc()
                await self._orderer.place(slot)
                slot.parts, slot.close_after = answer.parts, answer.close
                slot.done.set()
                continue
            try:
                await self._forwarder.take(payload)  # the request is the forwarder's from here to its answer
            except Unanswerable as e:
                raise _Close(e.reason) from e

    # --- writing ---------------------------------------------------------------------

    async def _write(self, scope: trio.CancelScope) -> None:
        while (slot := await self._orderer.next_answered()) is not None:
            if slot.close is not None:
                raise _Close(slot.close)
            if slot.hold and self._throttle is not None:
                # Over a quota, a client of a version that does not wait on its own gets its answer that much
                # later (the requests behind it wait already: the reader reads nothing before then).
                await trio.sleep_until(self._throttle.until)
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
