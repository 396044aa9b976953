"""The pure ``read_*`` functions that read kfan's own answers from brokers
(ApiVersions, Metadata); they raise only :class:`Malformed`.
"""

from __future__ import annotations

from typing import Any

from proxy.core import Features
from proxy.kafka import apis
from proxy.kafka.headers import decode_response
from proxy.kafka.wire import Malformed


def read_api_versions(payload: bytes | memoryview, version: int) -> dict[int, tuple[int, int]]:
    """A broker's ApiVersions answer: api key -> (min, max) version. Raises only :class:`Malformed`."""
    resp = decode_response(payload, apis.API_VERSIONS, version)
    if resp["error_code"] != 0:
        raise Malformed(f"ApiVersions answered error {resp['error_code']}")
    return {a["api_key"]: (a["min_version"], a["max_version"]) for a in resp["api_keys"] if a["min_version"] <= a["max_version"]}


def read_broker_versions(payload: bytes | memoryview, version: int) -> tuple[dict[int, tuple[int, int]], Features]:
    """A broker's ApiVersions answer: its API versions, and (v3+) the cluster's features as it knows them."""
    resp = decode_response(payload, apis.API_VERSIONS, version)
    if resp["error_code"] != 0:
        raise Malformed(f"ApiVersions answered error {resp['error_code']}")
    versions = {a["api_key"]: (a["min_version"], a["max_version"]) for a in resp["api_keys"] if a["min_version"] <= a["max_version"]}
    features = Features(
        {f["name"]: (f["min_version"], f["max_version"]) for f in resp.get("supported_features") or ()},
        resp.get("finalized_features_epoch", -1),
        {f["name"]: (f["min_version_level"], f["max_version_level"]) for f in resp.get("finalized_features") or ()},
    )
    return versions, features


def read_metadata(payload: bytes | memoryview, version: int) -> dict[str, Any]:
    """A Metadata answer, with broker entries kfan could not connect to left out. Raises only :class:`Malformed`."""
    resp = decode_response(payload, apis.METADATA, version)
    resp["brokers"] = [b for b in resp["brokers"] if b["node_id"] >= 0 and b["host"] and 0 < b["port"] < 65536]
    return resp
