"""A link: one pipelined TCP connection to one broker.

Requests are submitted synchronously (:meth:`Link.submit`) and written in
submission order: by the link's writer task, or, while the writer waits with
nothing queued, a small request on a plain socket by its submitter at once
(the writer's wake-up was a task step of every request). Per client
connection, requests for one broker reach it in the client's order, which
idempotent producers depend on. Each link numbers its requests with its own correlation ids and
matches responses by them (:class:`~backends.correlations.Correlations`). A
link that fails fails every request waiting on it and stays failed; its owner
opens a new one on next use.

The link speaks over any :class:`trio.abc.Stream` its ``connect`` function
returns: a TCP (or TLS) connection to the broker by default, an in-memory
stream in tests. With an ``authenticate`` step (SASL, :mod:`backends.sasl`)
the link logs in before it sends anything else, and logs in again before the
session the broker granted ends (KIP-368): the writer pauses, requests
already sent are answered as usual, and nothing in flight fails.

A client connection's links count every answer against its
:class:`~proxy.runtime.budget.Budget` from arrival (:meth:`Pending.hold`, by the
link's reading side, :class:`Receiver`) until its
user consumes or drops it: an answer nobody waits for any more is dropped at
once (:meth:`Pending.abandon`), and so is one for a sub-fetch nobody waits
for yet when the budget has no room for it.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import trio

from proxy.core import SubRequest
from proxy.kafka import schema
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import correlation_id_of, request_head, request_header_tail
from proxy.kafka.wire import Malformed, Parts
from proxy.runtime import metrics
from proxy.runtime.budget import Budget
from proxy.runtime.frame_io import YIELD_EVERY, receive_into, send_frame, send_small_now

from . import backoff
from .correlations import Correlations, UnknownCorrelationId
from .pending import DROPPED, LinkClosed, LinkError, Pending

__all__ = ["CLIENT_ID", "DROPPED", "Link", "LinkClosed", "LinkError", "Pending", "own_request"]

log = logging.getLogger("kfan.link")
_CID = struct.Struct(">i")

CLIENT_ID = "kfan"  # the client id of kfan's own requests

Connect = Callable[[], Awaitable[trio.abc.Stream]]
"""Opens the link's byte stream to its broker."""

Call = Callable[[int, int, Mapping[str, Any]], Awaitable[bytes]]
"""One request of kfan's own on a link (api key, version, body) and its answer's payload."""

Authenticate = Callable[[Call], Awaitable[float | None]]
"""Logs a link in over ``Call``; the session lifetime granted, in seconds (None: unlimited)."""


def own_request(api_key: int, version: int, body: Mapping[str, Any]) -> SubRequest:
    """A request of kfan's own (control plane, SASL login): its client id, the body over the schema's blanks."""
    spec = schema.request_spec(api_key, version)
    return SubRequest(
        api_key, version, [request_header_tail(api_key, version, CLIENT_ID), *schema.encode_body(spec, {**spec.blank(), **body})], True
    )


# Log in again this far into a session: early enough for a slow broker, as Kafka's clients do.
REAUTHENTICATE_AT = 0.85


