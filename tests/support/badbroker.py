"""A misbehaving broker for integration tests: a man-in-the-middle in front of one real broker.

:class:`BadBroker` listens on a port of its own and relays every connection
to one real (embedded) broker. Requests (client -> broker) go through
verbatim; the stand-in only notes each one's api key, version and client id
by correlation id. Responses (broker -> client) are read whole, frame by
frame, and, according to the current :class:`Rule`, either forwarded
verbatim or spoiled in one of these ways (:data:`MODES`):

``garbage``
    the payload after the correlation id becomes random bytes (same size,
    same size prefix: a well-framed answer that does not decode)
``wrong_cid``
    the correlation id names no request
``huge_prefix``
    a 2 GiB size prefix, then nothing more on that connection
``half_frame``
    the size prefix and half the payload, then nothing more on that connection
``stall``
    this answer is never sent (the connection carries on with later ones)
``close``
    the connection is closed, towards the client and the broker
``undecodable_metadata``
    Metadata answers only: the body is cut in half (size prefix adjusted)
``metadata_no_brokers``
    Metadata answers only: re-encoded with an empty ``brokers`` array
``unknown_tags``
    flexible answers only: an unknown tagged field is added to the body's
    top-level tagged fields, which is legal Kafka (a newer broker's field)
``late``
    the answer, verbatim, :data:`LATE_S` late (and the connection's answers after it)

A rule selects the answers it spoils by api key, by the client id of the
request (kfan's control plane calls itself ``kfan``), by a probability drawn
from a seeded RNG, and/or as "the next N". Every spoiled answer is counted by
mode and api key, so that a test can assert the fault was injected. Modes
that do not apply to an answer (``unknown_tags`` on a non-flexible version,
the Metadata modes on other APIs) leave it untouched and are not counted.

To put it in front of broker ``b`` of a :class:`proxy.tools.mock_cluster.MockCluster`,
start it on that broker's address and make the broker advertise the
stand-in's port (``cluster.set_broker_address(b, "127.0.0.1", bad.port)``):
whoever learns the cluster from Metadata then reaches ``b`` through it.

Runs in background threads of the test process (one accepting, two per
connection), has a bounded lifetime (``lifetime`` seconds, after which it
stops by itself), and :meth:`BadBroker.stop` closes every socket and joins
every thread.
"""

from __future__ import annotations

import random
import socket
import struct
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType

from proxy.kafka import schema
from proxy.kafka.headers import response_body_offset

__all__ = ["MODES", "BadBroker", "Request", "Rule"]

PASS = "pass"
GARBAGE = "garbage"
WRONG_CID = "wrong_cid"
HUGE_PREFIX = "huge_prefix"
HALF_FRAME = "half_frame"
STALL = "stall"
CLOSE = "close"
UNDECODABLE_METADATA = "undecodable_metadata"
METADATA_NO_BROKERS = "metadata_no_brokers"
UNKNOWN_TAGS = "unknown_tags"
LATE = "late"
MODES = (PASS, GARBAGE, WRONG_CID, HUGE_PREFIX, HALF_FRAME, STALL, CLOSE, UNDECODABLE_METADATA, METADATA_NO_BROKERS, UNKNOWN_TAGS, LATE)
LATE_S = 1.0

METADATA = 3
_METADATA_ONLY = frozenset({UNDECODABLE_METADATA, METADATA_NO_BROKERS})
# A tag no Kafka schema uses (yet): what a newer broker's extra field looks like to an older reader.
UNKNOWN_TAG = 1000
UNKNOWN_TAG_VALUE = b"badbroker: a field from the future"
_HUGE = struct.pack(">i", 0x7FFFFFFF)  # 2 GiB - 1
_SIZE = struct.Struct(">i")
_CID = struct.Struct(">i")

# What a spoiled answer leaves behind on its connection.
_GO, _SILENCE, _CLOSE, _LATE = "go", "silence", "close", "late"


