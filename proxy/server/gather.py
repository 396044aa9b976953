"""Waiting for a request's answers from its brokers (trio).

:func:`gather` waits for every answer up to one deadline. :func:`gather_fetch`
drives the pure :class:`proxy.core.fetch_wait.FetchWait`, which decides when a
Fetch is answered: this module only feeds it answers and wake-ups, and sends
again what it says to ask again.

Boundaries: what it learns on the way (the watermarks of answers asked again)
it returns with the answers; it keeps nothing and tells no one else.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import NamedTuple

import trio

from backends.link import Pending
from proxy.core import BrokerAnswer, Destination, Failed, Watermarks
from proxy.core.fetch_wait import FetchWait
from proxy.core.layout import TopicPartition

# A broker's Fetch answer may lag its max_wait by the network; past this, kfan
# answers the client without it.
FETCH_GRACE = 0.02

# A request's sub-requests by destination: the answer to come, or why none will.
Handles = dict[Destination, Pending | Failed]
# Waits for one pending answer and reads it as a BrokerAnswer (never raises a link's failure).
Receive = Callable[[Destination, Pending], Awaitable[BrokerAnswer]]
# Sends one sub-fetch again; None when it cannot be sent.
Resend = Callable[[Destination], Pending | None]


class Gathered(NamedTuple):
    """What a request's brokers answered: the answers, the handles last used (a Fetch may ask again), and the
    watermarks learned on the way (of the answers a Fetch asked again)."""

    answers: dict[Destination, BrokerAnswer]
    handles: Handles
    watermarks: dict[TopicPartition, Watermarks]


async def gather(
    handles: Mapping[Destination, Pending | Failed], receive: Receive, deadline: float
) -> tuple[dict[Destination, BrokerAnswer], set[Destination]]:
    """The answers in by ``deadline``, and the destinations still out then."""
    answers: dict[Destination, BrokerAnswer] = {d: h for d, h in handles.items() if isinstance(h, Failed)}
    outstanding = {d for d, h in handles.items() if not isinstance(h, Failed)}
    if len(outstanding) == 1:
        # One broker asked (most requests): wait for it here, without a task and a channel hop per answer.
        (d,) = outstanding
        handle = handles[d]
        assert isinstance(handle, Pending)
        with trio.move_on_at(deadline):
            answers[d] = await receive(d, handle)
            outstanding.clear()
        return answers, outstanding
    send, arrivals = trio.open_memory_channel[tuple[Destination, BrokerAnswer]](math.inf)
    async with trio.open_nursery() as nursery:
        for d in outstanding:
            nursery.start_soon(_deliver, receive, d, handles[d], send)
        with trio.move_on_at(deadline):
            while outstanding:
                d, answer = await arrivals.receive()
                answers[d] = answer
                outstanding.discard(d)
        nursery.cancel_scope.cancel()
    return answers, outstanding


async def gather_fetch(wait: FetchWait, handles: Mapping[Destination, Pending | Failed], receive: Receive, resend: Resend) -> Gathered:
    """A Fetch's answers as :class:`FetchWait` decides (NOT_YET for those still out), the handles last used,
    and the watermarks of the answers it asked again (for the connection to remember)."""
    current = dict(handles)
    send, arrivals = trio.open_memory_channel[tuple[Destination, BrokerAnswer]](math.inf)
    async with trio.open_nursery() as nursery:
        for d in wait.outstanding:
            nursery.start_soon(_deliver, receive, d, handles[d], send)
        while (wake := wait.wake_at(trio.current_time())) is not None:
            with trio.move_on_at(wake):
                d, answer = await arrivals.receive()
                again = wait.answered(d, answer, trio.current_time())
                if again is None:
                    continue
                pending = resend(d)
                if pending is None:
                    wait.keep(d, answer)
                    continue
                current[d] = pending
                wait.asked_again(d)
                nursery.start_soon(_deliver, receive, d, pending, send)
        nursery.cancel_scope.cancel()
    return Gathered(wait.final(), current, wait.learned)


async def _deliver(
    receive: Receive, destination: Destination, handle: Pending | Failed, send: trio.MemorySendChannel[tuple[Destination, BrokerAnswer]]
) -> None:
    assert isinstance(handle, Pending)
    send.send_nowait((destination, await receive(destination, handle)))
