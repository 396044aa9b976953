"""A client's TLS handshake on kfan's listener: refused (a warning, counted) or merely left (debug only).

In-process, over trio's memory streams: the handshake sees exactly the bytes and the close each
case sends, with no sockets or timing in between.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing
import trustme
from prometheus_client import REGISTRY

from proxy.security.tls import ServerTLS
from proxy.server.admission import _tls_handshake

API_VERSIONS = bytes.fromhex("0000000f0012000000000001000568656c6c6f")  # a plaintext client's first request


@pytest.fixture
def server_tls(tmp_path: Path) -> ServerTLS:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    return ServerTLS(tmp_path / "cert.pem", tmp_path / "key.pem")


def _refusals() -> float:
    return REGISTRY.get_sample_value("kfan_client_connections_closed_total", {"reason": "tls_handshake"}) or 0.0


async def _handshake_against(server_tls: ServerTLS, client_does: bytes | None) -> tuple[object, bool]:
    """The server's handshake while the client sends ``client_does`` (None: nothing) and closes."""
    client, server = trio.testing.memory_stream_pair()
    result: list[tuple[object, bool]] = []

    async def serve() -> None:
        result.append(await _tls_handshake(server, server_tls, "203.0.113.7:5000", timeout=30))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        if client_does is not None:
            await client.send_all(client_does)
        await client.aclose()
    return result[0]


async def test_a_client_that_closes_during_the_handshake_has_left_and_was_not_refused(
    server_tls: ServerTLS, caplog: pytest.LogCaptureFixture
) -> None:
    # A TCP health check, or a client shut down while it connects: Kafka's brokers log that as a disconnect.
    before = _refusals()
    with caplog.at_level(logging.DEBUG, logger="kfan.connection"):
        secured, refused = await _handshake_against(server_tls, None)
    assert secured is None and refused is False
    assert [r.levelno for r in caplog.records] == [logging.DEBUG], caplog.text
    assert "closed its connection during the TLS handshake" in caplog.text
    assert _refusals() == before


async def test_a_plaintext_client_is_refused_with_a_warning_naming_it(server_tls: ServerTLS, caplog: pytest.LogCaptureFixture) -> None:
    before = _refusals()
    with caplog.at_level(logging.DEBUG, logger="kfan.connection"):
        secured, refused = await _handshake_against(server_tls, API_VERSIONS)
    assert secured is None and refused is True
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "client at 203.0.113.7:5000: TLS handshake failed, closing: WRONG_VERSION_NUMBER (a plaintext client on the TLS listener?)"
    ]
    assert _refusals() == before + 1
