"""Client quotas enforced by this kfan process, and what each request of a connection earns against them.

The quotas come from ``--quota-file`` (TOML, see the README; the core's
:mod:`proxy.core.quotas` has the semantics), re-read when it changes: the
rates measured so far are kept, the new limits apply from the next request.
Requests are counted as a Kafka broker counts them: a Produce by its size
when read, a Fetch by its answer's size, every request by kfan's own CPU time
on it (planning, merging: ``request_percentage``). A Fetch asks the brokers
for no more than the quota's burst (as Kafka caps it at what its quota window
allows), so an answer stays within the rate. What a request earned over a
quota is its throttle time: the answer says it, and the connection reads
nothing more until it has passed (:attr:`ClientThrottle.until`), from the
moment it is earned, as a broker mutes the channel of the request it is
processing: a Produce over its quota holds back the requests behind it at once.

Metrics are kept per quota entity, for at most ``LABEL_BOUND`` entities per
process; the rest are counted as ``<other>``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import trio

from proxy.core.quotas import ANONYMOUS, ClientQuotas, QuotaConfig, QuotaFileError, QuotaType, Usage, parse_quotas
from proxy.core.throttle import client_throttles, with_throttle
from proxy.kafka import apis
from proxy.kafka.headers import RequestHeader
from proxy.kafka.wire import Parts
from proxy.runtime import metrics
from proxy.security.files import WatchedFile, read_toml
from proxy.server.ordering import ResponseSlot

log = logging.getLogger("kfan.quotas")

LABEL_BOUND = 1000
OTHER = "<other>"


def read_quotas(path: Path) -> QuotaConfig:
    """The quotas a file states; raises :class:`ValueError` saying what is wrong with it."""
    return read_toml(path, parse_quotas, QuotaFileError)


class Quotas:
    """This process's quotas (from their file, kept current) and the rates of the clients it serves."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: WatchedFile[QuotaConfig] | None = WatchedFile(path, read_quotas)  # raises: kfan does not start on an invalid file
        self.rates = ClientQuotas(self._file.value() if self._file is not None else QuotaConfig())
        self._labels: set[tuple[str, str]] = set()
        metrics.QUOTA_ENTRIES.set(len(self.rates.config))
        log.info("quotas from %s: %d entries", path, len(self.rates.config))

    def switch(self, path: Path) -> None:
        """Another file (a reload moved --quota-file); the rates measured so far are kept. Raises for an invalid one."""
        watched = WatchedFile(path, read_quotas)
        self.path, self._file = path, watched
        self.current()

    def stop(self) -> None:
        """No quotas any more (a reload removed --quota-file): nothing is throttled from the next request on."""
        self._file = None
        self.rates.config = QuotaConfig()
        metrics.QUOTA_ENTRIES.set(0)
        log.info("quotas: none (--quota-file removed)")

    def current(self) -> ClientQuotas:
        """The rates, under the quotas in the file as it is now."""
        if self._file is None:
            return self.rates
        config = self._file.value()
        if config is not self.rates.config:
            self.rates.config = config
            metrics.QUOTA_ENTRIES.set(len(config))
            log.info("quotas reloaded from %s: %d entries", self.path, len(config))
        return self.rates

    def report(self, usage: Usage, value: float) -> None:
        """Count one recording in the entity's metrics."""
        labels = usage.bucket
        if labels not in self._labels:
            if len(self._labels) >= LABEL_BOUND:
                labels = (OTHER, OTHER)
            self._labels.add(labels)
        kind = usage.kind.value
        metrics.QUOTA_USAGE.labels(kind, *labels).inc(value)
        if usage.throttle > 0:
            metrics.QUOTA_THROTTLED.labels(kind, *labels).inc()
            metrics.QUOTA_THROTTLE.labels(kind, *labels).inc(usage.throttle)
        metrics.QUOTA_ENTITIES.set(len(self.rates))


class ClientThrottle:
    """One connection's requests counted against the quotas: the throttle time each earns (seconds)."""

    def __init__(self, quotas: Quotas, principal: Callable[[], str]) -> None:
        """``principal``: who the client is at kfan (its login, its certificate; "" when neither: Kafka's ANONYMOUS)."""
        self.quotas = quotas
        self._principal = principal
        self.until = 0.0  # (trio's clock) no request of the connection is read before then

    def _earned(self, seconds: float) -> float:
        if seconds > 0:
            self.until = max(self.until, trio.current_time() + seconds)
        return seconds

    def _who(self, hdr: RequestHeader) -> tuple[str, str]:
        return self._principal() or ANONYMOUS, hdr.client_id or ""

    def fetch_cap(self, client_id: str | None) -> int | None:
        """The most bytes a Fetch may ask for: the client's fetch quota's burst (None: no cap)."""
        cap = self.quotas.current().burst(QuotaType.FETCH, self._principal() or ANONYMOUS, client_id or "")
        return None if cap is None else max(1, int(cap))

    def _record(self, kind: QuotaType, hdr: RequestHeader, value: float, report: float, max_throttle: float | None = None) -> float:
        rates = self.quotas.current()
        if not rates.applies(kind):
            return 0.0
        usage = rates.record(kind, *self._who(hdr), value, time.monotonic(), max_throttle)
        if usage is None:
            return 0.0
        self.quotas.report(usage, report)
        return usage.throttle

    def read(self, slot: ResponseSlot, hdr: RequestHeader, size: int, cpu_seconds: float) -> None:
        """A request read and planned (``cpu_seconds`` of kfan's time so far): a Produce counts its bytes now, as a
        broker does."""
        slot.cpu = cpu_seconds
        if hdr.api_key == apis.PRODUCE:
            slot.throttle = self._earned(self._record(QuotaType.PRODUCE, hdr, size, size))

    def answering(self, slot: ResponseSlot, hdr: RequestHeader, body: Parts | None) -> Parts | None:
        """The answer saying the throttle time its request earned (KIP-219), if any; a client of a version that does
        not throttle itself gets it late (``slot.hold``)."""
        size = sum(len(p) for p in body) if body is not None else 0
        slot.throttle = max(slot.throttle, self.answered(hdr, size, slot.cpu, body is not None))
        if slot.throttle <= 0 or body is None:
            return body
        slot.hold = not client_throttles(hdr.api_key, hdr.api_version)
        return with_throttle(hdr.api_key, hdr.api_version, body, round(slot.throttle * 1000))

    def answered(self, hdr: RequestHeader, response_bytes: int, cpu_seconds: float, wants_answer: bool) -> float:
        """A request answered: a Fetch counts its answer's bytes, any request kfan's CPU time on it (but a Produce
        wanting no answer, exempt as in Kafka); the longer throttle time either earned."""
        throttle = 0.0
        if hdr.api_key == apis.FETCH and response_bytes:
            throttle = self._record(QuotaType.FETCH, hdr, response_bytes, response_bytes)
        if wants_answer:
            # Percent-seconds, as Kafka counts a request's thread time; a request quota's throttle is at most one
            # burst (Kafka: one window).
            most = self.quotas.rates.config.burst_seconds
            throttle = max(throttle, self._record(QuotaType.REQUEST, hdr, cpu_seconds * 100.0, cpu_seconds, most))
        return self._earned(throttle)
