"""kfan's accept loop: trio's ``serve_listeners``, with waits and lines an operator can live with at the descriptor limit.

When accept(2) fails for lack of descriptors or kernel memory (EMFILE, ENFILE,
ENOMEM, ENOBUFS), trio's loop logs an ERROR with a traceback and tries again
every 0.1 s: at the limit, ten tracebacks a second bury every other line, for
as long as the limit lasts. Here the wait doubles from 0.1 s up to 1 s while
accepting keeps failing (a success resets it), and the failures are logged as
broker failures are (:class:`backends.backoff.FailureLog`): one WARNING line
per interval, without a traceback (it is the same each time), saying how many
were left out. The connections waiting meanwhile sit in the listen backlog;
one line says when accepting works again.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import trio

from backends.backoff import FAILURE_LOG_INTERVAL_S, FailureLog, left_out
from proxy.runtime import metrics

log = logging.getLogger("kfan.server")

# The errors trio's own loop waits out (its ACCEPT_CAPACITY_ERRNOS): the process or
# the system is out of something that frees up; any other error ends the loop.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
FIRST_WAIT_S = 0.1  # trio's one wait
MAX_WAIT_S = 1.0

Handler = Callable[[Any], Awaitable[object]]


async def serve_listeners(
    handler: Handler, listeners: list[trio.SocketListener], *, handler_nursery: trio.Nursery, log_interval: float = FAILURE_LOG_INTERVAL_S
) -> NoReturn:
    """Accept on every listener until cancelled, each connection served by ``handler`` in ``handler_nursery``."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(serve_listener, handler, listener, handler_nursery, log_interval)
    raise AssertionError("the accept loops never end but by cancellation")  # pragma: no cover


async def serve_listener(
    handler: Handler, listener: trio.abc.Listener[Any], handler_nursery: trio.Nursery, log_interval: float
) -> NoReturn:
    failures = FailureLog(interval=log_interval, clock=trio.current_time)
    wait = FIRST_WAIT_S
    failed, since = 0, 0.0  # accepts failed in a row, and when the first of them did
    async with listener:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in CAPACITY_ERRNOS:
                    raise
                if not failed:
                    since = trio.current_time()
                failed += 1
                if (count := failures.note(e.errno)) is not None:
                    log.warning(
                        "cannot accept client connections: %s (%s)%s; trying again in %.1f s (new connections wait in the "
                        "listen backlog meanwhile): raise the open files limit or lower --max-connections",
                        errno.errorcode.get(e.errno, e.errno),
                        os.strerror(e.errno) if e.errno is not None else e,
                        left_out(count),
                        wait,
                    )
                await trio.sleep(wait)
                wait = min(wait * 2, MAX_WAIT_S)
                continue
            if failed:
                log.info("accepting client connections again, after %d failed attempts over %.1f s", failed, trio.current_time() - since)
                failed, wait = 0, FIRST_WAIT_S
            handler_nursery.start_soon(_run_handler, stream, handler)


async def _run_handler(stream: trio.abc.AsyncResource, handler: Handler) -> None:
    try:
        await handler(stream)
    finally:
        await trio.aclose_forcefully(stream)


async def listen(host: str, port: int, reuse_port: bool, flag: str = "--listen") -> trio.SocketListener:
    """A listening socket; with ``reuse_port`` several processes share the port and the kernel spreads connections.

    An address that cannot be bound is :class:`~proxy.runtime.metrics.ListenFailed`: the CLI says so in one line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        await sock.bind((host, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        raise metrics.ListenFailed(f"cannot listen on {host}:{port} ({flag}): {e}") from None
    return trio.SocketListener(sock)
