"""A broker's answer kfan could not decode: counted, and logged at most once per interval.

The merge has already made it a retriable error for that broker's part of the
request (:mod:`proxy.core.undecodable`); what is left is to tell the
operator, who otherwise sees only clients retrying. A broker that babbles
does so at every request, so the lines are limited as the other broker
failure lines are (:class:`backends.backoff.FailureLog`: one per broker and
API per interval, with the count of those left out); the counter counts
every one.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from proxy.core.plan import Answers, Destination, Failed, Response
from proxy.core.undecodable import Noted
from proxy.kafka.apis import api_name
from proxy.kafka.headers import RequestHeader
from proxy.runtime import metrics

from . import backoff
from .link import Pending

log = logging.getLogger("kfan.link")

# The decoder's reason is kfan's own text, but it may quote a length or a
# string it read: kept short, so a line stays a line.
_MAX_REASON_CHARS = 200


def report(broker: int, api_key: int, api_version: int, reason: str) -> None:
    """``broker``'s answer to an ``api_key`` v``api_version`` request did not decode, for ``reason``."""
    api = api_name(api_key)
    metrics.BROKER_ANSWERS_UNDECODABLE.labels(str(broker), api).inc()
    left_out = backoff.failure_log().note(("undecodable", broker, api_key))
    if left_out is not None:
        log.warning(
            "broker %s answered %s v%s with bytes kfan cannot decode (%s): the client got a retriable error for that broker's part%s",
            broker,
            api,
            api_version,
            reason[:_MAX_REASON_CHARS],
            backoff.left_out(left_out),
        )


def report_undecodable(header: RequestHeader, answers: Answers, handles: Mapping[Destination, Pending | Failed], noted: Noted) -> None:
    """Report each answer a merge noted (:func:`proxy.core.undecodable.collect`), by the broker its handle went to."""
    for destination, answer in answers.items():
        if not isinstance(answer, Response):
            continue
        reason = next((why for payload, why in noted if payload is answer.payload), None)
        if reason is None:
            continue
        handle = handles.get(destination)
        broker = handle.broker if isinstance(handle, Pending) else destination if isinstance(destination, int) else -1
        report(broker, header.api_key, header.api_version, reason)