class Link:
    def __init__(
        self,
        broker_id: int,
        host: str,
        port: int,
        *,
        connect_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        keep_requests: bool = False,
        connect: Connect | None = None,
        authenticate: Authenticate | None = None,
        budget: Budget | None = None,
    ) -> None:
        """``connect`` opens the stream (within ``connect_timeout``, as is each login); by default a TCP connection to ``host``:``port``.

        ``budget``: the client connection's, which every answer is counted against while held.
        """
        self.budget = budget
        self.broker_id = broker_id
        self.keep_requests = keep_requests
        self.address = (host, port)
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self.failed: LinkError | None = None
        self._writing: Pending | None = None  # the request whose bytes are going out
        # The plain socket a submitter writes a small request to itself while the writer waits with nothing queued
        # (None: requests go through the writer): the writer's wake-up is a task step of every request.
        self._direct: trio.SocketStream | None = None
        self._connect: Connect = connect if connect is not None else partial(trio.open_tcp_stream, host, port)
        # A request's parts, or what is left of one a submitter wrote in part (its bytes, to go first).
        self._send, self._queue = trio.open_memory_channel[tuple[Parts | bytes | memoryview, Pending]](math.inf)
        self._queued = 0  # in the queue: counted here, as the channel's statistics() cost 2 us a request
        self._correlations: Correlations[Pending] = Correlations()
        self._receiver = Receiver(broker_id, self._correlations, max_frame_bytes, budget)
        self._cancel = trio.CancelScope()
        self._authenticate = authenticate
        self._reauthenticate_at = math.inf
        self._relogin_asked = False
        self._idle: trio.CancelScope | None = None  # the writer waiting for a request
        self.ready = trio.Event()  # connected and logged in, or failed

    def __repr__(self) -> str:
        return f"Link(broker {self.broker_id} at {self.address[0]}:{self.address[1]})"

    def submit(self, sub: SubRequest) -> Pending:
        """Queue a request; its bytes go out after everything submitted before it."""
        pending = Pending()
        pending.broker = self.broker_id
        if self.failed is not None:
            pending.set(self.failed)
            return pending
        cid = self._correlations.add(pending if sub.expect_response else None)
        parts = [request_head(sub.api_key, sub.api_version), _CID.pack(cid), *sub.tail]
        if self.keep_requests:
            pending.request = frame(parts)
        direct, self._direct = self._direct, None
        rest = _write_at_once(direct, parts, pending) if direct is not None and trio.current_time() < self._reauthenticate_at else None
        if rest is None:
            self._send.send_nowait((parts, pending))
            self._queued += 1
        elif rest:
            self._send.send_nowait((rest, pending))  # the writer sends the rest before anything else
            self._queued += 1
        else:
            self._direct = direct  # all of it went: the writer still waits with nothing queued
        return pending

    def close(self) -> None:
        self._cancel.cancel()

    async def answered(self) -> None:
        """Until every request submitted so far that expects an answer has it, or the link failed (a broker
        answers in order: the last one's answer is enough)."""
        last = self._correlations.last_waiter()
        if last is not None:
            await last.answered()

    def reauthenticate(self) -> None:
        """Log in again before the next request (new credentials); what is in flight is unaffected."""
        if self._authenticate is None:
            return
        self._reauthenticate_at = -math.inf
        self._relogin_asked = True  # a login under way when this came uses the old credentials: do another
        if self._idle is not None:
            self._idle.deadline = -math.inf

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then write queued requests and read responses until failure."""
        task_status.started()
        try:
            await self._run()
        finally:
            if self.failed is None:
                # Cancelled from outside (its client connection ended): answers another
                # connection shares (backends.flights) must not wait out their deadline.
                self._fail(LinkClosed(f"link to broker {self.broker_id} closed with its client connection"))

    async def _run(self) -> None:
        with self._cancel:
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await self._connect()
                connected = metrics.BROKER_CONNECTIONS.labels(str(self.broker_id))
                connected.inc()
                try:
                    async with stream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._receiver.run, stream)
                        await self._write(stream)
                finally:
                    connected.dec()
            except Exception as e:  # any failure of a link is that link's end
                self._fail(_failure(self.broker_id, self.address, e))
                return
        self._fail(LinkError(f"link to broker {self.broker_id} closed"))

    def _fail(self, reason: LinkError) -> None:
        self.failed = reason
        self.ready.set()
        self._send.close()
        for pending in self._correlations.take_all():
            pending.set(reason)
        self._receiver.cut_short(reason)
        if self._writing is not None:
            # Its bytes were partly out (an acks=0 request has no waiter to fail).
            self._writing.set(reason)
        while True:
            try:
                _, pending = self._queue.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            pending.set(reason)

    async def _write(self, stream: trio.abc.Stream) -> None:
        if self._authenticate is not None:
            await self._login(stream)
        self.ready.set()
        plain = stream if isinstance(stream, trio.SocketStream) else None
        while True:
            item = None
            # A submitter may write itself only while nothing waits here to go before its request.
            self._direct = plain if self._queued == 0 else None
            try:
                if self._authenticate is None:
                    item = await self._queue.receive()  # nothing to log in again for: no deadline scope (1% a request)
                else:
                    with trio.CancelScope(deadline=self._reauthenticate_at) as self._idle:
                        item = await self._queue.receive()
                    self._idle = None
            except trio.EndOfChannel:
                return
            finally:
                self._direct = None  # (and when the link is closing: nothing more is written to its stream)
            if item is not None:
                self._queued -= 1
            if trio.current_time() >= self._reauthenticate_at:
                # The session is about to end (or new credentials came): log in
                # again before the next request; those sent before are answered first.
                await self._login(stream)
            if item is None:
                continue
            parts, pending = item
            pending.written = True
            self._writing = pending
            if isinstance(parts, list):
                metrics.count(metrics.BYTES, ("broker_out",), await send_frame(stream, parts))
            else:
                await stream.send_all(parts)  # a submitter wrote the rest of its frame (counted then)
            self._writing = None
            pending.sent.set()

    async def _login(self, stream: trio.abc.Stream) -> None:
        assert self._authenticate is not None
        self._relogin_asked = False
        with trio.fail_after(self.connect_timeout):
            lifetime = await self._authenticate(partial(self._call, stream))
        if self._relogin_asked:
            return  # new credentials came while logging in: log in again before the next request
        self._reauthenticate_at = math.inf if lifetime is None else trio.current_time() + lifetime * REAUTHENTICATE_AT

    async def _call(self, stream: trio.abc.Stream, api_key: int, version: int, body: Mapping[str, Any]) -> bytes:
        """A request of kfan's own, written now (only the writer calls this), and its answer."""
        pending = Pending()
        pending.broker = self.broker_id
        cid = self._correlations.add(pending)
        await send_frame(stream, [request_head(api_key, version), _CID.pack(cid), *own_request(api_key, version, body).tail])
        try:
            return await pending.wait()
        finally:
            pending.release()  # a login answer, read at once


