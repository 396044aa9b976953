"""How kfan reaches a broker: TCP or TLS (the certificate checked against
the broker's advertised host, or one configured name), then its SASL login;
and how that opening ended, told to the reconnect backoff (:func:`settle`).

One :class:`BrokerSecurity` serves the bootstrap connection, the control
plane and every client connection's links. With ``--broker-identity client``
a client connection's links log in with that client's credentials instead of
kfan's (:meth:`BrokerSecurity.login` takes them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from proxy.runtime import metrics
from proxy.security.sasl import Credentials
from proxy.security.tls import BrokerTLS

from . import backoff
from .link import Authenticate, Link
from .sasl import AuthenticationFailed, SaslLogin

Credentials_ = Callable[[], Credentials]


@dataclass(frozen=True)
class BrokerSecurity:
    tls: BrokerTLS | None = None
    server_name: str | None = None  # checked instead of each broker's advertised host
    credentials: Credentials_ | None = None  # kfan's own SASL identity; None: no SASL

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        async with backoff.connecting((host, port)):
            tcp = await trio.open_tcp_stream(host, port)
        if self.tls is None:
            return tcp
        stream = trio.SSLStream(tcp, self.tls.context(), server_hostname=self.server_name or host)
        try:
            await stream.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(tcp)
            raise
        return stream

    def login(self, broker: int, credentials: Credentials_ | None = None) -> Authenticate | None:
        """A link's login: with ``credentials`` (a client's own), else kfan's; None without SASL."""
        chosen = credentials if credentials is not None else self.credentials
        return None if chosen is None else SaslLogin(broker, chosen)


async def settle(attempt: backoff.Attempt, link: Link) -> None:
    """Tell ``attempt`` how ``link``'s opening ended (a task beside the link's own).

    Ready (connected, and logged in if it logs in) resets the backoff, as
    Kafka's clients reset it once a connection is ready; failing before that
    grows it; a login the broker refused changes nothing (it is the
    credentials' failure, not the broker's).
    """
    result = "abandoned"
    try:
        await link.ready.wait()
        if link.failed is None:
            result = "ok"
            attempt.connected()
        elif isinstance(link.failed, AuthenticationFailed):
            result = "login_refused"
        else:
            result = "failed"
            attempt.failed()
    finally:
        attempt.abandoned()  # no-op once it has ended; else the link was cancelled (its client left)
        metrics.BROKER_CONNECTS.labels(str(link.broker_id), result).inc()
