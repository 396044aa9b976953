"""A client connection's answers out, in request order, each under its deadline (trio).

The writer takes each answered slot from the connection's
:class:`~proxy.server.ordering.ResponseOrderer` and writes it, or, while it
waits, has the order write a small answer to a plain socket where it was
answered (``write_now``: nothing to wait for, so no deadline); a client that
does not read an answer within ``frame_timeout`` is closed; an answer that
ends the connection is written first and the client given ``CLOSE_LINGER`` to
leave; a client over a quota whose version does not throttle itself gets its
answer late. The connection (:mod:`.connection`) acts on :class:`Closing`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from proxy.kafka.frames import MAPPED_FROM
from proxy.runtime import metrics
from proxy.runtime.budget import Budget
from proxy.runtime.frame_io import send_frame, send_rest, send_small_now
from proxy.runtime.reclaim import release_later
from proxy.server.limits import Limits
from proxy.server.ordering import ResponseOrderer, ResponseSlot
from proxy.server.quotas import ClientThrottle
from proxy.server.receiver import CLOSE_LINGER, Closing, Receiver

log = logging.getLogger("kfan.connection")


async def write_answers(
    orderer: ResponseOrderer,
    stream: trio.abc.Stream,
    limits: Callable[[], Limits],
    receiver: Receiver,
    budget: Budget,
    throttle: ClientThrottle | None,
    client: int,
    scope: trio.CancelScope,
) -> None:
    """Until the reader is done and every answer is written (then ``scope`` is cancelled); ``limits``: as they are now."""

    def sent(n: int) -> None:
        receiver.last_active = trio.current_time()  # idle counts from the last byte either way
        metrics.count(metrics.BYTES, ("client_out",), n)

    def written(slot: ResponseSlot, n: int) -> None:
        if slot.parts is not None:
            sent(n)
        metrics.observe(metrics.CLIENT_LATENCY, (slot.api_key,), trio.current_time() - slot.started)
        budget.release(slot.size)
        if slot.size >= MAPPED_FROM:
            release_later(slot.parts)  # the brokers' answers it holds are let go of off the event loop
            slot.parts = None

    def write_now(slot: ResponseSlot) -> bool:
        """Where it was answered, while the writer waits: a small answer the socket takes at once."""
        if slot.close is not None or slot.close_after is not None or slot.hold:
            return False
        if slot.parts is None:
            written(slot, 0)  # acks=0: nothing to write
            return True
        now = send_small_now(stream, slot.parts)
        if now is None:
            return False  # too large, or a broken socket the writer meets and ends the connection on
        if now[1]:
            slot.rest = now  # the writer sends the rest, under its deadline
            return False
        written(slot, now[0])
        return True

    orderer.write_now = write_now
    try:
        while (slot := await orderer.next_answered()) is not None:
            if slot.close is not None:
                raise Closing(slot.close)
            if slot.hold and throttle is not None:
                # Over a quota, a client of a version that does not wait on its own gets its answer that much
                # later (the requests behind it wait already: the reader reads nothing before then).
                await trio.sleep_until(throttle.until)
            n = 0
            if slot.parts is not None:
                # A client that stops reading its answers must not hold them (and us) for ever.
                now = slot.rest or send_small_now(stream, slot.parts)
                if now is not None and not now[1]:
                    n = now[0]  # taken whole at once: no deadline needed
                else:
                    timeout = limits().frame_timeout
                    with trio.move_on_after(timeout) as writing:
                        n = await (send_frame(stream, slot.parts) if now is None else send_rest(stream, *now))
                    if writing.cancelled_caught:
                        log.warning("client %s: did not read a response within %.0f s, closing", client, timeout)
                        raise Closing("frame_timeout")
            if slot.close_after is not None:
                # Let the client read the answer and leave first (the reader still sees its EOF,
                # and refuses anything else it sends): closing under an answer in flight lets
                # some clients lose it to a reset or an unannounced TLS end.
                if slot.parts is not None:
                    sent(n)
                await trio.sleep(CLOSE_LINGER)
                raise Closing(slot.close_after)
            written(slot, n)
    finally:
        orderer.write_now = None  # nothing is written past the writer's end
    # The client closed its side and every response is written.
    scope.cancel()
