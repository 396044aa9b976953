"""Answered by kfan itself: ApiVersions, and the login APIs.

kfan advertises what it implements intersected with what every backend
broker supports (:func:`proxy.core.routes.advertised_versions`), and from
v3 on the cluster's features, as its brokers report them. A client
asking in a newer ApiVersions version than kfan's gets the list in v0 with
UNSUPPORTED_VERSION, as a broker answers.

The login APIs (SaslHandshake, SaslAuthenticate) are the client
connection's own business: when kfan authenticates its clients, its login
exchange (:mod:`proxy.server.client_auth`) answers them before anything is
planned; otherwise they are not served (:func:`login`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, response_spec
from ..kafka.wire import Parts
from .plan import NO_FEATURES, Context, Features, LocalReply, Plan, Route, Unsupported


def merged_features(brokers: Iterable[Features]) -> Features:
    """kfan's features, from its brokers': a feature every broker supports, in the range all of them do (a
    rolling upgrade's brokers differ), and the finalized levels of the newest epoch any broker has seen."""
    reported = [f for f in brokers if f.supported or f.finalized_epoch >= 0]
    if not reported:
        return NO_FEATURES
    supported: dict[str, tuple[int, int]] = dict(reported[0].supported)
    for f in reported[1:]:
        supported = {
            name: (max(lo, f.supported[name][0]), min(hi, f.supported[name][1]))
            for name, (lo, hi) in supported.items()
            if name in f.supported
        }
    newest = max(reported, key=lambda f: f.finalized_epoch)
    return Features({n: r for n, r in supported.items() if r[0] <= r[1]}, newest.finalized_epoch, dict(newest.finalized))


def api_versions_body(
    api_versions: Mapping[int, tuple[int, int]], version: int, error_code: int = 0, features: Features = NO_FEATURES
) -> Parts:
    spec = response_spec(apis.API_VERSIONS, version)
    body: Struct = {
        "error_code": error_code,
        "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(api_versions.items())],
        "throttle_time": 0,
    }
    if spec.has("supported_features"):  # v3+: tagged fields, written as a broker writes them: only when not default
        # Before v4 a broker leaves out the features whose lowest version is 0 (older clients refuse them, KIP-1022).
        supported = sorted((n, r) for n, r in features.supported.items() if version >= 4 or r[0] > 0)
        if supported:
            body["supported_features"] = [{"name": n, "min_version": lo, "max_version": hi} for n, (lo, hi) in supported]
        if features.finalized_epoch >= 0:
            body["finalized_features_epoch"] = features.finalized_epoch
        if features.finalized:
            body["finalized_features"] = [
                {"name": n, "min_version_level": lo, "max_version_level": hi} for n, (lo, hi) in sorted(features.finalized.items())
            ]
    return encode_body(spec, body)


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """Answered from the header alone (``request`` is not decoded): an ApiVersions kfan cannot decode still gets an answer."""
    served = ctx.api_versions.get(hdr.api_key)
    if not hdr.known or served is None or not served[0] <= hdr.api_version <= served[1]:
        return LocalReply(hdr, True, api_versions_body(ctx.api_versions, 0, errors.UNSUPPORTED_VERSION))
    return LocalReply(hdr, True, api_versions_body(ctx.api_versions, hdr.api_version, features=ctx.features))


def login(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """A login API reaches planning only when kfan does not authenticate its clients: it is not
    served then, and the connection closes, as a broker without a SASL listener closes it."""
    raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")


def telemetry(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """Client telemetry reaches planning only when kfan has no telemetry subscriptions: not served then."""
    raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")
