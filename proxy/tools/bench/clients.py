"""Many clients at once: what kfan holds for each, and whether every one is served.

:func:`many_clients` opens ``clients`` connections to a running kfan, all at
the same time. Each one asks ApiVersions and Metadata, produces a few small
records to one partition (acks=-1, a record batch of magic 2 with its CRC-32C)
and fetches them back from the offset the Produce answer gave; it then waits,
still connected, until every other connection got that far (or failed), so
that kfan holds them all at once. While they are held, kfan's resident memory,
its open descriptors and its TCP connections to the brokers are sampled from
``/proc`` (the bench and kfan must share a host and a network namespace; for
``--workers N``, give a worker's pid). After every connection closed, the same
is sampled until kfan has let go of its client and broker connections.

The clients are light on purpose: one trio task and one TCP socket each,
speaking the protocol through kfan's own codec (:mod:`proxy.kafka`), not one
librdkafka instance (and its threads) each. The bench ships with kfan, so it
uses nothing from the test suite.

Every wait has a deadline: a connection stuck past it counts as failed, and
the bench still returns. A broker connection is counted as kfan's socket
whose local port is none of kfan's listening ports: kfan accepts clients and
metrics requests and connects out only to brokers (its client links and its
own control-plane links, a handful, counted in the idle figure too).
"""

from __future__ import annotations

import os
import resource
import struct
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import trio

from proxy.kafka import apis, schema
from proxy.kafka.frames import MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import correlation_id_of, decode_response, encode_request_header
from proxy.kafka.records import record_batch
from proxy.kafka.wire import Reader

CLIENT_ID = "kfan-bench"
RECORDS_PER_CLIENT = 3
# Versions spoken when kfan offers them: the newest that still name topics (Fetch v13 uses ids).
_WANTED = {apis.METADATA: 12, apis.PRODUCE: 9, apis.FETCH: 12}
# The oldest that carry record batches of magic 2 (Produce v3, Fetch v4) and take a topic list (Metadata v1).
_OLDEST = {apis.METADATA: 1, apis.PRODUCE: 3, apis.FETCH: 4}
_FETCH_MAX_BYTES = 1024 * 1024
_NO_TOPIC_ID = uuid.UUID(int=0)  # Metadata v10+: the topic is named, not identified
_SAMPLE_EVERY = 0.25  # seconds between /proc samples while connections are open
_TCP_LISTEN = "0A"  # the LISTEN state in /proc/net/tcp


class _Failure(Exception):
    """One client connection did not get its records back (the text says why)."""


@dataclass
class _Sample:
    rss_kib: int
    fds: int
    broker_connections: int
    client_connections: int