def _failure(broker_id: int, address: tuple[str, int], e: Exception) -> LinkError:
    """What ended a link, logged (with a traceback when it is not a broker's or a network's failure)."""
    leaf = _leaf(e)
    expected = isinstance(leaf, (OSError, trio.TooSlowError, trio.BrokenResourceError, Malformed, LinkError))
    # One line per broker per interval: an outage fails every link to it, over and over.
    left_out = backoff.failure_log().note(address)
    if left_out is not None:
        log.info("link to broker %s %s:%s failed: %r%s", broker_id, *address, leaf, backoff.left_out(left_out), exc_info=not expected)
    return leaf if isinstance(leaf, LinkError) else LinkError(f"broker {broker_id}: {leaf!r}")


def _write_at_once(stream: trio.SocketStream, parts: Parts, pending: Pending) -> bytes | memoryview | None:
    """A request written by its submitter as far as the socket takes it now: what is left for the writer (empty:
    all of it went); None: nothing written (too large a frame, or a broken socket the writer fails the link on)."""
    written = send_small_now(stream, parts)
    if written is None:
        return None
    total, rest = written
    pending.written = True
    metrics.count(metrics.BYTES, ("broker_out",), total)
    if not rest:
        pending.sent.set()
    return rest


class Receiver:
    """A link's reading side: each answer is matched to its request by correlation id and,
    with a ``budget`` (the client connection's), counted against it from its first bytes,
    or dropped unread when nobody waits for it."""

    def __init__(self, broker_id: int, correlations: Correlations[Pending], max_frame_bytes: int, budget: Budget | None) -> None:
        self.broker_id = broker_id
        self.budget = budget
        self.max_frame_bytes = max_frame_bytes
        self._correlations = correlations
        self.arriving: Pending | None = None  # whose answer is being received (already counted)

    def cut_short(self, reason: LinkError) -> None:
        """The link failed: the answer being received never comes whole."""
        if self.arriving is not None:
            self.arriving.set(reason)

    async def run(self, stream: trio.abc.Stream) -> None:
        """Read answers until the broker closes the stream (a :class:`LinkError`) or it fails."""
        reader = FrameReader(self.max_frame_bytes, MIN_RESPONSE_FRAME)
        handed = 0  # answers handed over since the last read
        while True:
            payload = reader.next_frame()
            if payload is None:
                handed = 0
                if self.budget is not None and self.arriving is None and (head := reader.frame_head(4)) is not None:
                    # Whose answer this is, as soon as its correlation id is in: counted
                    # whole from now, or dropped unread (never buffered) when unwanted.
                    size, first = head
                    pending = self._answer_for(correlation_id_of(first))
                    if pending is not None and self._admit(pending, size):
                        self.arriving = pending
                    else:
                        reader.skip()
                # A Fetch answer of several MiB (a partition's 1 MiB each) is received in place whole.
                n = await receive_into(stream, reader, self.max_frame_bytes)
                if not n:
                    raise LinkError(f"broker {self.broker_id} closed the connection")
                metrics.count(metrics.BYTES, ("broker_in",), n)
                continue
            pending, self.arriving = self.arriving, None
            if pending is None:
                pending = self._answer_for(correlation_id_of(payload))
                if pending is None or (self.budget is not None and not self._admit(pending, len(payload))):
                    continue  # an answer nobody waits for (acks=0), or dropped
            pending.set(payload)  # (a request awaited here is merged and answered now: proxy.server.deadlines)
            handed += 1
            if handed % YIELD_EVERY == 0:
                # Many answers in one read are as many merges: let the other tasks run between them.
                await trio.lowlevel.checkpoint()

    def _answer_for(self, cid: int) -> Pending | None:
        try:
            return self._correlations.answer(cid)
        except UnknownCorrelationId:
            raise LinkError(f"broker {self.broker_id} answered unknown correlation id {cid}") from None

    def _admit(self, pending: Pending, size: int) -> bool:
        """Whether an answer of ``size`` bytes is kept (counted against the budget from now) or dropped."""
        budget = self.budget
        assert budget is not None
        if budget.closed:
            return True  # the connection is ending: nothing is counted any more
        if pending.dropped or (pending.waiters == 0 and not budget.has_room(size)):
            # Nobody waits for it: abandoned already, or a sub-fetch kept for a
            # Fetch that may come while the connection or the process is full.
            # Dropped, not held: that Fetch asks again.
            pending.abandon()
            pending.set(DROPPED)
            return False
        pending.hold(budget, size)
        return True


def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, trio.BrokenResourceError) and isinstance(e.__cause__, OSError):
        return e.__cause__  # what broke it: a refused certificate is an SSLError, worth its own words
    return e
