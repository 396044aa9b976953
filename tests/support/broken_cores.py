"""Deliberately broken cores, to check that the replay checks catch what they claim to.

Each wraps kfan's own (:data:`spark.checks.DEFAULT_CORE`) and breaks one
thing: the split (a partition left out), the framing (a size prefix added
twice) or the merge (the brokers' answers swapped). Module-level functions,
so a :class:`~spark.checks.Core` made of them pickles for Spark's executors
(which import this module: the project root is on their path in local mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from proxy.capture.rows import CaptureRow
from proxy.kafka import schema
from proxy.kafka.frames import frame
from proxy.kafka.headers import decode_request
from spark.checks import DEFAULT_CORE, Core, RecordedAnswers, Replanned, layouts


def _drop_partition(row: CaptureRow, watermarks: Mapping[Any, Any]) -> Replanned:
    """The broken split: the client's last partition is left out of the sub-requests (the merge is the whole request's)."""
    whole = DEFAULT_CORE.replan(row, watermarks)
    found = layouts(row.api_key, row.api_version)
    assert found is not None, "the checks replan only partition-keyed requests"
    req_layout, _ = found
    hdr, body = decode_request(row.request)
    for t in reversed(body[req_layout.topics]):
        if len(t[req_layout.partitions]) > 0:
            t[req_layout.partitions] = t[req_layout.partitions][:-1]
            break
    else:
        return whole
    spec = schema.request_spec(hdr.api_key, hdr.api_version)
    shortened = row.request[: hdr.body_offset] + b"".join(bytes(p) for p in schema.encode_body(spec, body))
    return Replanned(DEFAULT_CORE.replan(dataclasses.replace(row, request=shortened), watermarks).subrequests, whole.merge)


def _double_prefix(row: CaptureRow, watermarks: Mapping[Any, Any]) -> Replanned:
    """The broken framing: every sub-request framed twice."""
    whole = DEFAULT_CORE.replan(row, watermarks)
    return Replanned({d: frame([wire]) for d, wire in whole.subrequests.items()}, whole.merge)


def _swap_responses(row: CaptureRow, watermarks: Mapping[Any, Any]) -> Replanned:
    """The broken merge: each broker's answer taken for the next broker's."""
    whole = DEFAULT_CORE.replan(row, watermarks)
    merge = whole.merge
    if merge is None:
        return whole

    def swapped(answers: RecordedAnswers) -> bytes:
        keys = list(answers)
        return merge(dict(zip(keys, [answers[k] for k in keys[1:] + keys[:1]], strict=True)))

    return Replanned(whole.subrequests, swapped)


BROKEN_CORES = {
    "drop-partition": Core("drop-partition", _drop_partition),
    "double-prefix": Core("double-prefix", _double_prefix),
    "swap-responses": Core("swap-responses", _swap_responses),
}
