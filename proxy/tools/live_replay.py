"""Live replay: send captured client requests to a running kfan and compare answers.

For each captured connection (in request order) one TCP connection to the
target; each recorded request is sent as it was (same bytes, same
correlation id) and the answer's *structure* compared with the recorded
one: the error codes and the names of what it answers for (topics,
partitions, groups, resources) at every level, not offsets, timestamps,
records or broker addresses, which legitimately change between runs.

``apis="read-only"`` sends only requests that change nothing on the
cluster (metadata, fetches, offsets and describe/list requests), so a
capture can be replayed against production safely. A blocking socket per
connection: this is a command-line tool, not the data path.
"""

from __future__ import annotations

import socket
import struct
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.capture.rows import CaptureRow, read_rows
from proxy.core import ROUTES
from proxy.kafka.apis import api_name
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import decode_response
from proxy.kafka.wire import Malformed

# Fields that name what an entry answers for; kept in the compared structure.
_NAMES = frozenset(
    {
        "name",
        "topic",
        "topic_id",
        "partition_index",
        "partition",
        "index",
        "group_id",
        "transactional_id",
        "resource_name",
        "resource_type",
        "key",
        "api_key",
    }
)


def structure(value: Any) -> Any:
    """What a decoded answer says, without what legitimately changes between runs."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k in _NAMES or k.endswith("error_code"):
                out[k] = str(v) if not isinstance(v, int | str) else v
            elif isinstance(v, Mapping | list):
                inner = structure(v)
                if inner:
                    out[k] = inner
        return out
    if isinstance(value, list):
        inner = [structure(v) for v in value]
        return inner if any(inner) else []
    return None


@dataclass
class Mismatch:
    conn_id: str
    correlation_id: int
    api_key: int
    api_version: int
    detail: str


@dataclass
class LiveReport:
    sent: int = 0
    skipped: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)


def _first_difference(a: Any, b: Any, path: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path or '.'}: {len(a)} entries recorded, {len(b)} now"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path or '.'}: recorded {a!r}, now {b!r}"


def _read_only(api_key: int) -> bool:
    """Asking it again changes nothing on the cluster (the route table says)."""
    route = ROUTES.get(api_key)
    return route is not None and route.read_only


def _read_frame(sock: socket.socket, reader: FrameReader) -> bytes:
    """The next answer on ``sock``, cut by the one frame reader (sizes checked before buffering)."""
    while (payload := reader.next_frame()) is None:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the target closed the connection")
        reader.feed(chunk)
    return payload


def _connections(rows: Iterable[CaptureRow]) -> Iterator[tuple[str, list[CaptureRow]]]:
    by_conn: dict[str, list[CaptureRow]] = defaultdict(list)
    for row in rows:
        by_conn[row.conn_id].append(row)
    for conn_id, exchanges in sorted(by_conn.items()):
        yield conn_id, sorted(exchanges, key=lambda r: r.ts_start)


def replay_live(rows: Iterable[CaptureRow], target: tuple[str, int], apis: str = "all", timeout: float = 30.0) -> LiveReport:
    report = LiveReport()
    for conn_id, exchanges in _connections(rows):
        chosen = [r for r in exchanges if r.request and (apis == "all" or _read_only(r.api_key))]
        report.skipped += len(exchanges) - len(chosen)
        if not chosen:
            continue
        with socket.create_connection(target, timeout=timeout) as sock:
            reader = FrameReader(DEFAULT_MAX_FRAME_BYTES, MIN_RESPONSE_FRAME)
            for r in chosen:
                key, version, cid = r.api_key, r.api_version, r.correlation_id
                sock.sendall(frame([r.request]))
                report.sent += 1
                if r.response is None:
                    continue
                try:
                    answer = _read_frame(sock, reader)
                except (OSError, ConnectionError, Malformed) as e:
                    report.mismatches.append(Mismatch(conn_id, cid, key, version, f"no answer: {e}"))
                    break
                if struct.unpack_from(">i", answer)[0] != cid:
                    report.mismatches.append(Mismatch(conn_id, cid, key, version, "answer carries another correlation id"))
                    break
                try:
                    recorded = structure(decode_response(r.response, key, version))
                    now = structure(decode_response(answer, key, version))
                except (Malformed, ValueError) as e:
                    report.mismatches.append(Mismatch(conn_id, cid, key, version, f"answer does not decode: {e}"))
                    continue
                if recorded != now:
                    report.mismatches.append(Mismatch(conn_id, cid, key, version, _first_difference(recorded, now)))
    return report


def run(capture: Path, target: tuple[str, int], apis: str) -> int:
    report = replay_live(read_rows(capture), target, apis)
    print(
        f"kfan replay --target {target[0]}:{target[1]}: {report.sent} requests sent, {report.skipped} skipped "
        f"({apis}), {len(report.mismatches)} answers differ"
    )
    for m in report.mismatches[:20]:
        print(f"  differs: {api_name(m.api_key)} v{m.api_version} {m.conn_id}#{m.correlation_id}: {m.detail}")
    return 1 if report.mismatches else 0
