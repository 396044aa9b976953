"""A SASL-verifying front for a broker that has no SASL of its own (the librdkafka mock), for tests.

    python -m tests.support.sasl_front --listen HOST:PORT --upstream HOST:PORT --users FILE \
        --mechanisms PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER [--jwks FILE] \
        [--session-lifetime-ms N] [--proxy-protocol] --log FILE

It is the broker's side that kfan's SASL client code is tested against, so it
is written independently of kfan's security code (nothing from
``proxy.security``): only Kafka framing and the kio-based message codec are
shared. SCRAM is scramp's server, OAUTHBEARER tokens are checked by PyJWT.

Per connection it behaves like a Kafka broker with a SASL listener:

* Before authentication only ApiVersions (relayed to the broker; the answer
  gains SaslHandshake 0-1 and SaslAuthenticate 0-2, which the mock does not
  list), SaslHandshake v1 and SaslAuthenticate v0-2 are accepted. Anything
  else closes the connection ("refused"). SaslHandshake v0 (raw tokens) is
  answered UNSUPPORTED_VERSION and the connection closed.
* A bad token or wrong credentials: SaslAuthenticate error 58 with a message,
  then close ("failed").
* Once authenticated, frames are relayed both ways unchanged, except that a
  new SaslHandshake + SaslAuthenticate (KIP-368 re-authentication) is answered
  here. Re-authentication must keep the mechanism and the principal.
* ``--session-lifetime-ms N``: SaslAuthenticate v1+ answers carry N (for
  OAUTHBEARER at most the token's remaining life); a request other than
  SaslHandshake after the session expired closes the connection ("expired").

Answer order. Kafka answers a connection's requests in order, and a client
matches answers to requests by that order as much as by correlation id. A
FIFO of pending answers per connection keeps local answers (SASL) behind
relayed ones: each forwarded request that expects an answer gets an entry,
filled when the broker's response with that correlation id arrives; a local
answer is an entry filled at once; entries go to the client from the head
only when filled. Produce with acks=0 expects no answer and gets no entry
(the header and acks are parsed); a broker response that matches no entry
(the mock answers acks=0 Produce all the same) is relayed as it arrives:
the broker answers in order, so everything before it has been filled by then.

``--log-requests``: every request relayed to the broker is logged too
("request", with its principal, api_key and client_id): which identity each
request reached the broker as.

``--proxy-protocol``: connections may start with a PROXY protocol v1 line
(stunnel's ``protocol = proxy``); the "peer" logged is then the TLS client's
address, not stunnel's. Connections without one are served too.

The log file gets one JSON line per event: {"event": "authenticated" |
"reauthenticated" | "failed" | "expired" | "refused", "principal",
"mechanism", "peer", "client_id", "time", ...}. One connection's error never stops the
front: it is printed and that connection closed.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import jwt
import trio
from scramp import ScramException, ScramMechanism

from proxy.kafka import headers, schema
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.wire import Malformed, Reader

PRODUCE = 0
SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36
SASL_APIS = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}

ILLEGAL_SASL_STATE = 34
UNSUPPORTED_SASL_MECHANISM = 33
UNSUPPORTED_VERSION = 35
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_ITERATIONS = 4096  # Kafka's minimum


class AuthFailed(Exception):
    """The client's credentials or token were refused; the message goes into the SaslAuthenticate answer."""


# --- mechanisms --------------------------------------------------------------


@dataclass
class Outcome:
    """One step of an exchange: the token to send back, and once done the principal (and token expiry, epoch s)."""

    reply: bytes
    principal: str | None = None
    expires_at: float | None = None


class Exchange:
    def step(self, token: bytes) -> Outcome:
        raise NotImplementedError


