"""A broker link's SASL login: SaslHandshake v1, then SaslAuthenticate until
the mechanism's exchange is over (KIP-43), at the versions the broker
advertises; again before the session the broker granted ends (KIP-368).

:class:`SaslLogin` is what a :class:`~backends.link.Link` runs, over the
link's own request/answer path, before any other request and whenever its
session is about to end. The credentials are asked for at each login, so a
re-read password file, a refreshed token or a client's new credentials are
the ones used. SCRAM's steps (SASLprep, PBKDF2 over the broker's salt and
iteration count, the proofs) run in a worker thread behind the limiter the
client logins share (:mod:`proxy.security.offload`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import trio

from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_response
from proxy.kafka.wire import Malformed
from proxy.runtime import metrics
from proxy.security import offload
from proxy.security.sasl import ClientExchange, Credentials, SaslError
from proxy.security.users import SCRAM_MECHANISMS

from .link import Call, Link, LinkError, own_request
from .reads import read_api_versions

log = logging.getLogger("kfan.link")

T = TypeVar("T")
R = TypeVar("R")

# The ApiVersions version asked before logging in: every broker serves v0.
_API_VERSIONS_VERSION = 0


class AuthenticationFailed(LinkError):
    """The broker refused the link's credentials (or its SASL answers made no sense)."""

    def __init__(self, broker: int, mechanism: str, reason: str, code: int = errors.SASL_AUTHENTICATION_FAILED) -> None:
        super().__init__(f"broker {broker}: SASL {mechanism} authentication failed: {reason}")
        self.broker = broker
        self.mechanism = mechanism
        self.code = code


class SaslLogin:
    """Logs one link in; called again for each re-authentication."""

    def __init__(self, broker: int, credentials: Callable[[], Credentials]) -> None:
        self.broker = broker
        self._credentials = credentials
        self._versions: dict[int, tuple[int, int]] | None = None
        self.logins = 0

    async def __call__(self, call: Call) -> float | None:
        """Authenticate over ``call``; the session lifetime the broker granted, in seconds (None: unlimited)."""
        credentials = self._credentials()
        mechanism = credentials.mechanism
        result = "failed"
        try:
            lifetime = await self._login(call, credentials)
            result = "reauthenticated" if self.logins else "ok"
            self.logins += 1
            return lifetime
        except Malformed as e:
            raise AuthenticationFailed(self.broker, mechanism, f"unreadable answer: {e}") from None
        except trio.Cancelled:
            # The link's client left, or its link was retired, while it logged in: nothing failed.
            result = "abandoned"
            raise
        finally:
            metrics.BROKER_AUTHENTICATIONS.labels(str(self.broker), mechanism, result).inc()

    async def _login(self, call: Call, credentials: Credentials) -> float | None:
        mechanism = credentials.mechanism
        if self._versions is None:
            self._versions = read_api_versions(await call(apis.API_VERSIONS, _API_VERSIONS_VERSION, {}), _API_VERSIONS_VERSION)
        handshake = self._versions.get(apis.SASL_HANDSHAKE)
        if handshake is None or handshake[1] < 1:
            raise AuthenticationFailed(self.broker, mechanism, f"the broker serves SaslHandshake {handshake}, kfan needs v1")
        answer = decode_response(await call(apis.SASL_HANDSHAKE, 1, {"mechanism": mechanism}), apis.SASL_HANDSHAKE, 1)
        if answer["error_code"] != 0:
            offered = ", ".join(answer["mechanisms"] or []) or "none"
            raise AuthenticationFailed(
                self.broker, mechanism, f"error {answer['error_code']}; the broker offers {offered}", answer["error_code"]
            )
        lo, hi = self._versions.get(apis.SASL_AUTHENTICATE, (0, 0))
        version = max(lo, min(hi, 2))
        try:
            exchange = await _costly(mechanism, ClientExchange, credentials)
        except ValueError as e:  # credentials no login can use (an empty password file)
            raise AuthenticationFailed(self.broker, mechanism, f"kfan's credentials: {e}") from None
        message: bytes | None = exchange.first()
        while True:
            assert message is not None
            answer = decode_response(await call(apis.SASL_AUTHENTICATE, version, {"auth_bytes": message}), apis.SASL_AUTHENTICATE, version)
            if answer["error_code"] != 0:
                reason = answer["error_message"] or f"error {answer['error_code']}"
                raise AuthenticationFailed(self.broker, mechanism, reason, answer["error_code"])
            try:
                message = await _costly(mechanism, exchange.step, bytes(answer["auth_bytes"] or b""))
            except SaslError as e:
                raise AuthenticationFailed(self.broker, mechanism, str(e)) from None
            if message is None:
                lifetime_ms = answer.get("session_lifetime", 0) or 0
                return lifetime_ms / 1000 if lifetime_ms > 0 else None


async def _costly(mechanism: str, work: Callable[[T], R], arg: T) -> R:
    """SCRAM's work (SASLprep of the credentials, the key derivation) off the event loop; PLAIN's and OAUTHBEARER's is trivial."""
    if mechanism in SCRAM_MECHANISMS:
        return await offload.run(work, arg)
    return work(arg)


async def relogin_confirmed(link: Link) -> str | None:
    """Log ``link`` in again, with the credentials its login asks for now, and wait for the answer to a
    request sent after that login: None when the broker took the credentials, else why not (the link failed).

    A client's re-authentication with ``--broker-identity client`` is confirmed so before it is answered.
    """
    link.reauthenticate()
    try:
        await link.submit(own_request(apis.API_VERSIONS, _API_VERSIONS_VERSION, {})).wait()
    except LinkError as e:
        return str(e)
    return None
