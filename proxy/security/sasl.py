"""SASL mechanisms as sans-IO exchanges of auth_bytes, both ways round.

ClientExchange is kfan authenticating to a broker; Authenticator and its
ServerExchange are kfan authenticating a client. They turn one SaslAuthenticate
payload into the next and say when the exchange is over; the Kafka framing,
the sockets and what to do with a principal are the caller's. SCRAM is scramp's
(with Kafka's salt policy on the client side, scram_client.py),
JWTs are checked in oauth.py, passwords in users.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scramp import ScramException, ScramMechanism
from scramp.utils import ServerError

from proxy.security.errors import SaslError
from proxy.security.scram_client import KafkaScramClient
from proxy.security.users import MIN_ITERATIONS, SCRAM_MECHANISMS, Users, VerifiedPasswords

if TYPE_CHECKING:
    from proxy.security.oauth import TokenValidator

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"
MECHANISMS: tuple[str, ...] = (PLAIN, "SCRAM-SHA-256", "SCRAM-SHA-512", OAUTHBEARER)

# RFC 7628 section 3.1, with the character sets Kafka's OAuthBearerClientInitialResponse uses.
_SEP = "\x01"
_OAUTH_MESSAGE = re.compile(
    r"n,(?:a=(?P<authzid>(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+))?,\x01(?P<kvpairs>(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*)\x01",
    re.ASCII,
)
_OAUTH_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)", re.ASCII)

# What a client may send to log in, checked on the bytes as they came, before
# scramp, the JWT library or the PLAIN parser sees them: anything larger is an
# authentication failure that costs a length check. scramp prepares a SCRAM user
# name (SASLprep, RFC 4013) in pure Python, on the order of a microsecond and a half
# a character: one client-first message with a 20 MB name held the event loop, and
# every client with it, for 35 s. Real names are a few dozen bytes, real JWTs a few KiB.
MAX_USER_NAME_BYTES = 1024  # SCRAM's n= and a= attributes, PLAIN's authcid and authzid, as sent (escaped)
MAX_TOKEN_BYTES = 64 * 1024  # an OAUTHBEARER token
# A whole SaslAuthenticate auth_bytes: the largest token with room for its framing
# (RFC 7628's gs2 header, key=value pairs) and a PLAIN password of a few KiB.
MAX_AUTH_BYTES = MAX_TOKEN_BYTES + 4 * 1024

# One reason for both a wrong password and an unknown user: the client must not learn which names exist.
BAD_CREDENTIALS = "invalid user name or password"

# PLAIN passwords kept (as keyed hashes) once verified: a client that logs in
# over and over costs one PBKDF2 derivation, not one a login.
VERIFIED_PASSWORDS = 1024


@dataclass(frozen=True)
class Credentials:
    """What a SASL client presents: user name and password, or a bearer token."""

    mechanism: str
    username: str = ""
    password: str = field(default="", repr=False)
    token: str = field(default="", repr=False)
    # SCRAM with a delegation token's id and HMAC (base64) as user name and password (KIP-48).
    token_auth: bool = False


# --- client side ---------------------------------------------------------------


class ClientExchange:
    """kfan logging in to a broker: ``first()``, then ``step()`` on each broker reply until it returns None."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self.mechanism = credentials.mechanism
        self._started = False
        self._finished = False
        self._answered_first = False
        self._scram: KafkaScramClient | None = None
        if self.mechanism == PLAIN:
            if not credentials.username or "\0" in credentials.username or "\0" in credentials.password:
                raise ValueError("PLAIN needs a user name, and neither it nor the password may contain NUL")
        elif self.mechanism in SCRAM_MECHANISMS:
            try:
                self._scram = KafkaScramClient(
                    [self.mechanism], credentials.username, credentials.password, token_auth=credentials.token_auth
                )
            except ScramException as e:
                raise ValueError(f"{self.mechanism} cannot use these credentials: {e}") from None
        elif self.mechanism == OAUTHBEARER:
            if not _OAUTH_AUTH.fullmatch(f"Bearer {credentials.token}"):
                raise ValueError("OAUTHBEARER needs a token of base64/base64url characters (RFC 6750 b64token)")
        else:
            raise ValueError(f"unknown SASL mechanism {self.mechanism!r} (known: {', '.join(MECHANISMS)})")

    def first(self) -> bytes:
        """The first SaslAuthenticate auth_bytes."""
        if self._started:
            raise RuntimeError("first() was already called")
        self._started = True
        if self._scram is not None:
            return self._scram.get_client_first().encode()
        if self.mechanism == PLAIN:
            return f"\0{self.credentials.username}\0{self.credentials.password}".encode()
        return f"n,,{_SEP}auth=Bearer {self.credentials.token}{_SEP}{_SEP}".encode()

    def step(self, server_bytes: bytes) -> bytes | None:
        """The next auth_bytes to send for the broker's ``server_bytes``, or None when kfan's side is done."""
        if not self._started:
            raise RuntimeError("step() before first()")
        if self.mechanism == PLAIN:
            return None  # the broker's verdict is the response's error code, not its bytes
        if self.mechanism == OAUTHBEARER:
            if server_bytes:
                raise SaslError(f"the broker rejected the token: {_oauth_status(server_bytes)}")
            return None
        assert self._scram is not None
        if self._finished:
            raise SaslError(f"{self.mechanism}: the broker sent more after its final message")
        try:
            text = server_bytes.decode("utf-8")
            if not self._answered_first:
                self._answered_first = True
                self._scram.set_server_first(text)
                return self._scram.get_client_final().encode()
            self._finished = True
            self._scram.set_server_final(text)
            return None
        except UnicodeDecodeError:
            raise SaslError(f"{self.mechanism}: the broker's message is not UTF-8") from None
        except ScramException as e:
            self._finished = True
            raise SaslError(f"{self.mechanism}: {e}") from None


