"""TLS contexts for kfan's two sides, and what a TLS peer is called.

Certificates, keys and CA bundles are files that change under kfan (a
rotated Kubernetes Secret): :class:`ServerTLS` (clients) and
:class:`BrokerTLS` (brokers) build a fresh context when they change, for new
connections; connections already open keep theirs.
The broker side checks every broker's certificate against its advertised host
(or one configured name), always.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .files import WatchedFile

log = logging.getLogger("kfan.tls")


def _server_context(paths: tuple[Path, Path, Path | None]) -> ssl.SSLContext:
    cert, key, client_ca = paths
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    if client_ca is not None:
        ctx.load_verify_locations(cafile=str(client_ca))
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


class _WatchedContext:
    """An SSL context current with its files: rebuilt, for new connections, when any of them changes."""

    def __init__(self, files: list[Path | None], build: Callable[[], ssl.SSLContext]) -> None:
        self._build = build
        self._watched = [WatchedFile(p, lambda p: p.read_bytes()) for p in files if p is not None]
        self._stamps: list[Any] = []
        self._context: ssl.SSLContext | None = None
        self.context()

    def context(self) -> ssl.SSLContext:
        stamps = [w.stamp for w in self._watched]
        if self._context is None or stamps != self._stamps:
            try:
                context = self._build()
            except (OSError, ssl.SSLError) as e:
                if self._context is None:
                    raise
                # A half-written rotation (new cert, old key): keep the last good pair.
                log.warning("TLS: keeping the previous certificates, the new files do not load: %r", e)
                self._stamps = stamps
                return self._context
            if self._context is not None:
                log.info("TLS: certificate files changed; new connections use them")
            self._context, self._stamps = context, stamps
        return self._context


class ServerTLS(_WatchedContext):
    """The client listener's TLS: ``context()`` is current with the files on disk."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None) -> None:
        self.requires_client_certificate = client_ca is not None
        super().__init__([cert, key, client_ca], lambda: _server_context((cert, key, client_ca)))


class BrokerTLS(_WatchedContext):
    """kfan as a TLS client of the brokers: their certificates checked against ``ca`` (the system's CAs by default)."""

    def __init__(self, ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> None:
        super().__init__([ca, cert, key], lambda: broker_context(ca, cert, key))


def broker_context(ca: Path | None = None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca) if ca is not None else None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True  # never off: a name kfan cannot check is named with --broker-tls-server-name
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def principal_of(peer_certificate: Mapping[str, Any] | None) -> str | None:
    """A client certificate's subject as Kafka names an SSL principal: RFC 2253, most specific first ("CN=app,O=Org")."""
    if not peer_certificate or "subject" not in peer_certificate:
        return None
    rdns = []
    for rdn in reversed(peer_certificate["subject"]):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns) or None


_SHORT = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def looks_like_tls(data: bytes | bytearray | memoryview) -> bool:
    """The first bytes of a TLS ClientHello (a handshake record, SSL 3.0 to TLS 1.3 record versions)."""
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04
