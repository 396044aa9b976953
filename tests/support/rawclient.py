"""A raw Kafka client for tests: kio entities over a plain blocking socket.

Requests are encoded and responses decoded by kio (independent of kfan's own
codec), or for the versions Kafka 4 removed by kafka-python's structs, so
what the tests see is what a client would see on the wire.
"""

from __future__ import annotations

import socket
import struct
import time
from typing import Any

from kio.index import load_response_from_request

from proxy.kafka.headers import encode_request_header, response_body_offset
from tests.support import old_protocol
from tests.support.kio_oracle import kio_decode, request_payload

# How long a connection kfan closes on purpose may take to be closed: generous for a loaded machine,
# yet shorter than kfan's own timeouts that would close it anyway (--frame-timeout 30 s, --idle-timeout 600 s).
CLOSED_WITHIN_S = 20.0


class RawClient:
    def __init__(self, address: tuple[str, int], timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._cid = 100
        self._buf = b""

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, entity: Any, correlation_id: int | None = None) -> int:
        if correlation_id is None:
            self._cid += 1
            correlation_id = self._cid
        payload = request_payload(entity, correlation_id, "rawclient")
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        return correlation_id

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self, timeout: float = 30.0) -> bytes | None:
        """The next response payload, or None when the peer closed the connection.

        ``timeout`` bounds a wait for an answer that should come (generous: a loaded machine is slow);
        a test that expects none passes its own, short, window."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buf) >= 4:
                (size,) = struct.unpack_from(">i", self._buf)
                if len(self._buf) >= 4 + size:
                    payload, self._buf = self._buf[4 : 4 + size], self._buf[4 + size :]
                    return payload
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no response")
            self.sock.settimeout(remaining)
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self._buf += chunk

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        try:
            return self.receive(timeout) is None
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def decode(self, entity: Any, payload: bytes) -> Any:
        cls = load_response_from_request(type(entity))
        offset = response_body_offset(payload, cls.__api_key__, cls.__version__)
        return kio_decode(cls, payload, offset)

    def call_old(self, api_key: int, version: int, request: tuple[Any, ...]) -> tuple[Any, ...]:
        """A request of a version kio lacks (Kafka 4 removed it), encoded and read back by kafka-python's structs."""
        return old_protocol.decode(api_key, version, "response", self.call_old_raw(api_key, version, request))

    def call_old_raw(self, api_key: int, version: int, request: tuple[Any, ...]) -> bytes:
        """:meth:`call_old`, answered with the response body's bytes as they came."""
        self._cid += 1
        payload = encode_request_header(api_key, version, self._cid, "rawclient") + old_protocol.encode(
            api_key, version, "request", request
        )
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        answer = self.receive()
        assert answer is not None, "connection closed"
        assert struct.unpack_from(">i", answer)[0] == self._cid
        return answer[4:]

    def call(self, entity: Any) -> Any:
        cid = self.send(entity)
        payload = self.receive()
        assert payload is not None, "connection closed"
        assert struct.unpack_from(">i", payload)[0] == cid
        return self.decode(entity, payload)