@dataclass
class _Run:
    """What the client tasks share: counts, the barrier, and why connections failed."""

    clients: int
    progress: Callable[[str], None]
    opened: int = 0
    arrived: int = 0  # connections served or failed
    served: int = 0
    all_arrived: trio.Event = field(default_factory=trio.Event)
    release: trio.Event = field(default_factory=trio.Event)
    reasons: dict[str, int] = field(default_factory=dict)

    def step(self) -> int:
        return max(1, self.clients // 5)

    def note_opened(self) -> None:
        self.opened += 1
        if self.opened % self.step() == 0 or self.opened == self.clients:
            self.progress(f"opened {self.opened}/{self.clients}")

    def arrive(self, failure: str | None) -> None:
        self.arrived += 1
        if failure is None:
            self.served += 1
            if self.served % self.step() == 0 or self.served == self.clients:
                self.progress(f"served {self.served}/{self.clients}")
        else:
            self.reasons[failure] = self.reasons.get(failure, 0) + 1
        if self.arrived == self.clients:
            self.all_arrived.set()


def many_clients(
    host: str,
    port: int,
    kfan_pid: int,
    topic: str,
    partitions: int,
    clients: int,
    progress: Callable[[str], None],
    *,
    timeout: float = 120.0,
    settle_timeout: float = 30.0,
) -> dict[str, int | float]:
    """Serve ``clients`` connections at once through kfan at ``host``:``port`` (process ``kfan_pid``).

    ``topic`` must exist with ``partitions`` partitions; client i writes to
    partition ``i % partitions``. ``timeout``: the deadline for every
    connection to be opened and served; ``settle_timeout``: how long, after
    they all closed, kfan may take to let go of its connections.
    Sizes are MiB and KiB (1024), times seconds.
    """
    _raise_own_fd_limit(clients + 64)
    return trio.run(_many_clients, host, port, kfan_pid, topic, partitions, clients, progress, timeout, settle_timeout)


async def _many_clients(
    host: str,
    port: int,
    pid: int,
    topic: str,
    partitions: int,
    clients: int,
    progress: Callable[[str], None],
    timeout: float,
    settle_timeout: float,
) -> dict[str, int | float]:
    idle = _sample(pid, port)
    progress(
        f"kfan idle: RSS {idle.rss_kib / 1024:.1f} MiB, {idle.fds} fds, {idle.broker_connections} broker connections; "
        f"opening {clients} client connections"
    )
    run = _Run(clients, progress)
    peak = _Sample(idle.rss_kib, idle.fds, idle.broker_connections, idle.client_connections)
    started = trio.current_time()
    deadline = started + timeout
    async with trio.open_nursery() as nursery:
        sampling = trio.CancelScope()
        nursery.start_soon(_sample_until, sampling, pid, port, peak)
        for i in range(clients):
            nursery.start_soon(_one_client, run, i, host, port, topic, i % partitions, deadline)
        with trio.move_on_at(deadline):
            await run.all_arrived.wait()
        worked = trio.current_time() - started
        # Every connection is still open here: this sample is the one that must count.
        held = await trio.to_thread.run_sync(_sample, pid, port)
        _keep_peak(peak, held)
        sampling.cancel()
        progress(
            f"{run.opened} opened and held, {run.served} served: kfan RSS {held.rss_kib / 1024:.1f} MiB, {held.fds} fds, "
            f"{held.broker_connections} broker connections, {held.client_connections} client connections"
        )
        run.release.set()
    failed = clients - run.served
    if run.reasons:
        worst = sorted(run.reasons.items(), key=lambda kv: -kv[1])[:5]
        progress(f"failed {failed}: " + "; ".join(f"{why} ({n})" for why, n in worst))
    after, settled = await _settle(pid, port, idle, settle_timeout, peak)
    progress(
        f"closed: after {settled:.1f} s kfan holds {after.broker_connections} broker connections, "
        f"{after.client_connections} client connections, {after.fds} fds, RSS {after.rss_kib / 1024:.1f} MiB"
    )
    return {
        "clients": clients,
        "served": run.served,
        "failed": failed,
        "seconds": round(worked, 3),
        "kfan_rss_mib_idle": round(idle.rss_kib / 1024, 1),
        "kfan_rss_mib_held": round(held.rss_kib / 1024, 1),
        "kfan_rss_mib_peak": round(peak.rss_kib / 1024, 1),
        "kfan_rss_mib_after": round(after.rss_kib / 1024, 1),
        "kfan_rss_kib_per_client": round((peak.rss_kib - idle.rss_kib) / clients, 1),
        "broker_connections_idle": idle.broker_connections,
        "broker_connections_peak": peak.broker_connections,
        "broker_connections_after": after.broker_connections,
        "client_connections_peak": peak.client_connections,
        "client_connections_after": after.client_connections,
        "kfan_fds_idle": idle.fds,
        "kfan_fds_peak": peak.fds,
        "kfan_fds_after": after.fds,
        "kfan_fd_limit": _fd_limit(pid),
        "settle_seconds": round(settled, 3),
    }


async def _one_client(run: _Run, i: int, host: str, port: int, topic: str, partition: int, deadline: float) -> None:
    conn: _Connection | None = None
    failure: str | None = None
    try:
        with trio.move_on_at(deadline) as scope:
            conn = _Connection(await trio.open_tcp_stream(host, port))
            run.note_opened()
            values = [f"client {i} record {n}".encode() for n in range(RECORDS_PER_CLIENT)]
            await conn.exchange(topic, partition, values)
        if scope.cancelled_caught:
            failure = f"{'connect' if conn is None else conn.stage}: no answer within the deadline"
    except _Failure as e:
        failure = str(e)
    except Exception as e:  # the connection's own failure (a refused connect, a reset, an answer that does not decode)
        failure = f"{'connect' if conn is None else conn.stage}: {type(e).__name__}: {e}"
    run.arrive(failure)
    # Held open until every connection got this far: kfan must serve them all at once.
    await run.release.wait()
    if conn is not None:
        await trio.aclose_forcefully(conn.stream)


class _Connection:
    """One client connection: requests in turn, each answer read before the next request."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.reader = FrameReader(min_frame_bytes=MIN_RESPONSE_FRAME)
        self.correlation_id = 0
        self.stage = "ApiVersions"

    async def call(self, api_key: int, version: int, body: Mapping[str, Any]) -> schema.Struct:
        self.correlation_id += 1
        spec = schema.request_spec(api_key, version)
        head = encode_request_header(api_key, version, self.correlation_id, CLIENT_ID)
        await self.stream.send_all(frame([head, *schema.encode_body(spec, _filled(spec, body))]))
        while (payload := self.reader.next_frame()) is None:
            data = await self.stream.receive_some(65536)
            if not data:
                raise _Failure(f"{self.stage}: kfan closed the connection")
            self.reader.feed(data)
        if correlation_id_of(payload) != self.correlation_id:
            raise _Failure(f"{self.stage}: answer to correlation id {correlation_id_of(payload)}, not {self.correlation_id}")
        return decode_response(payload, api_key, version)

    async def exchange(self, topic: str, partition: int, values: list[bytes]) -> None:
        """Produce ``values`` to ``topic``-``partition`` and read them back; raises _Failure otherwise."""
        answer = await self.call(apis.API_VERSIONS, 2, {})
        _check(answer["error_code"], "ApiVersions")
        offered = {k["api_key"]: k["max_version"] for k in answer["api_keys"]}
        versions = {}
        for key, wanted in _WANTED.items():
            versions[key] = min(wanted, offered.get(key, -1))
            if versions[key] < _OLDEST[key]:
                raise _Failure(f"kfan offers {apis.api_name(key)} up to v{offered.get(key)}, the bench needs v{_OLDEST[key]}")

        self.stage = "Metadata"
        answer = await self.call(apis.METADATA, versions[apis.METADATA], {"topics": [{"name": topic, "topic_id": _NO_TOPIC_ID}]})
        found = [t for t in answer["topics"] if t["name"] == topic]
        if not found:
            raise _Failure(f"Metadata: topic {topic} missing from the answer")
        _check(found[0]["error_code"], f"Metadata of {topic}")
        if not any(p["partition_index"] == partition for p in found[0]["partitions"]):
            raise _Failure(f"Metadata: {topic} has no partition {partition}")

        self.stage = "Produce"
        batch = record_batch(values, int(time.time() * 1000))
        body = {"acks": -1, "timeout": 10_000, "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}
        answer = await self.call(apis.PRODUCE, versions[apis.PRODUCE], body)
        produced = answer["responses"][0]["partition_responses"][0]
        _check(produced["error_code"], f"Produce to {topic}-{partition}")
        base = produced["base_offset"]

        self.stage = "Fetch"
        wanted = {base + n: v for n, v in enumerate(values)}
        while True:
            got = await self._fetch(versions[apis.FETCH], topic, partition, base)
            mine = {offset: value for offset, value in got if offset in wanted}
            if mine:
                if mine != wanted:
                    raise _Failure(f"Fetch: {topic}-{partition} from {base} holds other records than were produced")
                return
            # Not there yet (a broker may answer before the records are readable): ask again, within the deadline.
            await trio.sleep(0.05)

    async def _fetch(self, version: int, topic: str, partition: int, offset: int) -> list[tuple[int, bytes]]:
        wanted = {
            "partition": partition,
            "fetch_offset": offset,
            "partition_max_bytes": _FETCH_MAX_BYTES,
            "current_leader_epoch": -1,
            "last_fetched_epoch": -1,
            "log_start_offset": -1,
        }
        body = {
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": _FETCH_MAX_BYTES,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [wanted]}],
        }
        answer = await self.call(apis.FETCH, version, body)
        _check(answer.get("error_code", 0), "Fetch")
        for t in answer["responses"]:
            for p in t["partitions"]:
                if t["topic"] == topic and p["partition_index"] == partition:
                    _check(p["error_code"], f"Fetch of {topic}-{partition}")
                    return read_records(p["records"])
        raise _Failure(f"Fetch: no answer for {topic}-{partition}")


def _check(code: int, what: str) -> None:
    if code != 0:
        raise _Failure(f"{what}: error code {code}")


def _filled(spec: schema.StructSpec, value: Mapping[str, Any]) -> schema.Struct:
    """``value`` over the schema's blanks, nested structs too (fields this version lacks are dropped)."""
    out = spec.blank()
    for f in spec.fields:
        if f.name not in value:
            continue
        v = value[f.name]
        if f.struct is not None and f.array:
            v = [_filled(f.struct, e) for e in v]
        elif f.struct is not None and v is not None:
            v = _filled(f.struct, v)
        out[f.name] = v
    return out


# --- records ----------------------------------------------------------------------

_BATCH_HEAD = 61  # baseOffset .. record count
_COMPRESSION = 0x07


def read_records(data: bytes | memoryview | None) -> list[tuple[int, bytes]]:
    """(offset, value) of every record in a Fetch answer's uncompressed batches; a batch cut short at the end is skipped."""
    out: list[tuple[int, bytes]] = []
    if not data:
        return out
    view = memoryview(data)
    at = 0
    while at + _BATCH_HEAD <= len(view):
        base, length = struct.unpack_from(">qi", view, at)
        end = at + 12 + length
        if end > len(view):
            break  # cut at the fetch's byte budget
        magic, attributes = view[at + 16], struct.unpack_from(">h", view, at + 21)[0]
        if magic != 2 or attributes & _COMPRESSION:
            raise _Failure(f"Fetch: a batch the bench cannot read (magic {magic}, attributes {attributes:#x})")
        (count,) = struct.unpack_from(">i", view, at + 57)
        r = Reader(view, at + _BATCH_HEAD, end)
        for _ in range(count):
            size = r.varint()
            rec = Reader(r.raw(size))
            rec.int8()  # attributes
            rec.varint()  # timestamp delta
            offset_delta = rec.varint()
            key_len = rec.varint()
            if key_len > 0:
                rec.raw(key_len)
            value_len = rec.varint()
            value = bytes(rec.raw(value_len)) if value_len >= 0 else b""
            out.append((base + offset_delta, value))
        at = end
    return out


# --- kfan's process, from /proc -------------------------------------------------------------


async def _sample_until(scope: trio.CancelScope, pid: int, port: int, peak: _Sample) -> None:
    with scope:
        while True:
            _keep_peak(peak, await trio.to_thread.run_sync(_sample, pid, port))
            await trio.sleep(_SAMPLE_EVERY)


async def _settle(pid: int, port: int, idle: _Sample, timeout: float, peak: _Sample) -> tuple[_Sample, float]:
    """kfan once it holds no client connection and no more broker connections than idle (or at the deadline).

    Its memory still counts towards the peak: closing 500 connections takes some too.
    """
    started = trio.current_time()
    with trio.move_on_after(timeout):
        while True:
            now = await trio.to_thread.run_sync(_sample, pid, port)
            _keep_peak(peak, now)
            if now.client_connections == 0 and now.broker_connections <= idle.broker_connections:
                break
            await trio.sleep(0.1)
    now = await trio.to_thread.run_sync(_sample, pid, port)
    _keep_peak(peak, now)
    return now, trio.current_time() - started


def _keep_peak(peak: _Sample, s: _Sample) -> None:
    peak.rss_kib = max(peak.rss_kib, s.rss_kib)
    peak.fds = max(peak.fds, s.fds)
    peak.broker_connections = max(peak.broker_connections, s.broker_connections)
    peak.client_connections = max(peak.client_connections, s.client_connections)


def _sample(pid: int, port: int) -> _Sample:
    """kfan's RSS, open descriptors, and its TCP connections out (to brokers) and in on ``port`` (clients)."""
    proc = f"/proc/{pid}"
    rss = 0
    with open(f"{proc}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])  # kB
    sockets: set[int] = set()
    fds = 0
    for fd in os.listdir(f"{proc}/fd"):
        try:
            target = os.readlink(f"{proc}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        fds += 1
        if target.startswith("socket:["):
            sockets.add(int(target[8:-1]))
    # Every TCP socket of kfan's network namespace; kfan's own are those its descriptors name.
    # By inode: the kernel may list a socket twice when the table changes while it is read.
    mine: dict[int, tuple[int, str]] = {}  # inode -> (local port, state)
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                next(f)
                for line in f:
                    cols = line.split()
                    inode = int(cols[9])
                    if inode in sockets:
                        mine[inode] = (int(cols[1].rsplit(":", 1)[1], 16), cols[3])
        except FileNotFoundError:
            continue  # no IPv6
    listening = {p for p, state in mine.values() if state == _TCP_LISTEN}
    connected = [p for p, state in mine.values() if state != _TCP_LISTEN]
    clients = sum(1 for p in connected if p == port)
    brokers = sum(1 for p in connected if p not in listening)
    return _Sample(rss, fds, brokers, clients)


def _fd_limit(pid: int) -> int:
    """kfan's soft limit on open descriptors (-1: unlimited or unknown)."""
    try:
        with open(f"/proc/{pid}/limits") as f:
            for line in f:
                if line.startswith("Max open files"):
                    soft = line.split()[3]
                    return int(soft) if soft.isdigit() else -1
    except OSError:
        pass
    return -1


def _raise_own_fd_limit(needed: int) -> None:
    """The bench's own descriptors: the soft limit raised to the hard one.

    Raised even when the bench's sockets alone would fit: the process running
    it may also hold the brokers' end of every kfan link (an embedded cluster).
    """
    unlimited = resource.RLIM_INFINITY
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != unlimited and hard < needed:
        raise RuntimeError(f"the bench needs {needed} descriptors, the hard limit is {hard} (raise it: ulimit -Hn)")
    # An "unlimited" hard limit still stops at fs.nr_open (1048576 by default) on Linux.
    target = hard if hard != unlimited else max(needed, 1024 * 1024)
    if soft != unlimited and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            if soft < needed:
                raise