class PlainExchange(Exchange):
    """RFC 4616: ``authzid NUL authcid NUL passwd``; an authzid other than the user is refused, as Kafka does."""

    def __init__(self, users: dict[str, str]) -> None:
        self.users = users

    def step(self, token: bytes) -> Outcome:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthFailed("Invalid SASL/PLAIN request: expected 3 tokens")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthFailed("Invalid SASL/PLAIN request: not UTF-8") from None
        if authzid and authzid != user:
            raise AuthFailed("Authentication failed: Client requested an authorization id that is different from username")
        if not user or self.users.get(user) != password:
            raise AuthFailed("Authentication failed: Invalid username or password")
        return Outcome(b"", user)


class ScramExchange(Exchange):
    """RFC 5802 server side (scramp): client-first -> server-first, client-final -> server-final."""

    def __init__(self, mechanism: ScramMechanism, auth_info: dict[str, tuple[Any, ...]]) -> None:
        self.user: str | None = None

        def auth_fn(user: str) -> tuple[Any, ...]:
            self.user = user
            return auth_info[user]  # KeyError: scramp turns it into a ScramException

        self.server = mechanism.make_server(auth_fn)
        self.stage = 0

    def step(self, token: bytes) -> Outcome:
        try:
            text = token.decode()
            if self.stage == 0:
                self.stage = 1
                self.server.set_client_first(text)
                return Outcome(self.server.get_server_first().encode())
            if self.stage == 1:
                self.stage = 2
                self.server.set_client_final(text)
                assert self.user is not None
                return Outcome(self.server.get_server_final().encode(), self.user)
        except (ScramException, UnicodeDecodeError) as e:
            raise AuthFailed(
                f"Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM: {e}"
            ) from None
        raise AuthFailed("SCRAM exchange already complete")


class OAuthBearerExchange(Exchange):
    """RFC 7628 client message ``n,[a=authzid],\\x01auth=Bearer <jwt>\\x01[k=v\\x01]*\\x01``; the JWT is checked against the JWKS (RS256)."""

    def __init__(self, jwks: jwt.PyJWKSet | None) -> None:
        self.jwks = jwks

    def step(self, token: bytes) -> Outcome:
        try:
            text = token.decode()
        except UnicodeDecodeError:
            raise AuthFailed("Invalid OAUTHBEARER client first message: not UTF-8") from None
        gs2, sep, rest = text.partition("\x01")
        if not sep or not gs2.startswith("n,") or not rest.endswith("\x01"):
            raise AuthFailed("Invalid OAUTHBEARER client first message")
        pairs = dict(p.split("=", 1) for p in rest.split("\x01") if "=" in p)
        scheme, _, value = pairs.get("auth", "").partition(" ")
        if scheme.lower() != "bearer" or not value:
            raise AuthFailed("Invalid OAUTHBEARER client first message: no bearer token")
        if self.jwks is None:
            raise AuthFailed("OAUTHBEARER: no JWKS configured")
        try:
            kid = jwt.get_unverified_header(value).get("kid")
            keys = [k for k in self.jwks.keys if kid is None or k.key_id == kid]
            if not keys:
                raise AuthFailed(f"OAUTHBEARER: unknown key id {kid!r}")
            claims = jwt.decode(value, keys[0].key, algorithms=["RS256"], options={"require": ["exp", "sub"], "verify_aud": False})
        except jwt.PyJWTError as e:
            raise AuthFailed(f"OAUTHBEARER: invalid token: {e}") from None
        authzid = gs2[2:].rstrip(",")
        if authzid.startswith("a=") and authzid[2:] != claims["sub"]:
            raise AuthFailed("OAUTHBEARER: authorization id differs from the token's subject")
        return Outcome(b"", str(claims["sub"]), float(claims["exp"]))


class Authenticator:
    def __init__(self, users: dict[str, str], mechanisms: list[str], jwks: jwt.PyJWKSet | None) -> None:
        self.users = users
        self.mechanisms = mechanisms
        self.jwks = jwks
        self.scram: dict[str, tuple[ScramMechanism, dict[str, tuple[Any, ...]]]] = {}
        for name in mechanisms:
            if name.startswith("SCRAM-"):
                m = ScramMechanism(name)
                self.scram[name] = (m, {u: m.make_auth_info(p, iteration_count=SCRAM_ITERATIONS) for u, p in users.items()})

    def start(self, mechanism: str) -> Exchange:
        if mechanism == "PLAIN":
            return PlainExchange(self.users)
        if mechanism in self.scram:
            return ScramExchange(*self.scram[mechanism])
        if mechanism == "OAUTHBEARER":
            return OAuthBearerExchange(self.jwks)
        raise ValueError(mechanism)


