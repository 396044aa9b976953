"""Delegation tokens (KIP-48, KIP-373) kfan makes for its clients' principals, over its own control links.

With ``--broker-identity client`` a client that logs in to kfan with SCRAM cannot have its login replayed to the
brokers (SCRAM proves a password without sending it). kfan then creates a delegation token owned by the client's
principal (kfan's own principal needs the CreateTokens permission on that user, KIP-373) and the client's links
log in with it (SCRAM with the token's id and HMAC, ``tokenauth=true``): the brokers see the client as itself.
kfan renews the token while the client stays and expires it when the client leaves.

Boundaries: the three requests and what their answers say; when to make, renew or expire a token is the
client connection's (:mod:`proxy.server.token_identity`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import trio

from proxy.kafka import apis, errors
from proxy.kafka.headers import decode_response

from .control import ControlLinks
from .coordinators import ANSWER_FAILURES

# Kafka's error codes for delegation tokens.
TOKEN_ERRORS = {
    errors.REQUEST_TIMED_OUT: "the broker could not reach the controller in time",
    errors.NOT_CONTROLLER: "the broker asked was not the controller",
    errors.DELEGATION_TOKEN_AUTH_DISABLED: "delegation tokens are not enabled at the brokers (delegation.token.secret.key)",
    errors.DELEGATION_TOKEN_NOT_FOUND: "the token is not found",
    errors.DELEGATION_TOKEN_OWNER_MISMATCH: "kfan is neither the token's owner nor a renewer",
    errors.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED: "delegation token requests are not allowed on kfan's connection to the brokers (it must log in with SASL)",
    errors.DELEGATION_TOKEN_AUTHORIZATION_FAILED: "kfan's principal may not create tokens for this user (it needs CreateTokens on the User resource, KIP-373)",
    errors.DELEGATION_TOKEN_EXPIRED: "the token expired",
}
CREATE_VERSION, RENEW_VERSION, EXPIRE_VERSION, DESCRIBE_VERSION = 3, 2, 2, 3


@dataclass(frozen=True)
class Token:
    token_id: str
    hmac: bytes
    expiry_ms: int  # when it expires unless renewed (epoch milliseconds)


# What a broker answers when it could not reach the controller in time (a token request is forwarded there):
# the request may succeed when asked again.
PASSING = frozenset({errors.REQUEST_TIMED_OUT, errors.NETWORK_EXCEPTION, errors.NOT_CONTROLLER})


class TokenRefused(Exception):
    """The brokers would not make, renew or expire the token: why, in words; ``code`` is Kafka's error code
    (None: no broker answered)."""

    def __init__(self, why: str, code: int | None = None) -> None:
        super().__init__(why)
        self.code = code

    @property
    def passing(self) -> bool:
        """Whether asking again may succeed: no broker answered, or the one that did could not reach the controller."""
        return self.code is None or self.code in PASSING


async def create_token(control: ControlLinks, brokers: Iterable[int], owner: str, renewer: str | None) -> Token:
    """A token owned by ``owner`` (a user name), renewable by kfan's principal ``renewer`` when given."""
    body = {
        "owner_principal_type": "User",
        "owner_principal_name": owner,
        "renewers": [] if renewer is None else [{"principal_type": "User", "principal_name": renewer}],
        "max_lifetime": -1,
    }
    answer = await _ask(control, brokers, apis.CREATE_DELEGATION_TOKEN, CREATE_VERSION, body)
    return Token(answer["token_id"], bytes(answer["hmac"]), answer["expiry_timestamp"])


async def known_everywhere(control: ControlLinks, brokers: Iterable[int], owner: str, token: Token, within: float) -> bool:
    """Whether every broker knows ``token`` within ``within`` seconds: the controller makes it, and each broker
    learns it from the metadata log a moment later; a link logging in with it before then is refused."""
    body = {"owners": [{"principal_type": "User", "principal_name": owner}]}
    with trio.move_on_after(within):
        for broker in brokers:
            while True:
                try:
                    answer = decode_response(
                        await control.call(broker, apis.DESCRIBE_DELEGATION_TOKEN, DESCRIBE_VERSION, body),
                        apis.DESCRIBE_DELEGATION_TOKEN,
                        DESCRIBE_VERSION,
                    )
                except ANSWER_FAILURES:
                    break  # that broker is down: it learns the token when it comes back
                if any(t["token_id"] == token.token_id for t in answer["tokens"] or ()):
                    break
                await trio.sleep(0.05)
        return True
    return False


async def renew_token(control: ControlLinks, brokers: Iterable[int], hmac: bytes) -> int:
    """Renewed for the brokers' default period; the new expiry (epoch milliseconds)."""
    answer = await _ask(control, brokers, apis.RENEW_DELEGATION_TOKEN, RENEW_VERSION, {"hmac": hmac, "renew_period": -1})
    return int(answer["expiry_timestamp"])


async def expire_token(control: ControlLinks, brokers: Iterable[int], hmac: bytes) -> None:
    """Expired now: no link can log in with it any more."""
    await _ask(control, brokers, apis.EXPIRE_DELEGATION_TOKEN, EXPIRE_VERSION, {"hmac": hmac, "expiry_time_period": -1})


async def _ask(control: ControlLinks, brokers: Iterable[int], api: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """The first broker's answer that says something (any broker forwards these to the controller)."""
    failures = []
    for broker in brokers:
        try:
            answer = decode_response(await control.call(broker, api, version, body), api, version)
        except ANSWER_FAILURES as e:
            failures.append(f"broker {broker}: {e}")
            continue
        code = answer["error_code"]
        if code != 0:
            raise TokenRefused(TOKEN_ERRORS.get(code, f"error {code}"), code)
        return answer
    raise TokenRefused("no broker answered: " + "; ".join(failures) if failures else "no broker is known")
