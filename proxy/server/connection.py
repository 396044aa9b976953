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
from typing import Any

import trio

from backends.cluster import Cluster
from backends.links import BrokerConnect, LinkPool
from proxy.capture.recorder import Capture
from proxy.core import Identity
from proxy.kafka.frames import FrameReader, FrameTooLarge
from proxy.kafka.headers import peek_request
from proxy.kafka.wire import Malformed
from proxy.runtime import metrics
from proxy.runtime.budget import Budget, MemoryPool
from proxy.runtime.telemetry import ClientTelemetry
from proxy.security.tls import looks_like_tls
from proxy.server.broker_login import confirm_login
from proxy.server.client_auth import Answer, ClientAuthConfig, ClientSession, Refused
from proxy.server.forwarder import Forwarder, Unanswerable, reconfigure_forwarder
from proxy.server.governance import ClientGovernance, Governance
from proxy.server.limits import Limits
from proxy.server.ordering import ResponseOrderer, ResponseSlot
from proxy.server.prelogin import Admitted, PreLogin, host_of
from proxy.server.quotas import ClientThrottle, Quotas
from proxy.server.receiver import Closing, Receiver, goodbye
from proxy.server.token_identity import TokenIdentity
from proxy.server.writer import write_answers

log = logging.getLogger("kfan.connection")
_ids = itertools.count(1)


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
            raise Closing(e.reason) from None
        except Malformed as e:
            key, version, cid = peek_request(payload) if len(payload) >= 8 else (-1, -1, -1)
            log.warning("client %s: closing on SASL request api_key=%s v%s correlation_id=%s: %s", conn.id, key, version, cid, e)
            raise Closing("malformed") from e
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
        ``admitted``: its place among the process's connections not logged in yet (with ``auth``); ``quotas``."""
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
        self._receiver = Receiver(stream, limits, self._budget, self._pool, self.id)
        self._orderer = ResponseOrderer(limits.max_inflight)
        self._login = None if auth is None else _Login(auth, self, admitted)
        self._reader: FrameReader | None = None  # (for a reload's limits)
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
                nursery.start_soon(
                    write_answers,
                    *(self._orderer, self.stream, lambda: self.limits, self._receiver, self._budget, self._throttle, self.id),
                    nursery.cancel_scope,
                )
                async with self._orderer:
                    await self._read()
            if self._receiver.expired:
                reason = self._receiver.expiry_reason
                metrics.CLIENT_CLOSES.labels(reason).inc()
        except* Closing as eg:
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
            self._budget.release_all()
            self._receiver.release()
            with trio.CancelScope(shield=True):
                if reason in ("max_age", "drain"):
                    await goodbye(self.stream)
                await trio.aclose_forcefully(self.stream)
            if self._login is not None and self._login.tokens is not None:
                await self._login.tokens.expire()  # shielded, bounded; the client is not kept waiting for it

    def _audit_connection(self, event: str, **fields: Any) -> None:
        if self._governed is not None:
            self._governed.connection_event(f"connection.{event}", **fields)

    def _principal(self) -> str:
        """Who the client is, as far as kfan knows (its login, its certificate), for its telemetry's labels."""
        session = None if self._login is None else self._login.session
        return (session.principal if session is not None else None) or self.principal or ""

    def drain(self, at: float | None = None) -> None:
        """Stop reading requests, now or at ``at`` (a drain spread over time); answer those read, then close."""
        self._receiver.drain() if at is None else self._receiver.close_gradually(at)

    def reconfigure(self, limits: Limits) -> None:
        """Limits reloaded: all but the bound on requests in flight and the login limits apply now."""
        self.limits = limits
        self._receiver.reconfigure(limits)
        self._budget.limit = limits.max_connection_bytes
        if self._reader is not None and not (self._login is not None and self._login.pending):
            self._reader.max_frame_bytes = limits.max_frame_bytes
        if self._forwarder is not None:
            reconfigure_forwarder(self._forwarder, limits)

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
                    raise Closing("login_frame_too_large") from e
                log.warning("client %s: malformed frame, closing: %s", self.id, e)
                raise Closing("malformed") from e
            except Malformed as e:
                log.warning("client %s: malformed frame, closing: %s", self.id, e)
                raise Closing("malformed") from e
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
                    raise Closing("eof")
                if first and looks_like_tls(reader.peek(16)):
                    log.warning("client %s (%s): a TLS handshake on a plaintext listener, closing", self.id, self.peer)
                    raise Closing("tls_on_plaintext")
                first = False
                self._receiver.sync_partial(reader)
                continue
            metrics.count(metrics.BYTES, ("client_in",), len(payload) + 4)
            if self._login is not None and (answer := await self._login.admit(payload, reader)) is not None:
                # kfan's own SASL answer, in its place in the response order.
                slot = ResponseSlot(0, answer.api_key)
                metrics.count(metrics.CLIENT_REQUESTS, (answer.api_key, "-"))
                await self._orderer.place(slot)
                slot.parts, slot.close_after = answer.parts, answer.close
                slot.done.set()
                continue
            try:
                await self._forwarder.take(payload)  # the request is the forwarder's from here to its answer
            except Unanswerable as e:
                raise Closing(e.reason) from e

    # --- writing ---------------------------------------------------------------------
