"""A client's share sessions (KIP-932) as the core holds them, and the effects that change them (:mod:`.share`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ShareKey = tuple[str | None, str | None]  # a share session's (KIP-932): its group id and member id
SharePartition = tuple[Any, int]  # (topic id, partition index)


@dataclass(frozen=True, slots=True)
class ShareSession:
    """A client's share session with kfan, mapped onto kfan's own with the brokers (:mod:`.share`)."""

    client_epoch: int  # the epoch the client's next request in it must carry
    # Every partition in it -> the broker whose session holds it (None: no leader known yet; answered by kfan).
    partitions: Mapping[SharePartition, int | None]
    # Per broker holding a session for it: the epoch kfan's next request there carries (absent: none open).
    broker_epochs: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class KeepShareSession:
    """The connection's share session ``key`` is now ``session`` (None: closed)."""

    key: ShareKey
    session: ShareSession | None


@dataclass(frozen=True, slots=True)
class ReopenShareSessions:
    """These brokers' sessions for ``key`` broke (the broker failed, or answered a session error): the next
    request opens them afresh."""

    key: ShareKey
    brokers: frozenset[int]


__all__ = ["KeepShareSession", "ReopenShareSessions", "ShareKey", "SharePartition", "ShareSession"]
