"""Client quotas as a Kafka broker keeps them (KIP-13, KIP-55, KIP-124, KIP-219). Pure: time is passed in.

Three quotas, each configured for quota entities and resolved on its own:
``producer_byte_rate`` (bytes of Produce requests per second),
``consumer_byte_rate`` (bytes of Fetch answers per second) and
``request_percentage`` (kfan's own time spent on a client's requests, in
percent of one thread). An entity names a user principal, a client id, or
both; ``<default>`` stands for any user or any client id, as in Kafka.

Precedence is Kafka's (its ``DefaultQuotaCallback``), most specific first:
(user, client id), (user, default client id), user, (default user, client
id), (default user, default client id), default user, client id, default
client id. The entity that matches also says who shares a rate: a quota on
a user alone is one rate for all that user's client ids; a default stands for
each user (or client id) on its own.

What a client uses is taken from a token bucket per rate (:class:`TokenBucket`):
it may run ``burst_seconds`` of its quota ahead, and the throttle time is the
time that brings it back to its quota if nothing more were recorded, which is
Kafka's definition; over any period it gets its quota.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT = "<default>"  # Kafka's default entity, as its ZooKeeper paths and kafka-configs name it
ANONYMOUS = "ANONYMOUS"  # the user of a client that did not authenticate, as in Kafka


class QuotaType(enum.Enum):
    """A client quota, by the name Kafka's configuration gives it."""

    PRODUCE = "producer_byte_rate"
    FETCH = "consumer_byte_rate"
    REQUEST = "request_percentage"


class QuotaFileError(ValueError):
    """What is wrong with a quota document."""


@dataclass(frozen=True)
class QuotaEntity:
    """Kafka's quota entity: a user, a client id, or both (None: the entity does not name it)."""

    user: str | None
    client_id: str | None

    def __str__(self) -> str:
        parts = [f"user={self.user}" if self.user is not None else "", f"client-id={self.client_id}" if self.client_id is not None else ""]
        return ", ".join(p for p in parts if p)


# Who shares a rate: (user, client id), either "" when the rate is not kept by it (Kafka's metric tags).
Bucket = tuple[str, str]


def _precedence(user: str, client_id: str) -> Iterator[tuple[QuotaEntity, Bucket]]:
    """The entities that may set a client's quota, most specific first, each with the rate it shares."""
    yield QuotaEntity(user, client_id), (user, client_id)
    yield QuotaEntity(user, DEFAULT), (user, client_id)
    yield QuotaEntity(user, None), (user, "")
    yield QuotaEntity(DEFAULT, client_id), (user, client_id)
    yield QuotaEntity(DEFAULT, DEFAULT), (user, client_id)
    yield QuotaEntity(DEFAULT, None), (user, "")
    yield QuotaEntity(None, client_id), ("", client_id)
    yield QuotaEntity(None, DEFAULT), ("", client_id)


@dataclass(frozen=True)
class QuotaConfig:
    """The quotas in force: for each quota type, the limit each entity sets."""

    limits: Mapping[QuotaType, Mapping[QuotaEntity, float]] = field(default_factory=dict)
    burst_seconds: float = 1.0  # how far ahead of its quota a client may run, in seconds of it

    def __bool__(self) -> bool:
        return any(self.limits.values())

    def __len__(self) -> int:
        return sum(len(v) for v in self.limits.values())

    def resolve(self, kind: QuotaType, user: str, client_id: str) -> tuple[Bucket, float] | None:
        """The rate a client's requests count in and its limit; None when no entity sets this quota for it."""
        limits = self.limits.get(kind)
        if not limits:
            return None
        for entity, bucket in _precedence(user, client_id):
            limit = limits.get(entity)
            if limit is not None:
                return bucket, limit
        return None


_KINDS = {k.value: k for k in QuotaType}
_ENTITY_KEYS = {"user", "client-id", "client_id"}


def parse_quotas(document: Mapping[str, Any]) -> QuotaConfig:
    """The quotas a parsed quota file (TOML) states; raises :class:`QuotaFileError` naming the first problem."""
    unknown = set(document) - {"quotas", "burst_seconds"}
    if unknown:
        raise QuotaFileError(f"unknown keys {sorted(unknown)} (expected quotas, burst_seconds)")
    seconds = document.get("burst_seconds", 1.0)
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds <= 0:
        raise QuotaFileError("burst_seconds must be a positive number")
    entries = document.get("quotas", [])
    if not isinstance(entries, list):
        raise QuotaFileError("quotas must be an array of tables ([[quotas]])")
    limits: dict[QuotaType, dict[QuotaEntity, float]] = {k: {} for k in QuotaType}
    for i, entry in enumerate(entries, 1):
        where = f"quotas #{i}"
        if not isinstance(entry, dict):
            raise QuotaFileError(f"{where}: not a table")
        if extra := set(entry) - _ENTITY_KEYS - set(_KINDS):
            raise QuotaFileError(f"{where}: unknown keys {sorted(extra)} (expected user, client-id and {', '.join(_KINDS)})")
        if "client-id" in entry and "client_id" in entry:
            raise QuotaFileError(f"{where}: client-id given twice")
        user = _name(entry.get("user"), f"{where}: user")
        client_id = _name(entry.get("client-id", entry.get("client_id")), f"{where}: client-id")
        if user is None and client_id is None:
            raise QuotaFileError(f'{where}: name a user, a client-id, or both ("{DEFAULT}" for the default)')
        entity = QuotaEntity(user, client_id)
        named = [k for k in _KINDS if k in entry]
        if not named:
            raise QuotaFileError(f"{where}: sets no quota (give {', '.join(_KINDS)})")
        for key in named:
            value = entry[key]
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise QuotaFileError(f"{where}: {key} must be a positive number")
            kind = _KINDS[key]
            if entity in limits[kind]:
                raise QuotaFileError(f"{where}: {key} for {entity} is set twice")
            limits[kind][entity] = float(value)
    return QuotaConfig({k: v for k, v in limits.items() if v}, float(seconds))


