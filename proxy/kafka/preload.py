"""Load the message schemas of given API versions now, rather than at their first request.

kio's schemas are Python modules imported on first use, and the codec built
from one is compiled then (:func:`~proxy.kafka.schema.request_spec`,
:func:`~proxy.kafka.schema.response_spec`). Importing opens files: a process
at its descriptor limit failed the first request of any version no client had
used yet (the connection closed on EMFILE). Loading every version kfan
advertises as soon as it knows them costs a second or two of CPU once, and no
descriptor afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import schema


def preload(versions: Mapping[int, tuple[int, int]]) -> int:
    """Load the request and response codecs of every version in ``versions`` (api key -> (min, max));
    how many were not loaded before. Safe in a worker thread: the codec caches take concurrent callers."""
    before = _loaded()
    for api_key, (lo, hi) in versions.items():
        known = schema.known_versions(api_key)
        if known is None:
            continue  # an API kfan has no schema for is never decoded
        for version in range(max(lo, known.start), min(hi, known.stop - 1) + 1):
            schema.request_spec(api_key, version)
            schema.response_spec(api_key, version)
    return _loaded() - before


def _loaded() -> int:
    return schema.request_spec.cache_info().currsize + schema.response_spec.cache_info().currsize
