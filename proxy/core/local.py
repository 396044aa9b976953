"""Answered by kfan itself: ApiVersions, and the login APIs.

kfan advertises what it implements intersected with what every backend
broker supports (:func:`proxy.core.routes.advertised_versions`). A client
asking in a newer ApiVersions version than kfan's gets the list in v0 with
UNSUPPORTED_VERSION, as a broker answers.

The login APIs (SaslHandshake, SaslAuthenticate) are the client
connection's own business: when kfan authenticates its clients, its login
exchange (:mod:`proxy.server.client_auth`) answers them before anything is
planned; otherwise they are not served (:func:`login`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, encode_body, response_spec
from ..kafka.wire import Parts
from .plan import Context, LocalReply, Plan, Route, Unsupported


def api_versions_body(api_versions: Mapping[int, tuple[int, int]], version: int, error_code: int = 0) -> Parts:
    spec = response_spec(apis.API_VERSIONS, version)
    body = {
        "error_code": error_code,
        "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(api_versions.items())],
        "throttle_time": 0,
    }
    return encode_body(spec, body)


def plan(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """Answered from the header alone (``request`` is not decoded): an ApiVersions kfan cannot decode still gets an answer."""
    served = ctx.api_versions.get(hdr.api_key)
    if not hdr.known or served is None or not served[0] <= hdr.api_version <= served[1]:
        return LocalReply(hdr, True, api_versions_body(ctx.api_versions, 0, errors.UNSUPPORTED_VERSION))
    return LocalReply(hdr, True, api_versions_body(ctx.api_versions, hdr.api_version))


def login(route: Route[Any], ctx: Context, hdr: RequestHeader, payload: memoryview, request: Struct) -> Plan:
    """A login API reaches planning only when kfan does not authenticate its clients: it is not
    served then, and the connection closes, as a broker without a SASL listener closes it."""
    raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")
