"""A link: one pipelined TCP connection to one broker.

Requests are submitted synchronously (:meth:`Link.submit`) and written in
submission order by the link's sender task: per client connection, requests
for one broker reach it in the client's order, which idempotent producers
depend on. Each link numbers its requests with its own correlation ids and
matches responses by them. A link that fails fails every request waiting on
it and stays failed; its owner opens a new one on next use.
"""

from __future__ import annotations

import logging
import math
import struct

import trio

from proxy import metrics
from proxy.core import SubRequest, request_head
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import correlation_id_of
from proxy.kafka.wire import Malformed

log = logging.getLogger("kfan.link")
_CID = struct.Struct(">i")


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
    ) -> None:
        self.broker_id = broker_id
        self.keep_requests = keep_requests
        self.address = (host, port)
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self.failed: LinkError | None = None
        self._send, self._queue = trio.open_memory_channel[tuple[bytes, Pending]](math.inf)
        self._waiting: dict[int, Pending] = {}
        # Correlation ids of requests sent expecting no answer (acks=0 Produce).
        # Real brokers never answer them; some (librdkafka's mock) do. An answer
        # to a later request proves the earlier ones will never be answered.
        self._unanswered: dict[int, int] = {}  # correlation id -> submission sequence
        self._seq = 0
        self._seq_of: dict[int, int] = {}
        self._next_cid = 0
        self._cancel = trio.CancelScope()

    def __repr__(self) -> str:
        return f"Link(broker {self.broker_id} at {self.address[0]}:{self.address[1]})"

    def submit(self, sub: SubRequest) -> Pending:
        """Queue a request; its bytes go out after everything submitted before it."""
        pending = Pending()
        pending.broker = self.broker_id
        if self.failed is not None:
            pending.set(self.failed)
            return pending
        cid = self._next_cid
        self._next_cid = (cid + 1) & 0x7FFFFFFF
        data = frame([request_head(sub), _CID.pack(cid), *sub.tail])
        if self.keep_requests:
            pending.request = data
        self._seq += 1
        if sub.expect_response:
            self._waiting[cid] = pending
            self._seq_of[cid] = self._seq
        else:
            self._unanswered[cid] = self._seq
        self._send.send_nowait((data, pending))
        return pending

    def close(self) -> None:
        self._cancel.cancel()

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, then write queued requests and read responses until failure."""
        task_status.started()
        with self._cancel:
            try:
                with trio.fail_after(self.connect_timeout):
                    stream = await trio.open_tcp_stream(*self.address)
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
        self._send.close()
        for pending in self._waiting.values():
            pending.set(reason)
        self._waiting.clear()
        while True:
            try:
                _, pending = self._queue.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            pending.set(reason)

    async def _write(self, stream: trio.SocketStream) -> None:
        sent = metrics.BYTES.labels("broker_out")
        async for data, pending in self._queue:
            pending.written = True
            await stream.send_all(data)
            sent.inc(len(data))
            pending.sent.set()

    async def _receive(self, stream: trio.SocketStream) -> None:
        reader = FrameReader(self.max_frame_bytes, MIN_RESPONSE_FRAME)
        received = metrics.BYTES.labels("broker_in")
        while True:
            payload = reader.next_frame()
            if payload is None:
                data = await stream.receive_some(65536)
                if not data:
                    raise LinkError(f"broker {self.broker_id} closed the connection")
                received.inc(len(data))
                reader.feed(data)
                continue
            cid = correlation_id_of(payload)
            pending = self._waiting.pop(cid, None)
            if pending is None:
                if self._unanswered.pop(cid, None) is not None:
                    continue  # an answer nobody waits for (acks=0)
                raise LinkError(f"broker {self.broker_id} answered unknown correlation id {cid}")
            seq = self._seq_of.pop(cid)
            if self._unanswered:
                self._unanswered = {c: s for c, s in self._unanswered.items() if s > seq}
            pending.set(payload)


def _leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e