@dataclass(frozen=True, slots=True)
class Request:
    """What the stand-in remembers of a request until its answer comes."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def parse_request_head(payload: bytes) -> Request | None:
    """api key, version, correlation id and (header v1+) client id of a request payload."""
    if len(payload) < 8:
        return None
    key, version, cid = struct.unpack_from(">hhi", payload)
    client_id = None
    if len(payload) >= 10:
        (n,) = struct.unpack_from(">h", payload, 8)
        if 0 <= n <= len(payload) - 10:
            client_id = payload[10 : 10 + n].decode("utf-8", "replace")
    return Request(key, version, cid, client_id)


@dataclass(slots=True)
class Rule:
    """Which answers to spoil, and how."""

    mode: str = PASS
    api_keys: frozenset[int] | None = None  # None: every API
    client_ids: frozenset[str] | None = None  # None: every client
    probability: float = 1.0
    remaining: int | None = None  # "the next N"; None: no limit

    def applies_to(self, req: Request) -> bool:
        if self.mode == PASS or self.remaining == 0:
            return False
        if self.mode in _METADATA_ONLY and req.api_key != METADATA:
            return False
        if self.api_keys is not None and req.api_key not in self.api_keys:
            return False
        return self.client_ids is None or req.client_id in self.client_ids


class _Connection:
    """One relayed connection: a thread per direction."""

    def __init__(self, owner: BadBroker, client: socket.socket, upstream: socket.socket) -> None:
        self.owner = owner
        self.client = client
        self.upstream = upstream
        self.requests: dict[int, Request] = {}
        self.silenced = False
        self._lock = threading.Lock()
        self._running = 2
        self._shut = False
        self.threads = [
            threading.Thread(target=self._guard(self._relay_requests), name="badbroker-requests", daemon=True),
            threading.Thread(target=self._guard(self._relay_responses), name="badbroker-responses", daemon=True),
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def shutdown(self) -> None:
        """End both directions (wakes the threads blocked on these sockets)."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _guard(self, body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except OSError:
                pass  # either side went away
            except Exception as e:  # a bug of the stand-in: recorded for the tests to see
                self.owner.errors.append(e)
            finally:
                self.shutdown()
                with self._lock:
                    self._running -= 1
                    last = self._running == 0
                if last:
                    # Closed only once neither thread can touch the sockets any more.
                    self.client.close()
                    self.upstream.close()
                    self.owner._forget(self)

        return run

    def _relay_requests(self) -> None:
        buf = bytearray()
        while True:
            data = self.client.recv(65536)
            if not data:
                return
            buf += data
            out = bytearray()
            while len(buf) >= 4:
                (size,) = _SIZE.unpack_from(buf)
                if size < 0:  # not Kafka framing: pass it on as it is
                    out += buf
                    buf.clear()
                    break
                if len(buf) < 4 + size:
                    break
                req = parse_request_head(bytes(buf[4 : 4 + size]))
                if req is not None:
                    # Noted before the request leaves: its answer cannot come earlier.
                    with self._lock:
                        self.requests[req.correlation_id] = req
                    self.owner._count_request(req)
                out += buf[: 4 + size]
                del buf[: 4 + size]
            if out:
                self.upstream.sendall(out)

    def _relay_responses(self) -> None:
        buf = bytearray()
        while True:
            data = self.upstream.recv(65536)
            if not data:
                return
            if self.silenced:
                continue  # keep draining the broker, send nothing
            buf += data
            while len(buf) >= 4:
                (size,) = _SIZE.unpack_from(buf)
                if size < 4 or len(buf) < 4 + size:
                    break
                payload = bytes(buf[4 : 4 + size])
                del buf[: 4 + size]
                with self._lock:
                    req = self.requests.pop(_CID.unpack_from(payload)[0], None)
                out, after = self.owner._respond(req, payload)
                if after == _LATE:
                    self.owner._stopped.wait(LATE_S)  # held, but not past the stand-in's own end
                if out:
                    self.client.sendall(out)
                if after == _CLOSE:
                    return
                if after == _SILENCE:
                    self.silenced = True
                    buf.clear()
                    break


def _frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


