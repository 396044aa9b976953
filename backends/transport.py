"""How kfan reaches a broker: TCP or TLS (the certificate checked against
the broker's advertised host, or one configured name), then its SASL login.

One :class:`BrokerSecurity` serves the bootstrap connection, the control
plane and every client connection's links. With ``--broker-identity client``
a client connection's links log in with that client's credentials instead of
kfan's (:meth:`BrokerSecurity.login` takes them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio

from proxy.security.sasl import Credentials
from proxy.security.tls import BrokerTLS

from .link import Authenticate
from .sasl import SaslLogin

Credentials_ = Callable[[], Credentials]


@dataclass(frozen=True)
class BrokerSecurity:
    tls: BrokerTLS | None = None
    server_name: str | None = None  # checked instead of each broker's advertised host
    credentials: Credentials_ | None = None  # kfan's own SASL identity; None: no SASL

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
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
