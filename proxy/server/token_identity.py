"""A SCRAM client's identity carried to the brokers as a delegation token (trio), with ``--broker-identity client``.

kfan checks a SCRAM login itself (its users file) but cannot replay it: SCRAM sends a proof, not a password. So
once the client has proved who it is, kfan asks the brokers for a delegation token owned by that principal
(:mod:`backends.tokens`), and the client's links log in with it: SCRAM with the token's id and HMAC and
``tokenauth=true``, which the brokers' authorizer sees as the owner. The token is renewed while the client
stays (at three quarters of its time left) and expired when it leaves; one token per connection, made at its
first login and kept through its re-authentications.

Boundaries: when the session asks for credentials (:class:`proxy.server.client_auth.ClientSession`), it
answers; the requests themselves are :mod:`backends.tokens`'.
"""

from __future__ import annotations

import base64
import logging
import math
import time

import trio

from backends.cluster import Cluster
from backends.tokens import Token, TokenRefused, create_token, expire_token, known_everywhere, renew_token
from proxy.kafka import errors
from proxy.runtime.logtext import printable
from proxy.security.sasl import Credentials

log = logging.getLogger("kfan.auth")

# How long expiring a token may keep a closed connection's task (it goes anyway when its time is up, unrenewed),
# and how often it is asked again meanwhile when a broker could not reach the controller.
EXPIRE_WITHIN_S = 15.0
EXPIRE_RETRY_S = 0.5
RENEW_RETRY_S = 10.0
TOKEN_KNOWN_WITHIN_S = 10.0  # how long a new token may take to reach every broker before the client is logged in anyway


def worth_expiring_again(refused: TokenRefused, made_ago: float) -> bool:
    """Whether an expiry the brokers refused may succeed when asked again: a passing refusal, or a token "not found"
    just after it was made. The controller judges an expiry by its own token cache, which learns a new token only
    when the metadata log's change is published to it, a moment after the token was made (the brokers may know it
    before then)."""
    new = made_ago < TOKEN_KNOWN_WITHIN_S
    return refused.passing or (new and refused.code == errors.DELEGATION_TOKEN_NOT_FOUND)


class TokenIdentity:
    """The delegation token one client connection's links log in with."""

    def __init__(self, cluster: Cluster, client: str) -> None:
        self.cluster = cluster
        self.client = client  # for the log
        kfan = cluster.security.credentials
        # kfan's own user name at the brokers, when it has one (an OAUTHBEARER token has none): it renews and expires.
        self.renewer = (kfan().username or None) if kfan is not None else None
        self.token: Token | None = None
        self.made_at = -math.inf  # trio time the token was made at
        self.nursery: trio.Nursery | None = None  # the connection's, once it runs: the renewals run there

    def _brokers(self) -> list[int]:
        reachable = [b for b, up in self.cluster.reachable.items() if up]
        return reachable or list(self.cluster.topology.brokers)

    async def credentials(self, principal: str, mechanism: str) -> Credentials | str:
        """The links' credentials for ``principal`` (a token made now, or the one made at the first login); or why none."""
        if self.token is None:
            try:
                self.token = await create_token(self.cluster.control, self._brokers(), principal, self.renewer)
                self.made_at = trio.current_time()
            except TokenRefused as e:
                return f"no delegation token for User:{printable(principal)}: {e}"
            log.info("%s: delegation token %s made for User:%s", self.client, self.token.token_id, printable(principal))
            if not await known_everywhere(self.cluster.control, self._brokers(), principal, self.token, TOKEN_KNOWN_WITHIN_S):
                log.warning(
                    "%s: delegation token %s not known to every broker within %.0f s",
                    self.client,
                    self.token.token_id,
                    TOKEN_KNOWN_WITHIN_S,
                )
            if self.nursery is not None:
                self.nursery.start_soon(self._renew)
        password = base64.b64encode(self.token.hmac).decode()
        return Credentials(mechanism, self.token.token_id, password, token_auth=True)

    async def _renew(self) -> None:
        while self.token is not None:
            left = self.token.expiry_ms / 1000 - time.time()
            await trio.sleep(max(1.0, left * 0.75) if math.isfinite(left) else RENEW_RETRY_S)
            if self.token is None:
                return
            try:
                expiry = await renew_token(self.cluster.control, self._brokers(), self.token.hmac)
            except TokenRefused as e:
                log.warning("%s: delegation token %s not renewed: %s", self.client, self.token.token_id, e)
                await trio.sleep(RENEW_RETRY_S)
                continue
            self.token = Token(self.token.token_id, self.token.hmac, expiry)

    async def expire(self) -> None:
        """The client left: its token goes too (shielded, within :data:`EXPIRE_WITHIN_S`). A broker that could not
        reach the controller in time is asked again, and so is a controller that does not know a new token yet: a
        token left behind would stay valid until it lapses."""
        token, self.token = self.token, None
        if token is None:
            return
        why = "no broker answered"
        with trio.CancelScope(shield=True), trio.move_on_after(EXPIRE_WITHIN_S) as deadline:
            while True:
                try:
                    await expire_token(self.cluster.control, self._brokers(), token.hmac)
                except TokenRefused as e:
                    why = str(e)
                    if not worth_expiring_again(e, trio.current_time() - self.made_at):
                        break
                    await trio.sleep(EXPIRE_RETRY_S)
                    continue
                log.info("%s: delegation token %s expired", self.client, token.token_id)
                return
        # Refused, or not done in time: it lapses by itself at its expiry time.
        if deadline.cancelled_caught:
            why = f"not done within {EXPIRE_WITHIN_S:g} s (last: {why})"
        log.warning("%s: delegation token %s not expired: %s", self.client, token.token_id, printable(why, 256))
