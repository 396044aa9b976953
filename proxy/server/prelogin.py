"""What a client may make kfan hold before it has logged in.

A broker with a SASL listener allows an unauthenticated client little: frames
up to ``sasl.server.max.receive.size`` (512 KiB), and nothing else until the
login is done. kfan does the same, and more, because anyone who can reach its
port can open a connection: a connection not logged in yet

- reads frames of at most ``max_receive_bytes`` (the full ``max_frame_bytes``
  only once logged in),
- must log in within ``timeout`` seconds of its accept,
- holds its bytes in a pool of its own (``max_bytes``), so unauthenticated
  clients together cannot fill the pool that logged-in clients share,
- counts against a cap on connections not logged in per client address.

"Logged in" means: the SASL login succeeded (``--client-auth sasl``), else the
TLS handshake is done (a TLS listener), else the connection was accepted.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass

import trio

from proxy.runtime import metrics
from proxy.runtime.budget import MemoryPool

log = logging.getLogger("kfan.connection")


@dataclass(frozen=True)
class PreLoginLimits:
    max_receive_bytes: int = 512 * 1024  # Kafka's sasl.server.max.receive.size
    timeout: float = 10.0  # from accept to a completed login
    max_per_address: int = 64  # connections not logged in yet, per client address
    max_bytes: int = 32 * 1024 * 1024  # held by all connections not logged in yet


class PreLogin:
    """The process's connections that have not logged in yet: their count per address and their memory pool."""

    def __init__(self, limits: PreLoginLimits) -> None:
        self.limits = limits
        self.pool = MemoryPool(limits.max_bytes)
        self._by_address: Counter[str] = Counter()
        self._refused_logged_at = -math.inf

    def admit(self, address: str) -> Admitted | None:
        """A place for one more connection from ``address``; None (logged, at most every 10 s) when over the cap."""
        if self._by_address[address] >= self.limits.max_per_address:
            metrics.CLIENT_CLOSES.labels("unauthenticated_per_address").inc()
            now = trio.current_time()
            if now - self._refused_logged_at >= 10:  # a connection storm must not flood the log
                self._refused_logged_at = now
                log.warning(
                    "refusing client connections from %s: %d not logged in yet, the limit (--max-unauthenticated-per-address)",
                    address,
                    self.limits.max_per_address,
                )
            return None
        self._by_address[address] += 1
        return Admitted(self, address)

    def leave(self, address: str) -> None:
        """A connection from ``address`` logged in, or ended before it did."""
        self._by_address[address] -= 1
        if self._by_address[address] <= 0:
            del self._by_address[address]


def host_of(peer: str) -> str:
    """The address part of "host:port" (IPv6 hosts keep their colons)."""
    host, sep, _ = peer.rpartition(":")
    return host if sep else peer


class Admitted:
    """One connection's place among those not logged in yet; it leaves once (logged in, or gone)."""

    def __init__(self, prelogin: PreLogin, address: str) -> None:
        self.prelogin = prelogin
        self.address = address
        self.deadline = trio.current_time() + prelogin.limits.timeout
        self.left = False

    def leave(self) -> None:
        if not self.left:
            self.left = True
            self.prelogin.leave(self.address)
