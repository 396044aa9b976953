"""The audit log: one JSON line per connection event and per audited request, off the data path (trio).

Events are offered to a bounded queue (``--audit-queue-events``) and written
by a task of their own, in batches, through a :class:`Sink`: a file (opened
for appending, reopened on SIGHUP so logrotate can move it), stdout, or a
Kafka topic on the cluster itself (:mod:`proxy.server.audit_topic`). When the
sink lags and the queue is full, ``--audit-overflow`` decides:

- ``drop`` (the default): the event is dropped, counted in
  ``kfan_audit_dropped_total{kind}`` and logged (the first drop, then one line
  per 1,000), and the client is never slowed;
- ``block``: the connection waits for room before it reads its next request
  (and an answered request's event waits for room), so nothing is lost and
  clients slow down to what the sink takes.

Nothing secret is ever written: events carry names (principal, topics,
groups, transactional ids), never passwords, tokens, SASL bytes or records.
Which requests are audited: ``--audit-apis`` (``default``: every API but the
data path's Produce, Fetch, ShareFetch, ShareAcknowledge and the group
heartbeats; ``all``; or a list of API names or keys).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import trio

from proxy.kafka import apis
from proxy.runtime import metrics

log = logging.getLogger("kfan.audit")

# The data path: its APIs come by the thousand a second, so they are audited only when asked for.
DATA_PATH = frozenset(
    {
        apis.PRODUCE,
        apis.FETCH,
        apis.SHARE_FETCH,
        apis.SHARE_ACKNOWLEDGE,
        apis.HEARTBEAT,
        apis.CONSUMER_GROUP_HEARTBEAT,
        apis.SHARE_GROUP_HEARTBEAT,
        apis.STREAMS_GROUP_HEARTBEAT,
    }
)
API_NAMES: dict[int, str] = {key: name for name, key in vars(apis).items() if name.isupper() and isinstance(key, int)}
_BY_NAME = {name.replace("_", "").lower(): key for key, name in API_NAMES.items()}


def parse_audit_apis(text: Any) -> frozenset[int] | None:
    """``default`` (None: all but the data path), ``all``, or API names or keys, comma-separated."""
    items = text if isinstance(text, list | tuple) else str(text).split(",")
    names = [str(i).strip() for i in items if str(i).strip()]
    if names == ["default"]:
        return None
    if names == ["all"]:
        return frozenset(API_NAMES)
    keys = set()
    for name in names:
        key = int(name) if name.isdigit() else _BY_NAME.get(name.replace("_", "").replace("-", "").lower())
        if key is None or key not in API_NAMES:
            raise ValueError(f"unknown API {name!r} (give names such as CreateTopics or DELETE_GROUPS, or keys)")
        keys.add(key)
    return frozenset(keys)


class Sink(Protocol):
    """Where audit lines go. ``write`` runs in a worker thread (a file) or as a task (a topic)."""

    async def write(self, lines: Sequence[str]) -> None: ...

    def reopen(self) -> None: ...

    def close(self) -> None: ...


class FileSink:
    """A file opened for appending (``-``: stdout), reopened on :meth:`reopen` (after logrotate moved it)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file: IO[bytes] | None = None
        self._reopen = False
        self._open()

    def _open(self) -> None:
        if self.path == "-":
            self._file = sys.stdout.buffer
        else:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # Unbuffered: each batch is one write(2) on a file opened for appending, so the lines of several
            # workers (--workers) never interleave.
            self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (kept open, closed in close())

    def reopen(self) -> None:
        self._reopen = True

    async def write(self, lines: Sequence[str]) -> None:
        await trio.to_thread.run_sync(self._write, lines)

    def _write(self, lines: Sequence[str]) -> None:
        if self._reopen and self.path != "-":
            self._reopen = False
            self.close()
            self._open()
        assert self._file is not None
        self._file.write("".join(f"{line}\n" for line in lines).encode())
        self._file.flush()

    def close(self) -> None:
        if self._file is not None and self._file is not sys.stdout.buffer:
            self._file.close()
        self._file = None


@dataclass
class Audit:
    """The audit log's queue and writer (see the module's docstring)."""

    sink: Sink
    apis: frozenset[int] | None = None  # None: the default set
    queue_events: int = 10_000
    block: bool = False  # --audit-overflow block
    dropped: int = 0
    written: int = 0
    _queue: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    _ready: trio.Event = field(default_factory=trio.Event)
    _room: trio.Event = field(default_factory=trio.Event)

    def audits(self, api_key: int) -> bool:
        return api_key not in DATA_PATH if self.apis is None else api_key in self.apis

    def offer(self, kind: str, event: dict[str, Any]) -> bool:
        """Queue an event (``kind``: connection or request) without waiting; False: dropped and counted."""
        if len(self._queue) >= self.queue_events:
            self.dropped += 1
            metrics.AUDIT_DROPPED.labels(kind).inc()
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning("audit log lagging: %d events dropped so far (--audit-queue-events %d)", self.dropped, self.queue_events)
            return False
        self._queue.append((kind, event))
        metrics.AUDIT_QUEUED.inc()
        self._ready.set()
        return True

    async def put(self, kind: str, event: dict[str, Any]) -> None:
        """Queue an event: with ``block``, waiting for room first; else as :meth:`offer`."""
        if self.block:
            await self.wait_room()
            self._queue.append((kind, event))
            metrics.AUDIT_QUEUED.inc()
            self._ready.set()
        else:
            self.offer(kind, event)

    async def wait_room(self) -> None:
        """Until the queue has room (at once unless ``block``): a connection waits here before reading on."""
        while self.block and len(self._queue) >= self.queue_events:
            self._room = trio.Event() if self._room.is_set() else self._room
            await self._room.wait()

    def reopen(self) -> None:
        self.sink.reopen()

    async def run(self) -> None:
        """Write events until cancelled; those queued then are written on the way out."""
        try:
            while True:
                await self._ready.wait()
                self._ready = trio.Event()
                await self._flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._flush()
            self.sink.close()

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:1000], self._queue[1000:]
            metrics.AUDIT_QUEUED.dec(len(batch))
            self._room.set()
            lines = [json.dumps(event, separators=(",", ":"), default=str) for _, event in batch]
            try:
                await self.sink.write(lines)
            except OSError as e:  # a full disk, a topic unreachable: counted as dropped, never the process's end
                for kind, n in _kinds(batch):
                    metrics.AUDIT_DROPPED.labels(kind).inc(n)
                self.dropped += len(batch)
                log.error("audit sink failed, %d events dropped: %s", len(batch), e)
                continue
            self.written += len(batch)
            for kind, n in _kinds(batch):
                metrics.AUDIT_EVENTS.labels(kind).inc(n)


def _kinds(batch: Iterable[tuple[str, dict[str, Any]]]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for kind, _ in batch:
        counts[kind] = counts.get(kind, 0) + 1
    return list(counts.items())