class BadBroker:
    """A TCP stand-in for one broker that spoils selected answers (see the module doc)."""

    def __init__(self, upstream: tuple[str, int], *, host: str = "127.0.0.1", seed: int = 0, lifetime: float = 600.0) -> None:
        self.upstream = upstream
        self.host = host
        self.lifetime = lifetime
        self.errors: list[BaseException] = []  # the stand-in's own failures (should stay empty)
        self._rule = Rule()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._injected: Counter[tuple[str, int]] = Counter()
        self._requests: Counter[tuple[int, str | None]] = Counter()
        self._passed: Counter[tuple[int, str | None]] = Counter()
        self._connections: set[_Connection] = set()
        self._stopped = threading.Event()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self.port = 0

    # --- lifetime ---------------------------------------------------------------

    def start(self) -> BadBroker:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(64)
        listener.settimeout(0.2)  # the accept loop checks for stop() this often
        self._listener = listener
        self.port = listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, name=f"badbroker-{self.port}", daemon=True)
        self._acceptor.start()
        self._timer = threading.Timer(self.lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()
        return self

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def stop(self) -> None:
        """Stop accepting, close every relayed connection, join the threads. Idempotent."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._timer is not None and self._timer is not threading.current_thread():
            self._timer.cancel()
        if self._acceptor is not None and self._acceptor is not threading.current_thread():
            self._acceptor.join(5)
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.shutdown()
        for conn in connections:
            for t in conn.threads:
                t.join(5)

    def __enter__(self) -> BadBroker:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<BadBroker :{self.port} -> {self.upstream[0]}:{self.upstream[1]} {self._rule.mode}>"

    # --- what tests control ------------------------------------------------------------

    def set_mode(
        self,
        mode: str,
        *,
        api_keys: Iterable[int] | None = None,
        client_ids: Iterable[str] | None = None,
        probability: float = 1.0,
        next_n: int | None = None,
        seed: int | None = None,
    ) -> None:
        """From now on, spoil answers this way (``pass``: forward everything verbatim).

        ``api_keys``/``client_ids``: only answers to these requests; ``probability``:
        each selected answer with this chance (seeded RNG; ``seed`` reseeds it);
        ``next_n``: only the next N selected answers, then pass again.
        """
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {MODES}")
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability {probability} outside [0, 1]")
        rule = Rule(
            mode,
            None if api_keys is None else frozenset(api_keys),
            None if client_ids is None else frozenset(client_ids),
            probability,
            next_n,
        )
        with self._lock:
            self._rule = rule
            if seed is not None:
                self._rng.seed(seed)

    def passthrough(self) -> None:
        self.set_mode(PASS)

    @property
    def mode(self) -> str:
        with self._lock:
            return PASS if self._rule.remaining == 0 else self._rule.mode

    def injected(self, mode: str | None = None, api_key: int | None = None) -> int:
        """Answers spoiled, by mode and/or api key."""
        with self._lock:
            return sum(n for (m, k), n in self._injected.items() if mode in (None, m) and api_key in (None, k))

    def requests(self, api_key: int | None = None, client_id: str | None = None) -> int:
        """Requests relayed to the broker, by api key and/or client id."""
        with self._lock:
            return sum(n for (k, c), n in self._requests.items() if api_key in (None, k) and client_id in (None, c))

    def passed(self, api_key: int | None = None, client_id: str | None = None) -> int:
        """Answers forwarded verbatim, by api key and/or client id of their request."""
        with self._lock:
            return sum(n for (k, c), n in self._passed.items() if api_key in (None, k) and client_id in (None, c))

    def reset_counts(self) -> None:
        with self._lock:
            self._injected.clear()
            self._requests.clear()
            self._passed.clear()

    def connection_count(self) -> int:
        with self._lock:
            return len(self._connections)

    def drop_connections(self) -> None:
        """Close every relayed connection now (new ones are still accepted)."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.shutdown()

    # --- relaying -----------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # the broker is down: so is its stand-in
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Connection(self, client, upstream)
            with self._lock:
                if self._stopped.is_set():
                    client.close()
                    upstream.close()
                    return
                self._connections.add(conn)
            conn.start()

    def _forget(self, conn: _Connection) -> None:
        with self._lock:
            self._connections.discard(conn)

    def _count_request(self, req: Request) -> None:
        with self._lock:
            self._requests[(req.api_key, req.client_id)] += 1

    def _select(self, req: Request, size: int) -> tuple[Rule | None, bytes]:
        """The rule that spoils this answer of ``size`` bytes (its slot reserved), or None.

        Garbage is drawn here, under the lock, so that a seed gives the same bytes whatever the threads do.
        """
        with self._lock:
            rule = self._rule
            if not rule.applies_to(req):
                return None, b""
            if rule.probability < 1.0 and self._rng.random() >= rule.probability:
                return None, b""
            if rule.remaining is not None:
                rule.remaining -= 1
            return rule, self._rng.randbytes(max(0, size - 4)) if rule.mode == GARBAGE else b""

    def _respond(self, req: Request | None, payload: bytes) -> tuple[bytes, str]:
        """What to send the client for one broker answer, and what happens to the connection after."""
        rule, noise = (None, b"") if req is None else self._select(req, len(payload))
        spoiled = None if rule is None or req is None else _spoil(rule.mode, req, payload, noise)
        with self._lock:
            if spoiled is None:
                if rule is not None and rule.remaining is not None:
                    rule.remaining += 1  # the mode did not apply: give the slot back
                if req is not None:
                    self._passed[(req.api_key, req.client_id)] += 1
                return _frame(payload), _GO
            assert rule is not None and req is not None
            self._injected[(rule.mode, req.api_key)] += 1
        return spoiled


def _spoil(mode: str, req: Request, payload: bytes, noise: bytes) -> tuple[bytes, str] | None:
    """One answer spoiled by ``mode``, or None when the mode does not apply to it."""
    if mode == GARBAGE:
        if len(payload) <= 4:
            return None
        return _frame(payload[:4] + noise), _GO
    if mode == WRONG_CID:
        (cid,) = _CID.unpack_from(payload)
        return _frame(_CID.pack((cid + 0x10000000) & 0x7FFFFFFF) + payload[4:]), _GO
    if mode == HUGE_PREFIX:
        return _HUGE, _SILENCE
    if mode == HALF_FRAME:
        return _SIZE.pack(len(payload)) + payload[: max(1, len(payload) // 2)], _SILENCE
    if mode == STALL:
        return b"", _GO
    if mode == CLOSE:
        return b"", _CLOSE
    if mode == LATE:
        return _frame(payload), _LATE
    if mode == UNDECODABLE_METADATA:
        return _undecodable(req, payload)
    if mode == METADATA_NO_BROKERS:
        return _reencoded(req, payload, lambda body: body.update(brokers=[]))
    if mode == UNKNOWN_TAGS:
        if not schema.is_flexible(req.api_key, req.api_version):
            return None

        def add_tag(body: schema.Struct) -> None:
            body[schema.TAGS] = {**body.get(schema.TAGS, {}), UNKNOWN_TAG: UNKNOWN_TAG_VALUE}

        return _reencoded(req, payload, add_tag)
    raise ValueError(mode)


def _undecodable(req: Request, payload: bytes) -> tuple[bytes, str] | None:
    try:
        offset = response_body_offset(payload, req.api_key, req.api_version)
    except ValueError:
        return None
    spec = schema.response_spec(req.api_key, req.api_version)
    cut = payload[: offset + (len(payload) - offset) // 2]
    try:
        schema.decode_body(spec, cut, offset, allow_trailing=True)
    except ValueError:
        return _frame(cut), _GO
    return _frame(payload[:offset]), _GO  # half still decoded (cannot happen for Metadata): no body at all


def _reencoded(req: Request, payload: bytes, change: Callable[[schema.Struct], None]) -> tuple[bytes, str] | None:
    """The answer decoded with kfan's codec, changed, and encoded again behind its own header."""
    try:
        offset = response_body_offset(payload, req.api_key, req.api_version)
        spec = schema.response_spec(req.api_key, req.api_version)
        body = schema.decode_body(spec, payload, offset, allow_trailing=True)
    except Exception:
        return None  # an answer kfan's codec cannot read (a mock quirk): left alone
    change(body)
    return _frame(payload[:offset] + b"".join(bytes(p) for p in schema.encode_body(spec, body))), _GO
