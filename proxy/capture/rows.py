"""The capture format: one :class:`CaptureRow` per client exchange, in Parquet files.

:class:`CaptureRow` is the one place the columns are spelled: their names
(:data:`COLUMNS`), their Arrow types (:func:`arrow_schema`), and the
conversion to and from the plain form files, Arrow and Spark hold
(:meth:`CaptureRow.to_dict`, :meth:`CaptureRow.from_dict`). Every writer
(the recorder, ``kfan capture import``) builds rows through it; every reader
(live replay, the Spark checks) reads them back through it.

Files are written as ``*.parquet.inprogress`` and renamed to ``*.parquet``
when complete (:class:`FileWriter`), so readers (:func:`read_capture`,
:func:`read_rows`) skip the one still being written. :func:`scrubbed` empties
every record batch of a row (``kfan serve --capture-records none``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.core.topology import Topology
from proxy.kafka import schema
from proxy.kafka.headers import decode_request, decode_response, response_body_offset
from proxy.kafka.wire import Malformed

log = logging.getLogger("kfan.capture")

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_FILE_SECONDS = 60.0

# One sub-request: the broker's node id, the frame sent to it and the one it
# answered (None: failed, or not in when the client was answered); frame
# payloads without their size prefix.
Subrequest = tuple[int, bytes, bytes | None]
SUBREQUEST_FIELDS = ("broker", "request", "response")


def _column(arrow: Callable[[Any], Any], **kwargs: Any) -> Any:
    """A field of :class:`CaptureRow` with its Arrow type (``arrow(pyarrow)``), spelled next to it."""
    return field(metadata={"arrow": arrow}, **kwargs)


def _subrequests_type(pa: Any) -> Any:
    broker, request, response = SUBREQUEST_FIELDS
    return pa.list_(pa.struct([(broker, pa.int32()), (request, pa.binary()), (response, pa.binary())]))


@dataclass(frozen=True, slots=True)
class CaptureRow:
    """One client exchange as kfan saw it (or as a tcpdump of direct traffic showed it)."""

    ts_start: int = _column(lambda pa: pa.int64())  # ns since the epoch: the request was read
    ts_end: int = _column(lambda pa: pa.int64())  # ns since the epoch: the response was ready
    conn_id: str = _column(lambda pa: pa.string())
    api_key: int = _column(lambda pa: pa.int16())
    api_version: int = _column(lambda pa: pa.int16())
    correlation_id: int = _column(lambda pa: pa.int32())
    request: bytes = _column(lambda pa: pa.binary())  # the client's frame payload
    response: bytes | None = _column(lambda pa: pa.binary())  # None: no answer (acks=0 Produce)
    subrequests: list[Subrequest] = _column(_subrequests_type, default_factory=list)
    # The topology the request was planned with, and kfan's identity (see topology_document); a JSON string in files.
    topology: dict[str, Any] = _column(lambda pa: pa.string(), default_factory=dict)
    records_scrubbed: bool = _column(lambda pa: pa.bool_(), default=False)

    def to_dict(self) -> dict[str, Any]:
        """The row as files, Arrow and Spark hold it: sub-requests as structs, the topology as JSON."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["subrequests"] = [dict(zip(SUBREQUEST_FIELDS, s, strict=True)) for s in self.subrequests]
        out["topology"] = _document_json(self.topology)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaptureRow:
        """A row from its plain form (Arrow's ``to_pylist``, Spark's ``asDict``); missing optional columns take defaults."""
        subrequests = [_subrequest(s) for s in d.get("subrequests") or ()]
        topology = d.get("topology") or {}
        response = d["response"]
        return cls(
            ts_start=int(d["ts_start"]),
            ts_end=int(d.get("ts_end", d["ts_start"])),
            conn_id=str(d["conn_id"]),
            api_key=int(d["api_key"]),
            api_version=int(d["api_version"]),
            correlation_id=int(d["correlation_id"]),
            request=bytes(d["request"] or b""),
            response=None if response is None else bytes(response),
            subrequests=subrequests,
            topology=json.loads(topology) if isinstance(topology, str) else dict(topology),
            records_scrubbed=bool(d.get("records_scrubbed")),
        )

    @property
    def imported(self) -> bool:
        """From a tcpdump of direct client-broker traffic (``kfan capture import``): no frame of it is kfan's."""
        return self.topology.get("source") == "pcap"

    @property
    def kfan_identity(self) -> tuple[int, str, int]:
        """(node id, host, port): kfan as its clients saw it (in an import, the broker answering)."""
        kfan = self.topology.get("kfan") or {}
        return int(kfan.get("node_id", 0)), str(kfan.get("host", "")), int(kfan.get("port", 0))

    def cluster(self) -> Topology:
        """The topology the request was planned with."""
        return Topology.from_json(json.dumps(self.topology))


def _subrequest(s: Any) -> Subrequest:
    broker, request, response = (s[k] for k in SUBREQUEST_FIELDS) if isinstance(s, Mapping) else s
    return int(broker), bytes(request), None if response is None else bytes(response)


COLUMNS = tuple(f.name for f in dataclasses.fields(CaptureRow))


def arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema([(f.name, f.metadata["arrow"](pa)) for f in dataclasses.fields(CaptureRow)])


# The topology documents made last and their JSON, with what each was made from: (topology, (node id, host, port,
# source), document, JSON). Topologies are immutable snapshots, replaced only when an answer changes one, so the
# exchanges captured with one snapshot share its document: made for each, it cost about 1.8 ms on the event loop
# and 0.6 ms more in the writer for 1,000 partitions, and capture saturated kfan in the metadata storm test. Several
# are kept: while brokers disagree (a failover), answers switch the topology back and forth between a few
# snapshots (the cluster reuses an equal one it held: backends.cluster), and the writer reaches a row after newer
# ones came. One tuple, replaced whole: the writer thread reads it while the event loop may replace it.
_DOCUMENTS_KEPT = 8
_Document = tuple[Topology, tuple[int, str, int, "str | None"], dict[str, Any], str]
_documents: tuple[_Document, ...] = ()


def topology_document(topology: Topology, node_id: int, host: str, port: int, *, source: str | None = None) -> dict[str, Any]:
    """A row's ``topology``: the cluster as planned with, plus kfan's identity (replay rewrites answers with it).

    ``source="pcap"`` marks an imported tcpdump, where the broker answering stands where kfan would. The
    same document is returned for the same snapshot and identity: rows share it, and nothing may change it.
    """
    global _documents
    made_from = (node_id, host, port, source)
    kept = _documents
    for t, f, doc, _ in kept:
        if t is topology and f == made_from:
            return doc
    doc = {**json.loads(topology.to_json()), "kfan": {"node_id": node_id, "host": host, "port": port}}
    if source is not None:
        doc["source"] = source
    _documents = ((topology, made_from, doc, json.dumps(doc)), *kept[: _DOCUMENTS_KEPT - 1])
    return doc


def _document_json(doc: dict[str, Any]) -> str:
    for _, _, d, text in _documents:
        if d is doc:
            return text
    return json.dumps(doc)


# --- scrubbing ------------------------------------------------------------------


def _without_records(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (b"" if k == "records" and v is not None else _without_records(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_records(v) for v in value]
    return value


def scrub_request(payload: bytes) -> bytes:
    """A request frame payload with every record batch emptied (header kept byte for byte)."""
    hdr, body = decode_request(payload)
    spec = schema.request_spec(hdr.api_key, hdr.api_version)
    return bytes(payload[: hdr.body_offset]) + b"".join(bytes(p) for p in schema.encode_body(spec, _without_records(body)))


def scrub_response(payload: bytes, api_key: int, api_version: int) -> bytes:
    """A response frame payload with every record batch emptied (header kept byte for byte)."""
    body = decode_response(payload, api_key, api_version)
    spec = schema.response_spec(api_key, api_version)
    offset = response_body_offset(payload, api_key, api_version)
    return bytes(payload[:offset]) + b"".join(bytes(p) for p in schema.encode_body(spec, _without_records(body)))


def scrubbed(row: CaptureRow) -> CaptureRow:
    """``row`` with every record batch emptied; a row that does not scrub keeps only its exchange's shape."""
    key, version = row.api_key, row.api_version
    try:
        return dataclasses.replace(
            row,
            request=scrub_request(row.request),
            response=None if row.response is None else scrub_response(row.response, key, version),
            subrequests=[
                (broker, scrub_request(request), None if response is None else scrub_response(response, key, version))
                for broker, request, response in row.subrequests
            ],
            records_scrubbed=True,
        )
    except (Malformed, KeyError, ValueError):
        # Never store a payload we could not scrub.
        return dataclasses.replace(row, request=b"", response=None, subrequests=[], records_scrubbed=True)


# --- files ------------------------------------------------------------------------


class FileWriter:
    """Parquet files of rows in ``directory``, rotated by size and age; finished ones renamed into place."""

    def __init__(
        self, directory: Path, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, max_file_seconds: float = DEFAULT_MAX_FILE_SECONDS
    ) -> None:
        self.directory = Path(directory)
        self.max_file_bytes = max_file_bytes
        self.max_file_seconds = max_file_seconds
        self._writer: Any = None
        self._path: Path | None = None
        self._opened = 0.0
        self._bytes = 0
        self._seq = 0

    def write(self, rows: Iterable[CaptureRow]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._writer is not None and (self._bytes >= self.max_file_bytes or time.monotonic() - self._opened >= self.max_file_seconds):
            self.close()
        if self._writer is None:
            self._seq += 1
            name = f"capture-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{self._seq:04d}.parquet"
            self._path = self.directory / name
            self._writer = pq.ParquetWriter(str(self._path) + ".inprogress", arrow_schema())
            self._opened = time.monotonic()
            self._bytes = 0
        table = pa.Table.from_pylist([r.to_dict() for r in rows], schema=arrow_schema())
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


def read_rows(directory: Path) -> list[CaptureRow]:
    """Every row of every complete capture file in ``directory``."""
    return [CaptureRow.from_dict(d) for d in read_capture(directory).to_pylist()]