# --- wire helpers ------------------------------------------------------------


def answer(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    spec = schema.response_spec(api_key, version)
    return frame([headers.response_header(api_key, version, correlation_id), *schema.encode_body(spec, {**spec.blank(), **body})])


def expects_response(payload: bytes, api_key: int, version: int) -> bool:
    """False only for Produce with acks=0 (parsed by hand: kio has no Produce below v3)."""
    if api_key != PRODUCE:
        return True
    try:
        r = Reader(payload, 8)
        r.string()  # client_id: a legacy string even in flexible headers
        flexible = version >= 9
        if flexible:
            for _ in range(r.uvarint()):
                r.uvarint()
                r.raw(r.uvarint())
        if version >= 3:
            r.compact_string() if flexible else r.string()  # transactional_id
        return r.int16() != 0
    except Malformed:
        return True


def with_sasl_apis(payload: bytes, version: int) -> bytes:
    """A successful ApiVersions answer from the broker, listing the SASL APIs this front answers."""
    if len(payload) < 6 or struct.unpack_from(">h", payload, 4)[0] != 0:
        return payload  # an error answer (e.g. UNSUPPORTED_VERSION, in v0 form): the client retries
    try:
        body = headers.decode_response(payload, API_VERSIONS, version)
        keys = [k for k in body["api_keys"] if k["api_key"] not in SASL_APIS]
        keys += [{"api_key": key, "min_version": lo, "max_version": hi} for key, (lo, hi) in SASL_APIS.items()]
        body["api_keys"] = sorted(keys, key=lambda k: k["api_key"])
        spec = schema.response_spec(API_VERSIONS, version)
        return headers.response_header(API_VERSIONS, version, headers.correlation_id_of(payload)) + b"".join(schema.encode_body(spec, body))
    except Exception:  # a version kio does not know: relay as is
        return payload


# --- connections -------------------------------------------------------------


@dataclass
class Pending:
    """An answer owed to the client, in request order; ``data`` (a whole frame) is None until known."""

    correlation_id: int
    api_key: int
    api_version: int
    data: bytes | None = None
    close_after: bool = False


class Closing(Exception):
    """Raised inside a connection to end it after logging."""


class Connection:
    def __init__(self, front: Front, client: trio.abc.Stream, peer: str) -> None:
        self.front = front
        self.client = client
        self.peer = peer
        self.upstream: trio.SocketStream | None = None
        self.fifo: deque[Pending] = deque()
        self.waiting: dict[int, deque[Pending]] = {}  # correlation id -> its upstream entries not yet answered
        self.send_lock = trio.Lock()
        # SASL state
        self.principal: str | None = None
        self.mechanism: str | None = None
        self.exchange: Exchange | None = None
        self.exchange_mechanism: str | None = None
        self.expires_at: float | None = None  # monotonic
        self.reauthentications = 0
        # The client id of the latest request: tests find their own connection's events by a client id they
        # chose, never by the peer's port, which an earlier connection may have used too.
        self.client_id: str | None = None

    def log(self, event: str, **fields: Any) -> None:
        self.front.log(event, peer=self.peer, client_id=self.client_id, **fields)

    async def run(self) -> None:
        host, port = self.front.upstream
        self.upstream = await trio.open_tcp_stream(host, port)
        async with self.upstream, trio.open_nursery() as nursery:
            self.nursery = nursery
            nursery.start_soon(self.from_client)
            nursery.start_soon(self.from_upstream)

    def close(self) -> None:
        self.nursery.cancel_scope.cancel()

    # -- client side --

    async def from_client(self) -> None:
        reader = FrameReader()
        while True:
            data = await self.client.receive_some(65536)
            if not data:
                self.close()
                return
            reader.feed(data)
            while (payload := reader.next_frame()) is not None:
                if not await self.on_request(payload):
                    return  # stop reading: the connection closes (now, or once owed answers are out)

    async def on_request(self, payload: bytes) -> bool:
        api_key, version, cid = headers.peek_request(payload)
        try:
            self.client_id = headers.parse_request_header(payload).client_id
        except Exception:
            self.client_id = None  # a header the codec cannot read: its events carry no client id
        if api_key in SASL_APIS:
            return await self.on_sasl(payload, api_key, version, cid)
        authenticated = self.principal is not None and self.exchange is None
        if authenticated:
            if self.expires_at is not None and time.monotonic() >= self.expires_at:
                self.log("expired", principal=self.principal, mechanism=self.mechanism, api_key=api_key)
                self.close()
                return False
        elif not (api_key == API_VERSIONS and self.principal is None and self.exchange is None):
            reason = "during re-authentication" if self.principal else "before authentication"
            self.log("refused", principal=self.principal, mechanism=self.mechanism, api_key=api_key, api_version=version, reason=reason)
            self.close()
            return False
        if self.front.log_requests:
            self.log("request", principal=self.principal, mechanism=self.mechanism, api_key=api_key, api_version=version)
        await self.forward(payload, api_key, version, cid)
        return True

    async def forward(self, payload: bytes, api_key: int, version: int, cid: int) -> None:
        if expects_response(payload, api_key, version):
            entry = Pending(cid, api_key, version)
            self.fifo.append(entry)
            self.waiting.setdefault(cid, deque()).append(entry)
        assert self.upstream is not None
        await self.upstream.send_all(frame([payload]))

    async def local(self, api_key: int, version: int, cid: int, body: dict[str, Any], close_after: bool = False) -> None:
        """Answer here, after every answer owed before it; ``close_after``: then close the connection."""
        self.fifo.append(Pending(cid, api_key, version, answer(api_key, version, cid, body), close_after))
        await self.flush()

    async def on_sasl(self, payload: bytes, api_key: int, version: int, cid: int) -> bool:
        lo, hi = SASL_APIS[api_key]
        if not lo <= version <= hi:
            self.log("refused", principal=self.principal, api_key=api_key, api_version=version, reason="unsupported version")
            self.close()
            return False
        _, body = headers.decode_request(payload)
        enabled = self.front.auth.mechanisms
        if api_key == SASL_HANDSHAKE:
            mechanism = body["mechanism"]
            if version == 0:
                self.log("refused", principal=self.principal, mechanism=mechanism, reason="SaslHandshake v0 (raw tokens) is not supported")
                await self.local(api_key, version, cid, {"error_code": UNSUPPORTED_VERSION, "mechanisms": enabled}, True)
                return False
            if self.exchange is not None:
                self.log("refused", principal=self.principal, mechanism=mechanism, reason="SaslHandshake during an exchange")
                await self.local(api_key, version, cid, {"error_code": ILLEGAL_SASL_STATE, "mechanisms": enabled}, True)
                return False
            if mechanism not in enabled:
                self.log("failed", principal=self.principal, mechanism=mechanism, reason="unsupported mechanism")
                body = {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": enabled}
                await self.local(api_key, version, cid, body, True)
                return False
            self.exchange = self.front.auth.start(mechanism)
            self.exchange_mechanism = mechanism
            await self.local(api_key, version, cid, {"error_code": 0, "mechanisms": enabled})
            return True

        # SaslAuthenticate
        if self.exchange is None:
            self.log("refused", principal=self.principal, reason="SaslAuthenticate without SaslHandshake")
            body = {"error_code": ILLEGAL_SASL_STATE, "error_message": "SaslAuthenticate without a SaslHandshake"}
            await self.local(api_key, version, cid, body, True)
            return False
        mechanism = self.exchange_mechanism
        try:
            outcome = self.exchange.step(bytes(body["auth_bytes"]))
            if outcome.principal is not None and self.principal is not None:
                if mechanism != self.mechanism:
                    raise AuthFailed(f"Cannot change SASL mechanism from {self.mechanism} to {mechanism} during re-authentication")
                if outcome.principal != self.principal:
                    raise AuthFailed(f"Cannot change principals during re-authentication from {self.principal} to {outcome.principal}")
        except AuthFailed as e:
            self.log("failed", principal=self.principal, mechanism=mechanism, reason=str(e), reauthentication=self.principal is not None)
            body = {"error_code": SASL_AUTHENTICATION_FAILED, "error_message": str(e), "auth_bytes": b""}
            await self.local(api_key, version, cid, body, True)
            return False
        reply: dict[str, Any] = {"error_code": 0, "error_message": None, "auth_bytes": outcome.reply}
        if outcome.principal is not None:
            lifetime = self.front.session_lifetime_ms or 0
            if lifetime and outcome.expires_at is not None:
                lifetime = max(1, min(lifetime, int((outcome.expires_at - time.time()) * 1000)))
            # A v0 client is told nothing, so it cannot be held to a lifetime.
            self.expires_at = time.monotonic() + lifetime / 1000 if lifetime and version >= 1 else None
            if version >= 1:
                reply["session_lifetime"] = lifetime
            event = "reauthenticated" if self.principal is not None else "authenticated"
            if self.principal is not None:
                self.reauthentications += 1
            self.principal, self.mechanism, self.exchange, self.exchange_mechanism = outcome.principal, mechanism, None, None
            self.log(event, principal=self.principal, mechanism=mechanism, session_lifetime_ms=lifetime, api_version=version)
        await self.local(api_key, version, cid, reply)
        return True

    # -- upstream side --

    async def from_upstream(self) -> None:
        assert self.upstream is not None
        reader = FrameReader(min_frame_bytes=4)
        while True:
            data = await self.upstream.receive_some(65536)
            if not data:
                self.close()
                return
            reader.feed(data)
            while (payload := reader.next_frame()) is not None:
                cid = headers.correlation_id_of(payload)
                queue = self.waiting.get(cid)
                if not queue:
                    async with self.send_lock:  # an answer nobody waits for (acks=0 Produce on the mock)
                        await self.client.send_all(frame([payload]))
                    continue
                entry = queue.popleft()
                if not queue:
                    del self.waiting[cid]
                if entry.api_key == API_VERSIONS:
                    payload = with_sasl_apis(payload, entry.api_version)
                entry.data = frame([payload])
                await self.flush()

    async def flush(self) -> None:
        async with self.send_lock:
            while self.fifo and self.fifo[0].data is not None:
                entry = self.fifo.popleft()
                assert entry.data is not None
                await self.client.send_all(entry.data)
                if entry.close_after:
                    self.close()
                    return


# --- the server ----------------------------------------------------------------


class Front:
    def __init__(
        self, upstream: tuple[str, int], auth: Authenticator, session_lifetime_ms: int | None, log_file: TextIO, proxy_protocol: bool
    ):
        self.upstream = upstream
        self.auth = auth
        self.session_lifetime_ms = session_lifetime_ms
        self.log_file = log_file
        self.proxy_protocol = proxy_protocol
        self.log_requests = False
        self.connections = 0

    def log(self, event: str, **fields: Any) -> None:
        record = {"event": event, "principal": None, "mechanism": None, **fields, "time": time.time()}
        self.log_file.write(json.dumps(record) + "\n")
        self.log_file.flush()

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        try:
            host, port = stream.socket.getpeername()[:2]
            peer = f"{host}:{port}"
        except OSError:
            peer = "?"
        try:
            client: trio.abc.Stream = stream
            if self.proxy_protocol:
                proxied, leftover = await read_proxy_line(stream)
                peer = proxied or peer
                client = PrefixedStream(stream, leftover)
            await Connection(self, client, peer).run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError, Closing):
            pass  # the peer went away, or a connection ended on purpose
        except* Exception:
            print(f"sasl_front: connection from {peer} failed:\n{traceback.format_exc()}", flush=True)
        finally:
            await trio.aclose_forcefully(stream)


async def read_proxy_line(stream: trio.SocketStream) -> tuple[str | None, bytes]:
    """The client address from a PROXY protocol v1 line, and the bytes read past it.

    A connection that does not start with "PROXY " (a Kafka client straight to
    the front: no size prefix begins with those bytes) has no address to give.
    """
    buf = b""
    while len(buf) < 6:
        data = await stream.receive_some(256)
        if not data:
            raise Closing("closed before the first request")
        buf += data
    if not buf.startswith(b"PROXY "):
        return None, buf
    while b"\r\n" not in buf:
        if len(buf) > 107:  # the longest v1 line
            raise Closing("no PROXY protocol line")
        data = await stream.receive_some(256)
        if not data:
            raise Closing("closed before the PROXY protocol line")
        buf += data
    line, _, rest = buf.partition(b"\r\n")
    parts = line.decode("ascii", "replace").split()
    if len(parts) >= 6 and parts[0] == "PROXY":
        return f"{parts[2]}:{parts[4]}", rest
    if len(parts) >= 2 and parts[:2] == ["PROXY", "UNKNOWN"]:
        return "unknown", rest
    raise Closing(f"bad PROXY protocol line {line!r}")


class PrefixedStream(trio.abc.Stream):
    """A stream whose first receive returns bytes already read from it."""

    def __init__(self, stream: trio.SocketStream, prefix: bytes) -> None:
        self.stream = stream
        self.prefix = prefix

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self.prefix:
            data, self.prefix = self.prefix, b""
            return data
        return await self.stream.receive_some(max_bytes)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host or "127.0.0.1", int(port)


async def _watch_parent(cancel: Callable[[], None]) -> None:
    """Exit when the process that started us is gone (a test run killed hard)."""
    parent = os.getppid()
    while os.getppid() == parent:
        await trio.sleep(1)
    cancel()


async def serve(args: argparse.Namespace) -> None:
    mechanisms = [m.strip().upper() for m in args.mechanisms.split(",") if m.strip()]
    unknown = sorted(set(mechanisms) - set(MECHANISMS))
    if unknown:
        raise SystemExit(f"unknown mechanisms {unknown}; known: {', '.join(MECHANISMS)}")
    users = json.loads(Path(args.users).read_text()) if args.users else {}
    jwks = jwt.PyJWKSet.from_json(Path(args.jwks).read_text()) if args.jwks else None
    auth = Authenticator(users, mechanisms, jwks)
    host, port = _address(args.listen)
    with open(args.log, "a", encoding="utf-8") as log_file:
        front = Front(_address(args.upstream), auth, args.session_lifetime_ms, log_file, args.proxy_protocol)
        front.log_requests = args.log_requests
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        print(f"sasl_front: listening on {bound[0]}:{bound[1]} -> {args.upstream} ({','.join(mechanisms)})", flush=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch_parent, nursery.cancel_scope.cancel)
            await trio.serve_listeners(front.handle, listeners, handler_nursery=nursery)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tests.support.sasl_front", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, help="HOST:PORT (port 0: any free port, printed)")
    p.add_argument("--upstream", required=True, help="HOST:PORT of the broker")
    p.add_argument("--users", help='JSON file {"user": "password", ...} for PLAIN and SCRAM')
    p.add_argument("--mechanisms", default=",".join(MECHANISMS))
    p.add_argument("--jwks", help="JWKS file of the keys OAUTHBEARER tokens must be signed with (RS256)")
    p.add_argument("--session-lifetime-ms", type=int, default=None)
    p.add_argument("--proxy-protocol", action="store_true", help="read a PROXY protocol v1 line when a connection starts with one")
    p.add_argument("--log", required=True, help="JSON-lines event log (appended)")
    p.add_argument("--log-requests", action="store_true", help="log every relayed request with the principal it came as")
    args = p.parse_args(argv)
    try:
        trio.run(serve, args)
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
