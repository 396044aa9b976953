"""The process's open client connections: what a graceful stop drains, and waits for (trio).

:meth:`Connections.track` holds a connection in the set while it runs;
:meth:`Connections.wait_empty` returns once none is open.

Boundaries: it only counts and lists connections. Refusing connections past
``--max-connections`` is admission's (:mod:`.admission`); draining one is the
connection's own (:meth:`proxy.server.connection.ClientConnection.drain`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import trio

if TYPE_CHECKING:
    from proxy.server.connection import ClientConnection


class Connections:
    """The open client connections."""

    def __init__(self) -> None:
        self._open: set[ClientConnection] = set()
        self._empty = trio.Event()  # set while no connection is open
        self._empty.set()
        # A graceful stop is draining every connection. One accepted before the stop but counted only after it
        # began (a TLS handshake comes first) is drained as it is counted: else the stop waits out its timeouts.
        self.draining = False

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[ClientConnection]:
        return iter(list(self._open))

    def add(self, conn: ClientConnection) -> None:
        if self._empty.is_set():
            self._empty = trio.Event()
        self._open.add(conn)
        if self.draining:
            conn.drain()

    def discard(self, conn: ClientConnection) -> None:
        self._open.discard(conn)
        if not self._open:
            self._empty.set()

    @contextmanager
    def track(self, conn: ClientConnection) -> Iterator[ClientConnection]:
        """Count ``conn`` as open for the duration of the ``with`` block."""
        self.add(conn)
        try:
            yield conn
        finally:
            self.discard(conn)

    async def wait_empty(self) -> None:
        """Return once no connection is open (at once if none is)."""
        while self._open:
            await self._empty.wait()