def _name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise QuotaFileError(f'{where} must be a string ("{DEFAULT}" for the default)')
    return value


class TokenBucket:
    """A client's rate against its quota, as a token bucket (Kafka's own for controller mutations, KIP-599).

    The bucket holds up to ``burst`` (the quota times ``burst_seconds``) and
    fills at the quota; what a client uses is taken from it, and a client that
    took more than it held waits until the bucket is back at zero: that wait
    is the throttle time. Over any period a client gets its quota, plus the
    burst once. (Kafka's byte and request quotas measure a sampled rate
    instead, which lets a new client spend N-1 windows' worth, ten seconds of
    its quota by default, at once and again whenever old samples expire
    together: over half a minute it reads as up to a third above the quota.)
    """

    __slots__ = ("tokens", "updated")

    def __init__(self, burst: float, now: float) -> None:
        self.tokens = burst  # a new client may use its burst at once
        self.updated = now

    def take(self, value: float, limit: float, burst: float, now: float) -> float:
        """Take ``value``; the seconds until the bucket is back at zero (0.0 when it held enough)."""
        self.tokens = min(burst, self.tokens + limit * max(0.0, now - self.updated)) - value
        self.updated = max(self.updated, now)
        return -self.tokens / limit if self.tokens < 0 else 0.0


@dataclass(frozen=True)
class Usage:
    """What one recording found: the rate it counted in, the limit, and the throttle it earned (seconds)."""

    kind: QuotaType
    bucket: Bucket
    limit: float
    throttle: float


class ClientQuotas:
    """The rates of every client this process serves, each against its quota (one per kfan process, as per broker).

    Token buckets are kept for the rates quotas resolve to, at most ``max_buckets``
    of them (the least recently used go first: a client cycling through
    client ids must not grow kfan without bound), and forgotten once idle
    for ``expire_after`` seconds (Kafka's one hour of inactivity).
    """

    def __init__(self, config: QuotaConfig | None = None, *, max_buckets: int = 10_000, expire_after: float = 3600.0) -> None:
        self.config = config or QuotaConfig()
        self.max_buckets = max_buckets
        self.expire_after = expire_after
        self._rates: OrderedDict[tuple[QuotaType, Bucket], TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rates)

    def applies(self, kind: QuotaType) -> bool:
        return bool(self.config.limits.get(kind))

    def record(
        self, kind: QuotaType, user: str, client_id: str, value: float, now: float, max_throttle: float | None = None
    ) -> Usage | None:
        """Count ``value`` for the client; what it earned (None: no quota of this type applies to it)."""
        resolved = self.config.resolve(kind, user, client_id)
        if resolved is None:
            return None
        bucket, limit = resolved
        burst = limit * self.config.burst_seconds
        throttle = self._rate(kind, bucket, burst, now).take(value, limit, burst, now)
        if max_throttle is not None:
            throttle = min(throttle, max_throttle)
        return Usage(kind, bucket, limit, throttle)

    def burst(self, kind: QuotaType, user: str, client_id: str) -> float | None:
        """The most one request may take without being throttled for sure (a Fetch's bytes are capped at it, as
        Kafka caps them at what its quota window allows, so that an answer stays within the rate)."""
        resolved = self.config.resolve(kind, user, client_id)
        if resolved is None:
            return None
        return resolved[1] * self.config.burst_seconds

    def _rate(self, kind: QuotaType, bucket: Bucket, burst: float, now: float) -> TokenBucket:
        key = (kind, bucket)
        rate = self._rates.get(key)
        if rate is not None:
            self._rates.move_to_end(key)
            return rate
        self.expire(now)
        while len(self._rates) >= self.max_buckets:
            self._rates.popitem(last=False)
        rate = self._rates[key] = TokenBucket(burst, now)
        return rate

    def expire(self, now: float) -> None:
        """Forget the rates idle for ``expire_after`` (the least recently used are first in line)."""
        while self._rates:
            key, rate = next(iter(self._rates.items()))
            if now - rate.updated < self.expire_after:
                break
            del self._rates[key]
