"""kfan's own requests to the brokers (ApiVersions, Metadata, FindCoordinator):
its own links, separate from client traffic. The answers are read by the pure
``read_*`` functions of :mod:`backends.reads`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import trio

from proxy.core import NO_FEATURES, Features
from proxy.core.topology import Topology
from proxy.kafka import apis, schema
from proxy.kafka.wire import Malformed

from . import backoff, transport
from .link import Link, LinkError, own_request
from .reads import read_api_versions, read_broker_versions, read_metadata
from .transport import BrokerSecurity

# Versions the control plane speaks when the broker allows (clamped to what it supports).
_PREFERRED = {apis.API_VERSIONS: 2, apis.METADATA: 12, apis.FIND_COORDINATOR: 3}


def _software() -> dict[str, str]:
    """How kfan names itself in ApiVersions v3 (brokers show it in their client metrics)."""
    try:
        own = importlib.metadata.version("kfan")
    except importlib.metadata.PackageNotFoundError:
        own = "0"
    return {"client_software_name": "kfan", "client_software_version": own}


_SOFTWARE = _software()


def control_version(api_key: int, versions: Mapping[int, tuple[int, int]]) -> int:
    """The version the control plane speaks: its preferred one, within what the broker
    says it serves and what kfan has schemas for (a broker's odd ranges cannot push it out)."""
    known = schema.known_versions(api_key)
    assert known is not None
    lo, hi = versions.get(api_key, (known.start, _PREFERRED[api_key]))
    version = max(lo, min(hi, _PREFERRED[api_key]))
    if api_key == apis.METADATA:
        version = max(version, 1)  # v0 cannot ask for every topic
    return min(max(version, known.start), known.stop - 1)


class ControlLinks:
    """One link per broker (or bootstrap address) for kfan's own requests."""

    def __init__(
        self, topology: Callable[[], Topology], *, request_timeout: float, max_frame_bytes: int, security: BrokerSecurity | None = None
    ) -> None:
        self._topology = topology
        self.security = security if security is not None else BrokerSecurity()
        self.request_timeout = request_timeout
        self.max_frame_bytes = max_frame_bytes
        self.nursery: trio.Nursery | None = None  # the cluster's, once it runs
        self._links: dict[Any, Link] = {}  # by node id, or ("bootstrap", i)

    def _link(self, key: Any, host: str, port: int) -> Link:
        link = self._links.get(key)
        if link is None or link.failed is not None or link.address != (host, port):
            assert self.nursery is not None
            broker = key if isinstance(key, int) else -1
            # The backoff client connections' links share (:mod:`.backoff`): probes and refreshes add no attempts to an outage.
            reconnects = backoff.reconnects()
            attempt = reconnects.attempt((host, port))
            if attempt is None:
                backoff.backed_off(broker)
                wait = reconnects.retry_in((host, port))
                when = f"in {wait:.2f} s" if wait else "when the attempt under way ends"
                raise LinkError(f"broker {key} at {host}:{port} failed recently; reconnecting {when}")
            link = Link(
                broker,
                host,
                port,
                max_frame_bytes=self.max_frame_bytes,
                connect=partial(self.security.connect, host, port),
                authenticate=self.security.login(broker),
            )
            self._links[key] = link
            self.nursery.start_soon(link.run)
            self.nursery.start_soon(transport.settle, attempt, link)
        return link

    async def call(
        self, broker: Any, api_key: int, version: int, body: Mapping[str, Any], *, address: tuple[str, int] | None = None
    ) -> bytes:
        """The answer's payload (its decoding is the caller's: the ``read_*`` functions)."""
        if address is None:
            b = self._topology().brokers.get(broker)
            if b is None:
                raise LinkError(f"broker {broker} is not in the topology")
            address = (b.host, b.port)
        link = self._link(broker, *address)
        pending = link.submit(own_request(api_key, version, body))
        try:
            with trio.fail_after(self.request_timeout):
                return await pending.wait()
        except trio.TooSlowError:
            link.close()  # hung, or stalled mid-answer: the next call opens a fresh link
            raise

    async def api_versions(self, key: Any, host: str, port: int) -> dict[int, tuple[int, int]]:
        version = _PREFERRED[apis.API_VERSIONS]
        return read_api_versions(await self.call(key, apis.API_VERSIONS, version, {}, address=(host, port)), version)

    async def broker_versions(self, key: Any, host: str, port: int) -> tuple[dict[int, tuple[int, int]], Features]:
        """A broker's API versions and the cluster's features as it knows them (ApiVersions v4: v3 leaves out
        the features whose lowest version is 0, KIP-1022; a broker older than that is asked again in v2, and reports
        no features)."""
        try:
            return read_broker_versions(await self.call(key, apis.API_VERSIONS, 4, _SOFTWARE, address=(host, port)), 4)
        except Malformed:
            return await self.api_versions(key, host, port), NO_FEATURES

    async def metadata(self, key: Any, host: str, port: int, versions: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
        version = control_version(apis.METADATA, versions)
        body = {"topics": None, "allow_auto_topic_creation": False}
        return read_metadata(await self.call(key, apis.METADATA, version, body, address=(host, port)), version)
