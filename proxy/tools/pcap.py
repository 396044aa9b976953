"""Import a tcpdump of direct client-to-broker Kafka traffic as a kfan capture.

Traffic recorded without kfan (``tcpdump -w``) becomes rows of the capture
format (:class:`~proxy.capture.rows.CaptureRow`), so the replay checks it
like kfan's own: each TCP connection to one of the broker ports is
reassembled per direction, cut into frames by the one frame reader
(:class:`proxy.kafka.frames.FrameReader`, sizes bounded as on the data
path), and each request paired with its response by correlation id (Kafka
answers in order on a connection; ``acks=0`` Produce gets none). Every
exchange becomes one row whose single
sub-request is the client's request to that broker, with the broker's
answer, and whose topology is the cluster as the latest Metadata answer in
the file (before the exchange, else the first after it) described it, with
that broker standing where kfan would.

Packet decoding is dpkt's (pcap and pcapng; Ethernet, Linux cooked v1/v2,
BSD loopback and raw IP links). Reassembly orders segments by sequence
number and drops retransmitted bytes; a stream with a hole ends at the hole.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from proxy.capture.rows import CaptureRow, FileWriter, topology_document
from proxy.core.topology import Topology
from proxy.kafka import apis
from proxy.kafka.frames import DEFAULT_MAX_FRAME_BYTES, MIN_REQUEST_FRAME, MIN_RESPONSE_FRAME, FrameReader
from proxy.kafka.headers import decode_response, parse_request_header
from proxy.kafka.wire import Malformed

log = logging.getLogger("kfan.pcap")

Endpoint = tuple[str, int]


@dataclass
class _Direction:
    """One direction of a TCP connection: segments by relative sequence number."""

    isn: int | None = None
    segments: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # offset -> (payload, ts ns)

    def add(self, seq: int, syn: bool, payload: bytes, ts: int) -> None:
        if syn:
            self.isn = (seq + 1) & 0xFFFFFFFF
            return
        if not payload:
            return
        if self.isn is None:  # capture started mid-connection
            self.isn = seq
        offset = (seq - self.isn) & 0xFFFFFFFF
        if offset >= 1 << 31:  # before the stream start: a retransmission of bytes we do not have
            return
        known = self.segments.get(offset)
        if known is None or len(known[0]) < len(payload):
            self.segments[offset] = (payload, ts)

    def stream(self) -> tuple[bytes, list[tuple[int, int]]]:
        """The contiguous bytes from the start, and (stream offset, ts) where each segment begins."""
        out = bytearray()
        times: list[tuple[int, int]] = []
        for offset in sorted(self.segments):
            payload, ts = self.segments[offset]
            if offset > len(out):
                log.warning("TCP stream has a %d-byte hole at offset %d; the rest is skipped", offset - len(out), len(out))
                break
            fresh = payload[len(out) - offset :]
            if fresh:
                times.append((len(out), ts))
                out += fresh
        return bytes(out), times


def _time_at(times: list[tuple[int, int]], position: int) -> int:
    """When the byte at ``position`` of a stream arrived."""
    ts = times[0][1] if times else 0
    for offset, t in times:
        if offset > position:
            break
        ts = t
    return ts


def _frames(data: bytes, times: list[tuple[int, int]], min_frame_bytes: int) -> Iterator[tuple[bytes, int, int]]:
    """(payload, ts of first byte, ts of last byte) for every complete frame of a stream."""
    reader = FrameReader(DEFAULT_MAX_FRAME_BYTES, min_frame_bytes)
    reader.feed(data)
    pos = 0  # where the next frame's size prefix starts in the stream
    while True:
        try:
            payload = reader.next_frame()
        except Malformed as e:
            log.warning("stream offset %d: %s; the rest of the stream is skipped", pos, e)
            return
        if payload is None:  # the stream ends (or has a hole) inside this frame
            return
        end = pos + 4 + len(payload)
        yield payload, _time_at(times, pos), _time_at(times, end - 1)
        pos = end


def _packets(fileobj: BinaryIO) -> Iterator[tuple[int, Endpoint, Endpoint, int, bool, bytes]]:
    """(ts ns, source, destination, sequence number, SYN, payload) of every TCP segment."""
    try:
        import dpkt
    except ImportError as e:  # the pcap extra, not a dependency of serving
        raise ValueError("kfan capture import needs dpkt: pip install 'kfan[pcap]'") from e

    head = fileobj.read(4)
    fileobj.seek(0)
    reader: Any = dpkt.pcapng.Reader(fileobj) if head == b"\x0a\x0d\x0d\x0a" else dpkt.pcap.Reader(fileobj)
    link = reader.datalink()
    decoders = {
        dpkt.pcap.DLT_EN10MB: dpkt.ethernet.Ethernet,
        dpkt.pcap.DLT_LINUX_SLL: dpkt.sll.SLL,
        276: dpkt.sll2.SLL2,  # DLT_LINUX_SLL2, what `tcpdump -i any` writes
        dpkt.pcap.DLT_NULL: dpkt.loopback.Loopback,
        dpkt.pcap.DLT_LOOP: dpkt.loopback.Loopback,
        dpkt.pcap.DLT_RAW: dpkt.ip.IP,
        101: dpkt.ip.IP,  # LINKTYPE_RAW
    }
    if link not in decoders:
        raise ValueError(f"unsupported pcap link type {link}")
    decode = decoders[link]
    for ts, buf in reader:
        try:
            frame = decode(buf)
        except (dpkt.UnpackError, IndexError):
            continue
        ip = frame if isinstance(frame, dpkt.ip.IP | dpkt.ip6.IP6) else getattr(frame, "data", None)
        if not isinstance(ip, dpkt.ip.IP | dpkt.ip6.IP6) or not isinstance(ip.data, dpkt.tcp.TCP):
            continue
        family = socket.AF_INET if isinstance(ip, dpkt.ip.IP) else socket.AF_INET6
        tcp = ip.data
        src = (socket.inet_ntop(family, ip.src), tcp.sport)
        dst = (socket.inet_ntop(family, ip.dst), tcp.dport)
        yield int(round(float(ts) * 1e9)), src, dst, tcp.seq, bool(tcp.flags & dpkt.tcp.TH_SYN), bytes(tcp.data)


@dataclass
class Exchange:
    client: Endpoint
    server: Endpoint
    ts_start: int
    ts_end: int
    api_key: int
    api_version: int
    correlation_id: int
    request: bytes
    response: bytes | None


def exchanges(packets: Iterable[tuple[int, Endpoint, Endpoint, int, bool, bytes]], ports: set[int]) -> list[Exchange]:
    """Every request to a broker port paired with its response, in request order."""
    directions: dict[tuple[Endpoint, Endpoint], _Direction] = {}
    for ts, src, dst, seq, syn, payload in packets:
        if dst[1] in ports or src[1] in ports:
            directions.setdefault((src, dst), _Direction()).add(seq, syn, payload, ts)
    out: list[Exchange] = []
    for (client, server), upstream in directions.items():
        if server[1] not in ports:
            continue
        requests = list(_frames(*upstream.stream(), MIN_REQUEST_FRAME))
        downstream = directions.get((server, client))
        responses = list(_frames(*downstream.stream(), MIN_RESPONSE_FRAME)) if downstream is not None else []
        answers = iter(responses)
        pending = next(answers, None)
        for payload, ts_first, ts_last in requests:
            try:
                hdr = parse_request_header(payload)
            except Malformed as e:
                log.warning("%s:%d -> %s:%d: a request did not parse (%s); the rest of the connection is skipped", *client, *server, e)
                break
            response = None
            ts_end = ts_last
            if pending is not None and int.from_bytes(pending[0][:4], "big", signed=True) == hdr.correlation_id:
                response, _, ts_end = pending
                pending = next(answers, None)
            out.append(
                Exchange(client, server, ts_first, ts_end, hdr.api_key, hdr.api_version, hdr.correlation_id, bytes(payload), response)
            )
    out.sort(key=lambda e: e.ts_start)
    return out


def _topologies(found: list[Exchange]) -> list[tuple[int, Topology]]:
    """The cluster as each Metadata answer left it, in time order."""
    views: list[tuple[int, Topology]] = []
    topology = Topology()
    for e in sorted(found, key=lambda e: e.ts_end):
        if e.api_key != apis.METADATA or e.response is None:
            continue
        try:
            body = decode_response(e.response, e.api_key, e.api_version)
        except (Malformed, ValueError) as err:
            log.warning("a Metadata answer did not decode (%s); skipped", err)
            continue
        topology = topology.with_metadata(body)
        views.append((e.ts_end, topology))
    return views


def _broker_at(topology: Topology, server: Endpoint) -> int | None:
    """The node id listening at ``server``: by port, then by address when ports repeat."""
    candidates = [b for b in topology.brokers.values() if b.port == server[1]]
    if len(candidates) > 1:
        candidates = [b for b in candidates if _resolves_to(b.host, server[0])]
    return candidates[0].node_id if len(candidates) == 1 else None


def _resolves_to(host: str, address: str) -> bool:
    if host == address:
        return True
    try:
        return address in {a[4][0] for a in socket.getaddrinfo(host, None)}
    except OSError:
        return False


def rows(found: list[Exchange]) -> list[CaptureRow]:
    """Capture rows for exchanges to a broker the Metadata names."""
    views = _topologies(found)
    if not views:
        raise ValueError("no Metadata answer in the capture: cannot tell brokers and leaders")
    final = views[-1][1]
    out: list[CaptureRow] = []
    skipped = 0
    for e in found:
        before = [t for ts, t in views if ts <= e.ts_start]
        topology = before[-1] if before else views[0][1]
        node = _broker_at(final, e.server)
        if node is None:
            skipped += 1
            continue
        broker = final.brokers[node]
        out.append(
            CaptureRow(
                ts_start=e.ts_start,
                ts_end=e.ts_end,
                conn_id=f"pcap-{e.client[0]}:{e.client[1]}-{e.server[0]}:{e.server[1]}",
                api_key=e.api_key,
                api_version=e.api_version,
                correlation_id=e.correlation_id,
                request=e.request,
                response=e.response,
                subrequests=[(node, e.request, e.response)],
                topology=topology_document(topology, node, broker.host, broker.port, source="pcap"),
            )
        )
    if skipped:
        log.warning("%d exchanges went to an address no Metadata answer names as a broker; skipped", skipped)
    return out


def import_pcap(path: Path, ports: set[int], out: Path) -> int:
    """Write ``path``'s Kafka exchanges on ``ports`` as a capture in ``out``; the number of rows."""
    with open(path, "rb") as f:
        found = exchanges(_packets(f), ports)
    imported = rows(found)
    out.mkdir(parents=True, exist_ok=True)
    writer = FileWriter(out)
    try:
        if imported:
            writer.write(imported)
    finally:
        writer.close()
    return len(imported)
