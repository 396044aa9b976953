"""Traffic capture: one Parquet row per client exchange, written off the data path.

Rows are offered without waiting: when the writer lags, the row is dropped
and counted (``kfan_capture_dropped_total``), never the client's request.
Files are written as ``*.parquet.inprogress`` and renamed to ``*.parquet``
when complete (rotated by size and age), so a killed proxy leaves every
finished file readable and readers skip the partial one. With
``records="none"`` record batches in Produce requests and Fetch responses are
replaced by empty ones, so no payload is stored; the rows say so
(``records_scrubbed``) and replay does not compare payloads.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from . import metrics
from .kafka import schema
from .kafka.headers import parse_request_header, response_body_offset
from .kafka.wire import Malformed

log = logging.getLogger("kfan.capture")

COLUMNS = (
    "ts_start",
    "ts_end",
    "conn_id",
    "api_key",
    "api_version",
    "correlation_id",
    "request",
    "response",
    "subrequests",
    "topology",
    "records_scrubbed",
)


def arrow_schema() -> Any:
    import pyarrow as pa

    sub = pa.struct([("broker", pa.int32()), ("request", pa.binary()), ("response", pa.binary())])
    return pa.schema(
        [
            ("ts_start", pa.int64()),
            ("ts_end", pa.int64()),
            ("conn_id", pa.string()),
            ("api_key", pa.int16()),
            ("api_version", pa.int16()),
            ("correlation_id", pa.int32()),
            ("request", pa.binary()),
            ("response", pa.binary()),
            ("subrequests", pa.list_(sub)),
            ("topology", pa.string()),
            ("records_scrubbed", pa.bool_()),
        ]
    )


def _without_records(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (b"" if k == "records" and v is not None else _without_records(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_records(v) for v in value]
    return value


def scrub_request(payload: bytes) -> bytes:
    """A request frame payload with every record batch emptied (header kept byte for byte)."""
    hdr = parse_request_header(payload)
    spec = schema.request_spec(hdr.api_key, hdr.api_version)
    body = schema.decode_body(spec, payload, hdr.body_offset, allow_trailing=True)
    return bytes(payload[: hdr.body_offset]) + b"".join(bytes(p) for p in schema.encode_body(spec, _without_records(body)))


def scrub_response(payload: bytes, api_key: int, api_version: int) -> bytes:
    offset = response_body_offset(payload, api_key, api_version)
    spec = schema.response_spec(api_key, api_version)
    body = schema.decode_body(spec, payload, offset, allow_trailing=True)
    return bytes(payload[:offset]) + b"".join(bytes(p) for p in schema.encode_body(spec, _without_records(body)))


@dataclass(frozen=True)
class CaptureConfig:
    directory: Path
    sample: float = 1.0
    records: str = "full"  # or "none"
    max_file_bytes: int = 64 * 1024 * 1024
    max_file_seconds: float = 60.0
    queue_rows: int = 10_000


class Capture:
    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self._send, self._receive = trio.open_memory_channel[dict[str, Any]](config.queue_rows)
        self.dropped = 0
        self.written = 0
        config.directory.mkdir(parents=True, exist_ok=True)

    def sampled(self) -> bool:
        return self.config.sample >= 1.0 or random.random() < self.config.sample

    def offer(
        self,
        *,
        ts_start: int,
        conn_id: str,
        api_key: int,
        api_version: int,
        correlation_id: int,
        request: bytes,
        response: bytes | None,
        subrequests: list[tuple[int, bytes, bytes | None]],
        topology: Mapping[str, Any] | str,
    ) -> None:
        row = {
            "ts_start": ts_start,
            "ts_end": time.time_ns(),
            "conn_id": conn_id,
            "api_key": api_key,
            "api_version": api_version,
            "correlation_id": correlation_id,
            "request": request,
            "response": response,
            "subrequests": [{"broker": b, "request": q, "response": r} for b, q, r in subrequests],
            "topology": topology if isinstance(topology, str) else json.dumps(topology),
            "records_scrubbed": self.config.records == "none",
        }
        try:
            self._send.send_nowait(row)
        except trio.WouldBlock:
            self.dropped += 1
            metrics.CAPTURE_DROPPED.inc()

    async def run(self) -> None:
        """Write rows until cancelled; rows still queued then, and the file in progress, are completed on the way out."""
        writer = FileWriter(self.config)
        batch: list[dict[str, Any]] = []
        try:
            while True:
                batch.append(await self._receive.receive())
                with trio.move_on_after(0.5):
                    while len(batch) < 1000:
                        batch.append(await self._receive.receive())
                self._take_queued(batch)
                rows, batch = batch, []
                # Not abandoned on cancel: a write in progress finishes first.
                await trio.to_thread.run_sync(self._write, writer, rows)
        finally:
            self._take_queued(batch)
            if batch:
                self._write(writer, batch)
            writer.close()

    def _take_queued(self, batch: list[dict[str, Any]]) -> None:
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                return

    def _write(self, writer: FileWriter, rows: list[dict[str, Any]]) -> None:
        if self.config.records == "none":
            rows = [_scrubbed(r) for r in rows]
        writer.write(rows)
        self.written += len(rows)


def _scrubbed(row: dict[str, Any]) -> dict[str, Any]:
    key, version = row["api_key"], row["api_version"]
    try:
        out = {**row, "request": scrub_request(row["request"])}
        if row["response"] is not None:
            out["response"] = scrub_response(row["response"], key, version)
        out["subrequests"] = [
            {
                "broker": s["broker"],
                "request": scrub_request(s["request"]),
                "response": None if s["response"] is None else scrub_response(s["response"], key, version),
            }
            for s in row["subrequests"]
        ]
        return out
    except (Malformed, KeyError, ValueError):
        # Never store a payload we could not scrub: keep the exchange's shape only.
        return {**row, "request": b"", "response": None, "subrequests": []}


class FileWriter:
    """Parquet files rotated by size and age; finished ones renamed into place."""

    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self._writer: Any = None
        self._path: Path | None = None
        self._opened = 0.0
        self._bytes = 0
        self._seq = 0

    def write(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is not None and (
            self._bytes >= self.config.max_file_bytes or time.monotonic() - self._opened >= self.config.max_file_seconds
        ):
            self.close()
        if self._writer is None:
            self._seq += 1
            name = f"capture-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{self._seq:04d}.parquet"
            self._path = self.config.directory / name
            self._writer = pq.ParquetWriter(str(self._path) + ".inprogress", arrow_schema())
            self._opened = time.monotonic()
            self._bytes = 0
        table = pa.Table.from_pylist(rows, schema=arrow_schema())
        self._writer.write_table(table)
        self._bytes += table.nbytes

    def close(self) -> None:
        if self._writer is None or self._path is None:
            return
        self._writer.close()
        os.replace(str(self._path) + ".inprogress", self._path)
        log.info("capture file %s complete", self._path.name)
        self._writer = None


def read_capture(directory: Path) -> Any:
    """Every complete capture file in ``directory`` as one Arrow table (partial files skipped)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = []
    for path in sorted(Path(directory).glob("*.parquet")):
        try:
            tables.append(pq.read_table(path, schema=arrow_schema()))
        except (OSError, pa.ArrowInvalid) as e:
            log.warning("skipping unreadable capture file %s: %s", path, e)
    return pa.concat_tables(tables) if tables else arrow_schema().empty_table()
