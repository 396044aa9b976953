"""Certificates for TLS tests, made with trustme: a CA per side, server and client certificates as PEM files.

Typical use: one :class:`Authority` for the brokers' side (it signs the TLS
fronts' server certificates; kfan trusts its CA file) and another for kfan's
client side (it signs client certificates that a front requiring mTLS
verifies). Every helper writes into a directory and returns paths.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class PemFiles:
    """A certificate (leaf then chain, PEM), its private key, and the CA file of the authority that issued it."""

    cert: Path
    key: Path
    ca: Path


class Authority:
    """A certificate authority for tests; ``name`` becomes its organization name and file-name prefix."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ca = trustme.CA(organization_name=name)

    def write_ca(self, directory: Path) -> Path:
        """The CA certificate as a PEM file (what the other side trusts)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{self.name}-ca.pem"
        self.ca.cert_pem.write_to_path(str(path))
        return path

    def _write(self, directory: Path, stem: str, leaf: trustme.LeafCert) -> PemFiles:
        directory.mkdir(parents=True, exist_ok=True)
        cert = directory / f"{stem}.pem"
        key = directory / f"{stem}.key"
        cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
        leaf.private_key_pem.write_to_path(str(key))
        key.chmod(0o600)
        return PemFiles(cert, key, self.write_ca(directory))

    def server(self, directory: Path, *hosts: str, stem: str | None = None) -> PemFiles:
        """A server certificate valid for ``hosts`` (default: localhost and 127.0.0.1)."""
        hosts = hosts or ("localhost", "127.0.0.1")
        return self._write(directory, stem or f"{self.name}-server", self.ca.issue_cert(*hosts, common_name=hosts[0]))

    def client(self, directory: Path, common_name: str, stem: str | None = None) -> PemFiles:
        """A client certificate whose subject carries ``CN=common_name`` (mTLS).

        It also gets a DNS name derived from the common name: trustme always
        writes a critical subjectAltName extension, and an empty one is invalid.
        """
        slug = re.sub(r"[^a-z0-9-]+", "-", common_name.lower()).strip("-") or "client"
        leaf = self.ca.issue_cert(f"{slug}.client.test", common_name=common_name)
        return self._write(directory, stem or f"{self.name}-client-{slug}", leaf)
