"""Clients authenticated by kfan, as a broker with a SASL listener does it.

A :class:`ClientSession` is one client connection's authentication state.
Before the client has logged in it may send only what the route table lets
come first (``before_login``: ApiVersions, SaslHandshake and
SaslAuthenticate); anything else closes the connection. kfan answers
SaslHandshake (v0: raw SASL tokens follow; v1: SaslAuthenticate requests)
and SaslAuthenticate itself (their rows' ``login``, at the versions the rows
serve), with the mechanism's exchange from :mod:`proxy.security.sasl`. A
failed login is answered with SASL_AUTHENTICATION_FAILED after a short
delay, then the connection closes; an unknown mechanism with
UNSUPPORTED_SASL_MECHANISM and the list. A session may have a lifetime
(KIP-368): the client must log in again before it ends, or its next request
closes the connection.

With the client's identity carried to the brokers, a login, and each
re-authentication, is confirmed by logging a broker link in with the same
credentials (``confirm``) before it is answered: a broker refusing them
refuses the client. A SCRAM login cannot be replayed: the links log in with a
delegation token of the client's principal instead (``mint``,
:mod:`proxy.server.token_identity`).

Each step of an exchange (SASLprep, PBKDF2, SCRAM proofs, JWT signatures)
runs in a worker thread behind the process's limiter (:mod:`proxy.security.offload`);
what a client chose (mechanism, user name) is logged through :func:`~proxy.runtime.logtext.printable`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio

from proxy.core.plan import Login
from proxy.core.routes import ROUTES, served_versions
from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_request, peek_request, response_header
from proxy.kafka.schema import encode_body, response_spec
from proxy.kafka.wire import Parts
from proxy.runtime import metrics
from proxy.runtime.logtext import printable
from proxy.security import offload
from proxy.security.sasl import Authenticator, Credentials, ServerExchange, ServerStep

log = logging.getLogger("kfan.auth")


@dataclass(frozen=True)
class ClientAuthConfig:
    authenticator: Authenticator
    session_lifetime: float = 0.0  # seconds a login lasts (KIP-368); 0: until the connection closes
    failure_delay: float = 0.1
    carry_identity: bool = False  # --broker-identity client


@dataclass(frozen=True)
class Answer:
    """A response kfan writes in its place in the order (``parts`` is the whole payload), then maybe closes."""

    api_key: int
    parts: Parts | None  # None: nothing is written (a failed login over bare tokens just closes, as on a broker)
    close: str | None = None


class Refused(Exception):
    """The request may not be served on this connection: close it."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


Confirm = Callable[[Credentials], Awaitable[str | None]]
"""Logs a broker link in with a client's credentials: None when the broker took them, else why not."""
Mint = Callable[[str, str], Awaitable[Credentials | str]]
"""Credentials the brokers take as (principal, mechanism) for a login kfan cannot replay (a delegation token for
a SCRAM login), or why there are none."""


