"""A link: one pipelined TCP connection to one broker.

Requests are submitted synchronously (:meth:`Link.submit`) and written in
submission order by the link's sender task: per client connection, requests
for one broker reach it in the client's order, which idempotent producers
depend on. Each link numbers its requests with its own correlation ids and
matches responses by them (:class:`~backends.correlations.Correlations`). A
link that fails fails every request waiting on it and stays failed; its owner
opens a new one on next use.

The link speaks over any :class:`trio.abc.Stream` its ``connect`` function
returns: a TCP (or TLS) connection to the broker by default, an in-memory
stream in tests. With an ``authenticate`` step (SASL, :mod:`backends.sasl`)
the link logs in before it sends anything else, and logs in again before the
session the broker granted ends (KIP-368): the writer pauses, requests
already sent are answered as usual, and nothing in flight fails.
"""

from __future__ import annotations

import logging
import math
import struct
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

import trio

from proxy import metrics
from proxy.core import SubRequest
from proxy.frame_io import receive_into, send_frame
from proxy.kafka import schema
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import correlation_id_of, request_head, request_header_tail
from proxy.kafka.wire import Malformed, Parts

from .correlations import Correlations, UnknownCorrelationId

log = logging.getLogger("kfan.link")
_CID = struct.Struct(">i")

CLIENT_ID = "kfan"  # the client id of kfan's own requests

Connect = Callable[[], Awaitable[trio.abc.Stream]]
"""Opens the link's byte stream to its broker."""

Call = Callable[[int, int, Mapping[str, Any]], Awaitable[bytes]]
"""One request of kfan's own on a link (api key, version, body) and its answer's payload."""

Authenticate = Callable[[Call], Awaitable[float | None]]


def own_request(api_key: int, version: int, body: Mapping[str, Any]) -> SubRequest:
    """A request of kfan's own (control plane, SASL login): its client id, the body over the schema's blanks."""
    spec = schema.request_spec(api_key, version)
    return SubRequest(
        api_key, version, [request_header_tail(api_key, version, CLIENT_ID), *schema.encode_body(spec, {**spec.blank(), **body})], True
    )


"""Logs a link in over ``Call``; the session lifetime granted, in seconds (None: unlimited)."""

# Log in again this far into a session: early enough for a slow broker, as Kafka's clients do.
REAUTHENTICATE_AT = 0.85


class LinkError(Exception):
    """The broker connection failed; what was in flight on it has no answer."""


class Pending:
    """A request's answer to come: the response payload, or a :class:`LinkError`."""

    __slots__ = ("_done", "_value", "sent", "written", "done_at", "created_at", "request", "broker")

    def __init__(self) -> None:
        self._done = trio.Event()
        self.sent = trio.Event()
        self._value: bytes | LinkError | None = None
        self.done_at: float | None = None  # trio clock time the answer came
        self.created_at = trio.current_time()
        self.request: bytes | None = None  # the frame sent, kept only for traffic capture
        self.broker = -1
        # Whether the request may have reached the broker: its bytes started
        # out on the socket. One that failed before that cannot have been acted on.
        self.written = False

    def set(self, value: bytes | LinkError) -> None:
        if not self._done.is_set():
            self._value = value
            self.done_at = trio.current_time()
            self._done.set()
            self.sent.set()

    async def wait(self) -> bytes:
        await self._done.wait()
        if isinstance(self._value, LinkError):
            raise self._value
        assert self._value is not None
        return self._value


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
    ) -> None:
        """``connect`` opens the stream (within ``connect_timeout``, as is each login); by default a TCP connection to ``host``:``port``."""
        self.broker_id = broker_id
        self.keep_requests = keep_requests
        self.address = (host, port)
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self.failed: LinkError | None = None
        self._writing: Pending | None = None  # the request whose bytes are going out
        self._connect: Connect = connect if connect is not None else partial(trio.open_tcp_stream, host, port)
        self._send, self._queue = trio.open_memory_channel[tuple[Parts, Pending]](math.inf)
        self._correlations: Correlations[Pending] = Correlations()
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
        self._send.send_nowait((parts, pending))
        return pending

    def close(self) -> None:
        self._cancel.cancel()

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
        with self._cancel:
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await self._connect()
                connected = metrics.BROKER_CONNECTIONS.labels(str(self.broker_id))
                connected.inc()
                try:
                    async with stream, trio.open_nursery() as nursery:
                        nursery.start_soon(self._receive, stream)
                        await self._write(stream)
                finally:
                    connected.dec()
            except Exception as e:  # any failure of a link is that link's end
                leaf = _leaf(e)
                expected = isinstance(leaf, (OSError, trio.TooSlowError, trio.BrokenResourceError, Malformed, LinkError))
                log.info("link to broker %s %s:%s failed: %r", self.broker_id, *self.address, leaf, exc_info=not expected)
                reason = leaf if isinstance(leaf, LinkError) else LinkError(f"broker {self.broker_id}: {leaf!r}")
                self._fail(reason)
                return
        self._fail(LinkError(f"link to broker {self.broker_id} closed"))

    def _fail(self, reason: LinkError) -> None:
        self.failed = reason
        self.ready.set()
        self._send.close()
        for pending in self._correlations.take_all():
            pending.set(reason)
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
        sent = metrics.BYTES.labels("broker_out")
        if self._authenticate is not None:
            await self._login(stream)
        self.ready.set()
        while True:
            item = None
            with trio.CancelScope(deadline=self._reauthenticate_at) as self._idle:
                try:
                    item = await self._queue.receive()
                except trio.EndOfChannel:
                    return
            self._idle = None
            if trio.current_time() >= self._reauthenticate_at:
                # The session is about to end (or new credentials came): log in
                # again before the next request; those sent before are answered first.
                await self._login(stream)
            if item is None:
                continue
            parts, pending = item
            pending.written = True
            self._writing = pending
            written = await send_frame(stream, parts)
            self._writing = None
            sent.inc(written)
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
        return await pending.wait()

    async def _receive(self, stream: trio.abc.Stream) -> None:
        reader = FrameReader(self.max_frame_bytes, MIN_RESPONSE_FRAME)
        received = metrics.BYTES.labels("broker_in")
        while True:
            payload = reader.next_frame()
            if payload is None:
                # A Fetch answer of several MiB (a partition's 1 MiB each) is received in place whole.
                n = await receive_into(stream, reader, self.max_frame_bytes)
                if not n:
                    raise LinkError(f"broker {self.broker_id} closed the connection")
                received.inc(n)
                continue
            cid = correlation_id_of(payload)
            try:
                pending = self._correlations.answer(cid)
            except UnknownCorrelationId:
                raise LinkError(f"broker {self.broker_id} answered unknown correlation id {cid}") from None
            if pending is not None:  # else an answer nobody waits for (acks=0)
                pending.set(payload)


def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    if isinstance(e, trio.BrokenResourceError) and isinstance(e.__cause__, OSError):
        return e.__cause__  # what broke it: a refused certificate is an SSLError, worth its own words
    return e