def _oauth_status(server_bytes: bytes) -> str:
    # RFC 7628 section 3.2.2: the server's error is a JSON object whose "status" says why.
    try:
        status = json.loads(server_bytes).get("status")
    except (ValueError, AttributeError):
        return "no status"
    return str(status)[:80] if status is not None else "no status"


# --- server side ---------------------------------------------------------------


@dataclass(frozen=True)
class ServerStep:
    reply: bytes  # auth_bytes of the SaslAuthenticate response
    done: bool  # the exchange is over (success or failure)
    principal: str | None = None  # on success: the user name (SASL) or token subject
    error: str | None = None  # on failure: why, for logs and the error_message (no secrets)
    credentials: Credentials | None = None  # on success with PLAIN or OAUTHBEARER: what can be replayed to brokers
    expires_at: float | None = None  # unix time the credential expires (a token's exp), else None


def _failed(error: str, reply: bytes = b"") -> ServerStep:
    return ServerStep(reply, True, error=error)


class ServerExchange:
    """One client's authentication with one mechanism; feed it each SaslAuthenticate auth_bytes."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self.claimed: str | None = None  # the name the client gave, checked or not: logged with a failure
        self._done = False

    def step(self, client_bytes: bytes) -> ServerStep:
        """The answer to ``client_bytes``; never raises: every problem is a finished step with ``error`` set."""
        if self._done:
            return _failed("exchange already finished")
        try:
            result = self._oversized(client_bytes) or self._step(client_bytes)
        except Exception as e:
            # Whatever a client sends must end in an authentication failure, never in a dead connection task.
            result = _failed(f"{self.mechanism}: internal error ({type(e).__name__})")
        if result.done:
            self._done = True
        return result

    def _oversized(self, client_bytes: bytes) -> ServerStep | None:
        """A failure if ``client_bytes`` is over a bound, found without decoding or parsing them; else None."""
        if len(client_bytes) > MAX_AUTH_BYTES:
            return _failed(f"{self.mechanism} message of {len(client_bytes)} bytes, over the {MAX_AUTH_BYTES} allowed")
        return None

    def _step(self, client_bytes: bytes) -> ServerStep:
        raise NotImplementedError


def _long_name(field: str, value: bytes) -> ServerStep | None:
    if len(value) > MAX_USER_NAME_BYTES:
        return _failed(f"{field} of {len(value)} bytes, over the {MAX_USER_NAME_BYTES} allowed")
    return None


class _PlainServer(ServerExchange):
    def __init__(self, users: Callable[[], Users] | None, verified: VerifiedPasswords | None = None) -> None:
        super().__init__(PLAIN)
        self._users = users  # None: accept anything well-formed, the brokers check the replayed credentials
        self._verified = verified

    def _oversized(self, client_bytes: bytes) -> ServerStep | None:
        if too_big := super()._oversized(client_bytes):
            return too_big
        # message = [authzid] NUL authcid NUL passwd (RFC 4616 section 2)
        parts = client_bytes.split(b"\0", 2)
        if len(parts) == 3:
            return _long_name("PLAIN authorization id", parts[0]) or _long_name("PLAIN user name", parts[1])
        return None

    def _step(self, client_bytes: bytes) -> ServerStep:
        try:
            parts = client_bytes.decode("utf-8").split("\0")
        except UnicodeDecodeError:
            return _failed("PLAIN message is not UTF-8")
        if len(parts) != 3:
            return _failed("malformed PLAIN message")
        authzid, authcid, password = parts
        self.claimed = authcid or None
        if not authcid or not password:
            return _failed("PLAIN message lacks a user name or password")
        if authzid and authzid != authcid:
            return _failed("PLAIN authorization id differs from the user name")
        if self._users is not None and not self._users().check_password(authcid, password, self._verified):
            return _failed(BAD_CREDENTIALS)
        return ServerStep(b"", True, principal=authcid, credentials=Credentials(PLAIN, authcid, password))


class _ScramServer(ServerExchange):
    def __init__(self, mechanism: str, users: Callable[[], Users], decoy_key: bytes) -> None:
        super().__init__(mechanism)
        self._users = users
        self._decoy_key = decoy_key
        self._server = ScramMechanism(mechanism).make_server(self._auth_info)
        self._name: str | None = None
        self._first = True

    def _auth_info(self, name: str) -> tuple[bytes, bytes, bytes, int]:
        # scramp calls this with the name already unescaped (=2C, =3D) and SASLprep'd.
        self._name = self.claimed = name
        cred = self._users().scram(name, self.mechanism)
        if cred is not None:
            return cred.salt, cred.stored_key, cred.server_key, cred.iterations
        # An unknown user gets a made-up credential that no proof matches, with a salt
        # that stays the same for the name: the exchange fails where a wrong password
        # would, so neither the reply nor its timing says the name does not exist.
        size = SCRAM_MECHANISMS[self.mechanism]().digest_size
        salt = hmac.digest(self._decoy_key, f"{self.mechanism}\0{name}".encode(), hashlib.sha256)
        return salt, bytes(size), bytes(size), MIN_ITERATIONS

    def _oversized(self, client_bytes: bytes) -> ServerStep | None:
        if too_big := super()._oversized(client_bytes):
            return too_big
        if self._first:
            # client-first-message = gs2-cbind-flag "," [ "a=" authzid ] "," "n=" username "," "r=" nonce ... (RFC 5802 section 7)
            parts = client_bytes.split(b",", 3)
            if len(parts) >= 3:
                return _long_name(f"{self.mechanism} authorization id", parts[1]) or _long_name(f"{self.mechanism} user name", parts[2])
        return None

    def _step(self, client_bytes: bytes) -> ServerStep:
        try:
            text = client_bytes.decode("utf-8")
        except UnicodeDecodeError:
            return _failed(f"{self.mechanism} message is not UTF-8")
        try:
            if self._first:
                self._first = False
                self._server.set_client_first(text)
                return ServerStep(self._server.get_server_first().encode(), False)
            self._accept_repeated_client_nonce(text)
            self._server.set_client_final(text)
            return ServerStep(self._server.get_server_final().encode(), True, principal=self._name)
        except ScramException as e:
            reply = b""
            if e.server_error is not None:
                reply = self._server.get_server_final().encode()  # "e=<reason>", RFC 5802 section 7
            if e.server_error is ServerError.INVALID_PROOF:
                return _failed(BAD_CREDENTIALS, reply)
            return _failed(f"{self.mechanism}: {e}", reply)

    def _accept_repeated_client_nonce(self, client_final: str) -> None:
        """librdkafka before 2.6.1 (still the one Debian and Ubuntu ship) sends the client
        nonce twice in its final message (confluentinc/librdkafka#4895). Kafka up to 3.9
        takes a nonce that ends with the server's, and so does kfan: scramp is told the
        nonce as received and checks the proof over the message as received, so the
        proof still binds the fresh server nonce."""
        received = next((a[2:] for a in client_final.split(",") if a.startswith("r=")), None)
        expected = str(self._server.nonce)
        if received is not None and received != expected and received.endswith(expected) and len(received) < 4 * len(expected):
            self._server.nonce = type(self._server.nonce)(received)


class _OAuthBearerServer(ServerExchange):
    def __init__(self, tokens: TokenValidator) -> None:
        super().__init__(OAUTHBEARER)
        self._tokens = tokens

    def _step(self, client_bytes: bytes) -> ServerStep:
        try:
            text = client_bytes.decode("ascii")
        except UnicodeDecodeError:
            return _failed("malformed OAUTHBEARER message")
        message = _OAUTH_MESSAGE.fullmatch(text)
        if message is None:
            return _failed("malformed OAUTHBEARER message")
        pairs: dict[str, str] = {}
        for pair in message["kvpairs"].split(_SEP)[:-1]:
            key, _, value = pair.partition("=")
            if key in pairs:
                return _failed(f"OAUTHBEARER message repeats key {key[:20]!r}")
            pairs[key] = value
        auth = _OAUTH_AUTH.fullmatch(pairs.get("auth", ""))
        if auth is None or auth["scheme"].lower() != "bearer":
            return _failed("OAUTHBEARER message has no auth=Bearer <token>")
        token = auth["token"]
        if len(token) > MAX_TOKEN_BYTES:
            return _failed(f"OAUTHBEARER token of {len(token)} bytes, over the {MAX_TOKEN_BYTES} allowed")
        try:
            subject, expires_at = self._tokens.validate(token)
        except SaslError as e:
            return _failed(f"OAUTHBEARER: {e}")
        self.claimed = subject
        authzid = message["authzid"]
        if authzid is not None and authzid.replace("=2C", ",").replace("=3D", "=") != subject:
            return _failed("OAUTHBEARER authorization id differs from the token subject")
        # The extensions (other keys) are ignored, as Kafka does with those no callback validated.
        return ServerStep(b"", True, principal=subject, credentials=Credentials(OAUTHBEARER, subject, token=token), expires_at=expires_at)


class Authenticator:
    """The mechanisms kfan offers its clients, and what each checks against."""

    def __init__(
        self,
        mechanisms: Sequence[str],
        *,
        users: Callable[[], Users] | None = None,
        tokens: TokenValidator | None = None,
        check_users: bool = True,
    ) -> None:
        self.mechanisms: tuple[str, ...] = tuple(dict.fromkeys(mechanisms))
        for mechanism in self.mechanisms:
            if mechanism not in MECHANISMS:
                raise ValueError(f"unknown SASL mechanism {mechanism!r} (known: {', '.join(MECHANISMS)})")
            if users is None and (mechanism in SCRAM_MECHANISMS or (mechanism == PLAIN and check_users)):
                raise ValueError(f"{mechanism} needs a users file")
            if tokens is None and mechanism == OAUTHBEARER:
                raise ValueError("OAUTHBEARER needs a token validator (a JWKS file)")
        self._users = users
        self._tokens = tokens
        self._check_users = check_users
        # Keys the made-up credentials of unknown SCRAM users: fixed for this process, unguessable outside it.
        self._decoy_key = secrets.token_bytes(32)
        self.verified = VerifiedPasswords(VERIFIED_PASSWORDS)

    def start(self, mechanism: str) -> ServerExchange | None:
        """A new exchange, or None if ``mechanism`` is not enabled (the caller answers with ``self.mechanisms``).

        The exchange checks against the users file and the JWKS as they are now:
        its steps may run in a worker thread, which must not re-read those files.
        """
        if mechanism not in self.mechanisms:
            return None
        if mechanism == PLAIN:
            return _PlainServer(_now(self._users) if self._users is not None and self._check_users else None, self.verified)
        if mechanism == OAUTHBEARER:
            assert self._tokens is not None
            return _OAuthBearerServer(self._tokens.current())
        assert self._users is not None
        return _ScramServer(mechanism, _now(self._users), self._decoy_key)


def _now(users: Callable[[], Users]) -> Callable[[], Users]:
    """``users`` as it is now, read on the event loop; a source that fails fails the exchange's step, not its start."""
    try:
        current = users()
    except Exception as e:
        failure = e

        def failing() -> Users:
            raise failure

        return failing
    return lambda: current