class ClientSession:
    def __init__(
        self,
        config: ClientAuthConfig,
        client: str,
        *,
        confirm: Confirm | None = None,
        on_login: Callable[[], None] | None = None,
        mint: Mint | None = None,
    ) -> None:
        self.config = config
        self.client = client  # "client 12 (10.0.0.5:51234)", for the log
        self.principal: str | None = None
        self.mechanism: str | None = None
        self.credentials: Credentials | None = None  # what the brokers take as this client (its own, or a token's)
        self._candidate: Credentials | None = None  # being confirmed with a broker
        self.expires_at = math.inf
        self._exchange: ServerExchange | None = None
        self._raw_tokens = False  # after SaslHandshake v0 the next frames are bare SASL tokens
        self._failed = False  # a login failed: the connection is closing, nothing more is answered
        self._confirm = confirm
        self._on_login = on_login
        self._mint = mint

    @property
    def authenticated(self) -> bool:
        return self.principal is not None

    def broker_credentials(self) -> Credentials:
        """What this client's broker links log in with (``--broker-identity client``)."""
        chosen = self._candidate or self.credentials
        assert chosen is not None, "a broker link opened before the client logged in"
        return chosen

    async def admit(self, payload: bytes | memoryview) -> Answer | None:
        """kfan's own answer to a SASL request; None: plan and forward the request as usual.

        Raises :class:`Refused` when the request may not be served now.
        """
        if self._failed:
            raise Refused("authentication_failed", "a request after a failed login")
        if self._raw_tokens:
            return await self._raw_token(bytes(payload))
        api_key, version, _ = peek_request(payload)
        route = ROUTES.get(api_key)
        if route is not None and route.login is not None:
            served = served_versions(route)
            if served is None or not served[0] <= version <= served[1]:
                raise Refused("unsupported", f"{apis.api_name(api_key)} v{version}, which kfan does not serve")
            if route.login is Login.HANDSHAKE:
                return self._handshake(payload)
            return await self._authenticate(payload)
        if route is not None and route.before_login:
            return None
        if not self.authenticated:
            raise Refused("unauthenticated", f"api_key {api_key} before authentication")
        if trio.current_time() >= self.expires_at:
            metrics.AUTHENTICATIONS.labels(self.mechanism or "", "expired").inc()
            raise Refused("session_expired", f"{self.principal}'s session ended without re-authentication (KIP-368)")
        return None

    # --- SaslHandshake -------------------------------------------------------------

    def _handshake(self, payload: bytes | memoryview) -> Answer:
        hdr, request = decode_request(payload)
        mechanism = request["mechanism"]
        enabled = self.config.authenticator.mechanisms
        if self._exchange is not None:
            return self._answer(hdr, {"error_code": errors.ILLEGAL_SASL_STATE, "mechanisms": list(enabled)}, close="illegal_sasl_state")
        if self.authenticated and (hdr.api_version < 1 or mechanism != self.mechanism):
            # Re-authentication (KIP-368) keeps the mechanism and speaks SaslAuthenticate.
            log.warning(
                "%s: re-authentication with %s v%s refused (logged in with %s)",
                self.client,
                printable(mechanism),
                hdr.api_version,
                self.mechanism,
            )
            return self._answer(hdr, {"error_code": errors.ILLEGAL_SASL_STATE, "mechanisms": list(enabled)}, close="illegal_sasl_state")
        exchange = self.config.authenticator.start(mechanism)
        if exchange is None:
            metrics.AUTHENTICATIONS.labels(_label(mechanism), "unsupported_mechanism").inc()
            log.warning(
                "%s: SASL mechanism '%s' is not enabled (enabled: %s), closing", self.client, printable(mechanism), ", ".join(enabled)
            )
            body = {"error_code": errors.UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(enabled)}
            return self._answer(hdr, body, close="unsupported_sasl_mechanism")
        self._exchange = exchange
        self._raw_tokens = hdr.api_version == 0
        return self._answer(hdr, {"error_code": errors.NONE, "mechanisms": list(enabled)})

    # --- SaslAuthenticate ------------------------------------------------------------

    async def _authenticate(self, payload: bytes | memoryview) -> Answer:
        hdr, request = decode_request(payload)
        if self._exchange is None:
            body = {"error_code": errors.ILLEGAL_SASL_STATE, "error_message": "SaslAuthenticate before SaslHandshake", "auth_bytes": b""}
            return self._answer(hdr, body, close="illegal_sasl_state")
        step = await offload.run(self._exchange.step, bytes(request["auth_bytes"] or b""))
        if not step.done:
            return self._answer(hdr, {"error_code": errors.NONE, "error_message": None, "auth_bytes": step.reply, "session_lifetime": 0})
        error = await self._finish(step)
        if error is not None:
            body = {"error_code": errors.SASL_AUTHENTICATION_FAILED, "error_message": f"Authentication failed: {error}", "auth_bytes": b""}
            return self._answer(hdr, body, close="authentication_failed")
        lifetime_ms = 0 if math.isinf(self.expires_at) else max(1, int((self.expires_at - trio.current_time()) * 1000))
        body = {"error_code": errors.NONE, "error_message": None, "auth_bytes": step.reply, "session_lifetime": lifetime_ms}
        return self._answer(hdr, body)

    async def _raw_token(self, token: bytes) -> Answer:
        """SaslHandshake v0: the client's token in a bare frame, answered with a bare frame; a failure closes."""
        assert self._exchange is not None
        step = await offload.run(self._exchange.step, token)
        if step.done and await self._finish(step) is not None:
            return Answer(apis.SASL_AUTHENTICATE, None, close="authentication_failed")
        if step.done:
            self._raw_tokens = False
        return Answer(apis.SASL_AUTHENTICATE, [step.reply])

    async def _finish(self, step: ServerStep) -> str | None:
        """The exchange is over: take the login, or say why not (after the failure delay)."""
        exchange, self._exchange = self._exchange, None
        self._raw_tokens = False
        assert exchange is not None
        mechanism = exchange.mechanism
        error = step.error
        if error is None and self.authenticated and step.principal != self.principal:
            error = f"the principal may not change on re-authentication ({self.principal} to {step.principal})"
        # Carried to the brokers, credentials are taken once a broker took them: at login and at each
        # re-authentication, before the answer (else a wrong password would be answered with success).
        carried = step.credentials
        if error is None and self.config.carry_identity and self._confirm is not None:
            if carried is None and self._mint is not None and step.principal is not None:
                # SCRAM: nothing to replay; the brokers take a delegation token of the principal's instead.
                minted = await self._mint(step.principal, mechanism)
                carried, error = (None, minted) if isinstance(minted, str) else (minted, None)
            if error is not None:
                pass
            elif carried is None:
                error = f"{mechanism} credentials cannot be carried to the brokers"
            else:
                self._candidate = carried
                try:
                    refused = await self._confirm(carried)
                finally:
                    self._candidate = None
                if refused is not None:
                    error = f"the brokers refused the credentials: {refused}"
        if error is not None:
            # A failed re-authentication ends the login too: nothing more is served on this connection.
            self.principal = self.credentials = None
            self._failed = True
            metrics.AUTHENTICATIONS.labels(mechanism, "failed").inc()
            who = f"User:{printable(exchange.claimed)}" if exchange.claimed else "no user name"
            log.warning("%s: authentication failed (%s, %s): %s", self.client, mechanism, who, printable(error, 256))
            await trio.sleep(self.config.failure_delay)
            return error
        again = self.authenticated
        self.principal, self.mechanism, self.credentials = step.principal, mechanism, carried
        self.expires_at = self._session_end(step)
        metrics.AUTHENTICATIONS.labels(mechanism, "reauthenticated" if again else "ok").inc()
        log.info(
            "%s: %s as User:%s (%s)", self.client, "re-authenticated" if again else "authenticated", printable(self.principal), mechanism
        )
        if again and self._on_login is not None:
            self._on_login()
        return None

    def _session_end(self, step: ServerStep) -> float:
        """As Kafka's connections.max.reauth.ms: no lifetime configured, no end; else that, or the token's expiry if sooner."""
        lifetime = self.config.session_lifetime
        if lifetime <= 0:
            return math.inf
        if step.expires_at is not None:
            lifetime = min(lifetime, max(0.0, step.expires_at - time.time()))
        return trio.current_time() + lifetime

    def _answer(self, hdr: Any, body: dict[str, Any], close: str | None = None) -> Answer:
        spec = response_spec(hdr.api_key, hdr.api_version)
        parts = [response_header(hdr.api_key, hdr.api_version, hdr.correlation_id), *encode_body(spec, {**spec.blank(), **body})]
        return Answer(hdr.api_key, parts, close)


def _label(mechanism: str) -> str:
    """A mechanism as a metric label: a client's made-up names must not grow the label set."""
    return mechanism if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER") else "other"
