"""kfan governing its clients: the ACL file it authorizes with, and what becomes of each decision (trio).

With ``--authorizer acls`` every client request is judged by the ACLs of
``--acl-file`` (the core's :mod:`proxy.core.authorize`), as its principal at
kfan from its address. The file is read at start (invalid: kfan does not
start) and again whenever it changes (checked every ``--acl-file-check``
seconds, which also follows a Kubernetes ConfigMap's symlink swap) or on
SIGHUP; an invalid file then keeps the ACLs in force, with a log line and
``kfan_acl_reloads_total{result="invalid"}``. Requests in flight keep the
ACLs they were judged by; the next request of every connection sees the new.

Each decision is counted (``kfan_authorization_decisions_total``) and logged
as ``--authorizer-log`` says (denied, the default, at INFO; all; none), the way
Kafka's ``kafka.authorizer.logger`` does.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from proxy.core.acls import Access, AclFileError, Acls, Decision, parse_acls, user_principal
from proxy.kafka.headers import RequestHeader
from proxy.runtime import metrics
from proxy.runtime.audit import Audit
from proxy.runtime.logtext import printable
from proxy.security.files import read_toml
from proxy.server.audit_events import connection_event, request_event
from proxy.server.ordering import ResponseSlot
from proxy.server.prelogin import host_of

log = logging.getLogger("kfan.authorizer")


def read_acls(path: Path) -> Acls:
    """The ACLs a file states; raises :class:`ValueError` saying what is wrong with it."""
    return read_toml(path, parse_acls, AclFileError)


class AclFile:
    """The ACLs in force, from a file, re-read when it changes."""

    def __init__(self, path: Path, check_interval: float = 2.0) -> None:
        self.path = path
        self.check_interval = check_interval
        self._stamp = self._stat()
        self.acls = read_acls(path)  # raises: kfan does not start on an invalid file
        metrics.ACL_BINDINGS.set(len(self.acls))
        log.info("ACLs from %s: %d bindings, %d super users", path, len(self.acls), len(self.acls.super_users))

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def switch(self, path: Path, check_interval: float) -> None:
        """Another file (a reload moved --acl-file); raises :class:`ValueError` for an invalid one, changing nothing."""
        acls = read_acls(path)
        self.path, self.check_interval = path, check_interval
        self._stamp = self._stat()
        self.acls = acls
        metrics.ACL_RELOADS.labels("ok").inc()
        metrics.ACL_BINDINGS.set(len(acls))
        log.info("ACLs from %s: %d bindings, %d super users", path, len(acls), len(acls.super_users))

    def reload(self) -> bool:
        """Read the file again: True when its ACLs are now in force; False keeps the previous ones (logged)."""
        self._stamp = self._stat()
        try:
            acls = read_acls(self.path)
        except ValueError as e:
            metrics.ACL_RELOADS.labels("invalid").inc()
            log.error("ACL file not reloaded, the previous ACLs (%d bindings) stay in force: %s", len(self.acls), e)
            return False
        self.acls = acls
        metrics.ACL_RELOADS.labels("ok").inc()
        metrics.ACL_BINDINGS.set(len(acls))
        log.info("ACLs reloaded from %s: %d bindings, %d super users", self.path, len(acls), len(acls.super_users))
        return True

    async def watch(self) -> None:
        """Re-read the file whenever it changes (its time, size or inode), for ever."""
        while True:
            await trio.sleep(self.check_interval)
            if self._stat() != self._stamp:
                await trio.to_thread.run_sync(self.reload)


@dataclass
class Governance:
    """What kfan does to govern its clients: authorize (``acl_file``), log decisions, audit (``audit``)."""

    acl_file: AclFile | None = None
    decision_log: str = "denied"  # denied | all | none
    audit: Audit | None = None

    def access(self, principal: str | None, host: str) -> Access | None:
        """How a client is judged (None: kfan authorizes nothing)."""
        if self.acl_file is None:
            return None
        return Access(self.acl_file.acls, user_principal(principal), host)

    def reconfigure(self, options: Mapping[str, Any]) -> None:
        """Reloaded options: the ACL file (read again, or another), what is logged, what is audited and how."""
        if self.acl_file is not None:
            if options["acl_file"] != self.acl_file.path:
                self.acl_file.switch(options["acl_file"], options["acl_file_check"])
            else:
                self.acl_file.check_interval = options["acl_file_check"]
                self.acl_file.reload()
        self.decision_log = options["authorizer_log"]
        if self.audit is not None:
            # Connections opened before keep the set of APIs they name resources for; their events follow the new set.
            self.audit.apis = options["audit_apis"]
            self.audit.queue_events = options["audit_queue_events"]
            self.audit.block = options["audit_overflow"] == "block"

    def decided(self, hdr: RequestHeader, access: Access, decisions: Sequence[Decision]) -> None:
        """Count and log one request's decisions."""
        api = str(hdr.api_key)
        for d in decisions:
            result = "allowed" if d.allowed else "denied"
            metrics.AUTHORIZATION_DECISIONS.labels(api, d.operation.name, d.resource_type.name, result).inc()
            if self.decision_log == "all" or (self.decision_log == "denied" and not d.allowed):
                log.info(
                    "Principal = %s is %s operation = %s from host = %s on resource = %s:%s (api_key=%s correlation_id=%s)",
                    printable(access.principal),
                    "Allowed" if d.allowed else "Denied",
                    d.operation.name,
                    access.host,
                    d.resource_type.name,
                    printable(d.name),
                    hdr.api_key,
                    hdr.correlation_id,
                )


