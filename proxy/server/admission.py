"""Which accepted connections are served, and how they get in (trio).

:func:`serve_client` is the listener's handler. A connection past
``--max-connections`` is closed at once, as a broker over
``max.connections`` does. Until it has logged in (a SASL login, else its TLS
handshake), a connection counts against its address's cap of connections not
logged in yet (:mod:`.prelogin`). On a TLS listener it must complete its
handshake within ``frame_timeout``; its certificate names its principal.
Then it is served (:class:`proxy.server.connection.ClientConnection`) and counted in
the registry (:mod:`.registry`) while it runs.

Boundaries: what happens once a connection is served, its login included,
is the connection's; this module decides only whether and how it starts.
"""

from __future__ import annotations

import logging
import math
import ssl

import trio

from backends.cluster import Cluster
from proxy.capture.recorder import Capture
from proxy.core import Identity
from proxy.runtime import metrics
from proxy.runtime.budget import MemoryPool
from proxy.runtime.telemetry import ClientTelemetry
from proxy.security.tls import ServerTLS, principal_of
from proxy.server.audit_events import connection_event
from proxy.server.client_auth import ClientAuthConfig
from proxy.server.connection import ClientConnection, Limits
from proxy.server.governance import Governance
from proxy.server.prelogin import Admitted, PreLogin, host_of
from proxy.server.quotas import Quotas
from proxy.server.registry import Connections

log = logging.getLogger("kfan.connection")
_refused_logged_at = -math.inf  # when a refusal past --max-connections was last logged


async def serve_client(
    stream: trio.abc.Stream,
    cluster: Cluster,
    identity: Identity,
    limits: Limits,
    registry: Connections | None = None,
    capture: Capture | None = None,
    pool: MemoryPool | None = None,
    *,
    tls: ServerTLS | None = None,
    auth: ClientAuthConfig | None = None,
    prelogin: PreLogin | None = None,
    telemetry: ClientTelemetry | None = None,
    governance: Governance | None = None,
    quotas: Quotas | None = None,
) -> None:
    if registry is not None and len(registry) >= limits.max_connections:
        # As a broker over max.connections: the new connection is closed at once.
        metrics.CLIENT_CLOSES.labels("max_connections").inc()
        global _refused_logged_at
        now = trio.current_time()
        if now - _refused_logged_at >= 10:  # a connection storm must not flood the log
            _refused_logged_at = now
            log.warning("refusing client connections: %d open, the limit (--max-connections)", len(registry))
        await trio.aclose_forcefully(stream)
        return
    peer = peer_of(stream)
    # Until it has logged in (a SASL login, else its TLS handshake), the connection counts against its address's cap.
    admitted = (prelogin or PreLogin(limits.login)).admit(host_of(peer))
    if admitted is None:
        await trio.aclose_forcefully(stream)
        return
    try:
        await _serve_admitted(
            stream, cluster, identity, limits, registry, capture, pool, tls, auth, peer, admitted, telemetry, governance, quotas
        )
    finally:
        admitted.leave()


async def _serve_admitted(
    stream: trio.abc.Stream,
    cluster: Cluster,
    identity: Identity,
    limits: Limits,
    registry: Connections | None,
    capture: Capture | None,
    pool: MemoryPool | None,
    tls: ServerTLS | None,
    auth: ClientAuthConfig | None,
    peer: str,
    admitted: Admitted,
    telemetry: ClientTelemetry | None,
    governance: Governance | None,
    quotas: Quotas | None,
) -> None:
    principal = None
    if tls is not None:
        secured, refused = await _tls_handshake(stream, tls, peer, limits.frame_timeout)
        if secured is None:
            if refused and governance is not None and governance.audit is not None:  # a refused certificate, for the audit log
                governance.audit.offer("connection", connection_event("refused", 0, peer, None, mechanism="TLS", reason="tls_handshake"))
            return
        stream = secured
        principal = principal_of(secured.getpeercert())
        if principal is not None:
            metrics.AUTHENTICATIONS.labels("mTLS", "ok").inc()
            log.info("client at %s: TLS client certificate of %s", peer, principal)
    if auth is None:
        admitted.leave()  # no SASL login to wait for: the client is in
    conn = ClientConnection(
        stream,
        cluster,
        identity,
        limits,
        capture,
        pool,
        auth=auth,
        peer=peer,
        principal=principal,
        admitted=admitted,
        telemetry=telemetry,
        governance=governance,
        quotas=quotas,
    )
    log.debug("client %s connected from %s", conn.id, peer)
    metrics.CLIENT_CONNECTIONS.inc()
    try:
        if registry is None:
            await conn.run()
        else:
            with registry.track(conn):
                await conn.run()
    finally:
        metrics.CLIENT_CONNECTIONS.dec()
    log.debug("client %s gone", conn.id)


async def _tls_handshake(
    stream: trio.abc.Stream, tls: ServerTLS, peer: str, timeout: float
) -> tuple[trio.SSLStream[trio.abc.Stream] | None, bool]:
    """The client's TLS, or None (closed) when there is none, and whether kfan refused it.

    A failed handshake (a plaintext client, a bad or missing certificate, a timeout) is refused and
    logged as a warning. A client that closes its connection before the handshake ends (a TCP health
    check, a client shutting down while it connects) was not refused: as Kafka's brokers do, kfan
    takes that as a disconnect and logs it at debug level only, so probes do not fill the log.
    """
    secured = trio.SSLStream(stream, tls.context(), server_side=True)
    try:
        with trio.fail_after(timeout):
            await secured.do_handshake()
        return secured, False
    except (trio.BrokenResourceError, trio.TooSlowError, OSError) as e:
        cause = e.__cause__ if isinstance(e, trio.BrokenResourceError) and e.__cause__ is not None else e
        await trio.aclose_forcefully(stream)
        if isinstance(cause, (ssl.SSLEOFError, ConnectionResetError, BrokenPipeError)):
            log.debug("client at %s: closed its connection during the TLS handshake (%r)", peer, cause)
            return None, False
        text = getattr(cause, "reason", None) or repr(cause)
        hint = ""
        if isinstance(e, trio.TooSlowError):
            text = f"not completed within {timeout:.0f} s (--frame-timeout)"
        elif text in ("WRONG_VERSION_NUMBER", "HTTP_REQUEST", "RECORD_LAYER_FAILURE"):
            hint = " (a plaintext client on the TLS listener?)"
        elif "CERTIFICATE" in str(text).upper():
            metrics.AUTHENTICATIONS.labels("mTLS", "failed").inc()
        log.warning("client at %s: TLS handshake failed, closing: %s%s", peer, text, hint)
        metrics.CLIENT_CLOSES.labels("tls_handshake").inc()
        return None, True


def peer_of(stream: trio.abc.Stream) -> str:
    """The client's address, "host:port", for the log ("?" for streams without a socket)."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    sock = getattr(stream, "socket", None)
    if sock is None:
        return "?"
    try:
        host, port = sock.getpeername()[:2]
    except (AttributeError, OSError, ValueError, TypeError):
        return "?"
    return f"{host}:{port}"
