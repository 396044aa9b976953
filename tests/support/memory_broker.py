"""Fake brokers over in-memory streams, for trio-level tests of a client connection.

:class:`MemoryBrokers` is handed to :class:`proxy.server.connection.ClientConnection`
as its ``connect_broker``: every link the connection opens to a broker gets
one end of a ``trio.testing.memory_stream_pair()``, and a task of the fake
broker serves the other end. Nothing is answered on its own: each request the
fake broker reads (framed by :class:`FrameReader`, decoded with kfan's codec)
waits in a per-broker queue as a :class:`BrokerRequest`, and the test decides
what becomes of it: answer it now or later (in any order), never, or close
the connection it came on.

:class:`CountingStream` wraps the client connection's own stream to tell how
many bytes the connection has read from it (backpressure tests).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from proxy.core.topology import Broker
from proxy.kafka import schema
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import RequestHeader, decode_request, response_header


class BrokerConnection:
    """The broker's end of one link kfan opened."""

    def __init__(self, broker: int, number: int, stream: trio.abc.Stream) -> None:
        self.broker = broker
        self.number = number  # 1 for the first connection kfan opened to this broker, ...
        self.stream = stream
        self.closed = False
        self._sending = trio.Lock()

    async def send(self, payload: bytes) -> None:
        async with self._sending:
            await self.stream.send_all(frame([payload]))

    async def close(self) -> None:
        """Drop the connection, as a broker that crashes does."""
        self.closed = True
        await trio.aclose_forcefully(self.stream)


@dataclass
class BrokerRequest:
    """One request as a fake broker read it."""

    broker: int
    connection: BrokerConnection
    header: RequestHeader
    body: schema.Struct
    answered: bool = field(default=False)

    @property
    def api_key(self) -> int:
        return self.header.api_key

    async def answer(self, body: dict[str, Any]) -> None:
        """Answer with ``body`` (top-level fields not given take the schema's blanks), under the link's correlation id."""
        h = self.header
        spec = schema.response_spec(h.api_key, h.api_version)
        payload = response_header(h.api_key, h.api_version, h.correlation_id) + b"".join(schema.encode_body(spec, {**spec.blank(), **body}))
        self.answered = True
        await self.connection.send(payload)

    async def close_connection(self) -> None:
        await self.connection.close()


class MemoryBrokers:
    """Fake brokers: pass :meth:`connect` as ``connect_broker``; take requests with :meth:`next`."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery
        self.received: dict[int, list[BrokerRequest]] = {}  # every request read, per broker, in arrival order
        self.connections: dict[int, list[BrokerConnection]] = {}
        self._taken: dict[int, int] = {}
        self._arrived = trio.Event()
        self.refusing: set[int] = set()  # brokers whose connections are refused, as a broker that is down

    async def connect(self, broker: Broker) -> trio.abc.Stream:
        if broker.node_id in self.refusing:
            raise ConnectionRefusedError(f"broker {broker.node_id} is down")
        ours, theirs = trio.testing.memory_stream_pair()
        connections = self.connections.setdefault(broker.node_id, [])
        conn = BrokerConnection(broker.node_id, len(connections) + 1, theirs)
        connections.append(conn)
        self._nursery.start_soon(self._serve, conn)
        return ours

    def count(self, broker: int, api_key: int | None = None) -> int:
        """Requests read by ``broker`` so far (of ``api_key`` only, when given)."""
        return sum(1 for r in self.received.get(broker, []) if api_key is None or r.api_key == api_key)

    async def next(self, broker: int) -> BrokerRequest:
        """The next request ``broker`` reads that no earlier call returned (waits for it)."""
        while True:
            taken = self._taken.get(broker, 0)
            arrived = self.received.get(broker, [])
            if len(arrived) > taken:
                self._taken[broker] = taken + 1
                return arrived[taken]
            await self._arrived.wait()

    async def _serve(self, conn: BrokerConnection) -> None:
        reader = FrameReader()
        while True:
            payload = reader.next_frame()
            if payload is None:
                try:
                    data = await conn.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                reader.feed(data)
                continue
            header, body = decode_request(payload)
            self.received.setdefault(conn.broker, []).append(BrokerRequest(conn.broker, conn, header, body))
            arrived, self._arrived = self._arrived, trio.Event()
            arrived.set()


class CountingStream(trio.abc.Stream):
    """A stream that counts the bytes read from it."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.bytes_read = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self.bytes_read += len(data)
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()