class ClientGovernance:
    """One client connection's part in governance: how its requests are judged, and what the audit log is told."""

    def __init__(self, governance: Governance, connection: int, peer: str, principal: Callable[[], str]) -> None:
        """``principal``: who the client is at kfan as it stands (its login, its certificate; "" when neither)."""
        self.governance = governance
        self.audit = governance.audit
        self.connection = connection
        self.peer = peer
        self.host = host_of(peer)
        self._principal = principal
        self.requests = 0  # planned
        self.client_id: str | None = None  # the latest request's
        self.software = ("", "")  # the client's software name and version (its ApiVersions, read by the planner)
        self.opened = trio.current_time()

    def access(self) -> Access | None:
        """How the client's next request is judged (None: kfan authorizes nothing)."""
        return self.governance.access(self._principal(), self.host)

    async def before_request(self) -> None:
        """Until the audit log has room (``--audit-overflow block``; at once otherwise)."""
        if self.audit is not None:
            await self.audit.wait_room()

    def planned(self, hdr: RequestHeader, access: Access | None, decisions: Sequence[Decision]) -> None:
        self.requests += 1
        self.client_id = hdr.client_id
        if access is not None and decisions:
            self.governance.decided(hdr, access, decisions)

    async def answered(
        self,
        hdr: RequestHeader,
        judged: bool,
        decisions: Sequence[Decision],
        errors: Mapping[tuple[int, int], int],
        bytes_in: int,
        slot: ResponseSlot,
    ) -> None:
        """The request's audit event, when its API is audited (``slot``: its answer, in the response order)."""
        if self.audit is None or not self.audit.audits(hdr.api_key):
            return
        who = user_principal(self._principal())
        out = sum(len(p) for p in slot.parts) + 4 if slot.parts is not None else 0
        latency = trio.current_time() - slot.started
        await self.audit.put(
            "request", request_event(hdr, self.connection, self.peer, who, decisions, judged, errors, bytes_in, out, latency)
        )

    def connection_event(self, event: str, **fields: Any) -> None:
        """A connection event for the audit log (never waits: a connection's end must not)."""
        if self.audit is None:
            return
        known = event != "connection.opened" or self._principal()
        who = user_principal(self._principal()) if known else None
        if event == "connection.closed":
            fields.update(requests=self.requests, duration_s=round(trio.current_time() - self.opened, 3))
        name, version = self.software
        details = {"client_id": self.client_id, "software_name": name or None, "software_version": version or None, **fields}
        self.audit.offer("connection", connection_event(event.removeprefix("connection."), self.connection, self.peer, who, **details))
        if event == "connection.opened" and fields.get("mechanism") == "mTLS":  # its certificate authenticated it already
            self.connection_event("connection.authenticated", mechanism="mTLS")
