"""kfan's configuration read again while it serves: on SIGHUP, and when the ``--config`` file changes.

Every option is resolved again as at start (flags and environment as they
were given, the file as it is now) and compared with what is in force:

- an option that can change live is applied (:meth:`proxy.server.serve.Running.reconfigure`
  says where: existing connections, new ones, or the whole process);
- an option that needs a restart (:data:`RESTART_ONLY`) keeps its value, with
  a log line naming it and the value kept;
- a file that cannot be read, or options that do not fit together, change
  nothing at all: the log says why.

The files options name (ACLs, quotas, users, keys, certificates) are re-read
whenever they change on disk anyway; a reload re-reads them too. Results are
counted (``kfan_config_reloads_total{result}``) and the configuration in force
has a generation (``kfan_config_generation``), one more at each reload that
changed something.

Boundaries: it reads and compares options; applying them is the server's.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from proxy.runtime import metrics
from proxy.server import config

log = logging.getLogger("kfan.reload")

# Options (by dest) only a restart changes, and why.
_LISTENERS = "kfan's listeners and the identity clients were given"
_BROKERS = "kfan's links to the brokers (the files these name are re-read when they change)"
RESTART_ONLY: dict[str, str] = {
    "bootstrap": _BROKERS,
    "listen": _LISTENERS,
    "advertise": _LISTENERS,
    "node_id": _LISTENERS,
    "broker_ids": _LISTENERS,
    "broker_port_base": _LISTENERS,
    "metrics_listen": _LISTENERS,
    "workers": "the worker processes",
    "reuse_port": _LISTENERS,
    "max_inflight": "each connection's bound on requests in flight is set when it opens; restart, or let connections recycle",
    "rack": "the zone kfan fetches from",
    "read_replica_max_age": "the zone kfan fetches from",
    "capture": "the capture writer",
    "capture_sample": "the capture writer",
    "capture_records": "the capture writer",
    "telemetry_subscriptions": "client telemetry (its metrics are registered at start)",
    "telemetry_max_bytes": "client telemetry",
    "telemetry_max_client_instances": "client telemetry",
    "authorizer": "whether kfan authorizes (the ACL file itself is re-read live)",
    "audit_log": "the audit sink (SIGHUP reopens the file)",
    "audit_topic": "the audit sink",
    "broker_tls": _BROKERS,
    "broker_tls_ca": _BROKERS,
    "broker_tls_cert": _BROKERS,
    "broker_tls_key": _BROKERS,
    "broker_tls_server_name": _BROKERS,
    "broker_sasl_mechanism": _BROKERS,
    "broker_sasl_username": _BROKERS,
    "broker_sasl_password_file": _BROKERS,
    "broker_sasl_password": _BROKERS,
    "broker_sasl_token_file": _BROKERS,
    "broker_identity": _BROKERS,
    "client_auth": "how clients log in (the users file, JWKS and certificates are re-read live)",
    "log_json": "the log's format",
}


def _shown(name: str, value: Any) -> str:
    return "(secret)" if "password" in name else repr(value)


class Reloader:
    """The options in force, and their re-reading (:meth:`reload`), applied by ``apply(options, changed)``.

    ``apply`` raises :class:`ValueError` (or :class:`OSError`) for options that do not fit together, before it
    changes anything.
    """

    def __init__(
        self,
        flags: Mapping[str, Any],
        env: Mapping[str, str],
        options: Mapping[str, Any],
        apply: Callable[[Mapping[str, Any], frozenset[str]], None],
        check_interval: float = 2.0,
        adjust: Callable[[dict[str, Any]], dict[str, Any]] = lambda options: options,
    ) -> None:
        """``adjust``: what the process does to options as resolved, at start and at each reload."""
        self._flags = dict(flags)
        self._env = dict(env)
        self.options = dict(options)
        self._apply = apply
        self._adjust = adjust
        self.check_interval = check_interval
        path = self._flags.get("config") or self._env.get("KFAN_CONFIG")
        self.path = Path(path) if path else None
        self._stamp = self._stat()
        self.generation = 1
        metrics.CONFIG_GENERATION.set(self.generation)

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, why: str) -> str:
        """Read the configuration again and apply what changed; the result (ok, unchanged, restart_needed, invalid)."""
        self._stamp = self._stat()
        try:
            fresh = self._adjust(config.resolve(self._flags, self._env))
        except (OSError, ValueError) as e:
            return self._done("invalid", f"{why}: the configuration was not reloaded, the one in force stays whole: {e}")
        changed = {name for name, value in fresh.items() if value != self.options.get(name)}
        refused = sorted(name for name in changed if name in RESTART_ONLY)
        for name in refused:
            log.warning(
                "%s: %s changed to %s, which needs a restart (%s): kept %s",
                why,
                name.replace("_", "-"),
                _shown(name, fresh[name]),
                RESTART_ONLY[name],
                _shown(name, self.options[name]),
            )
            fresh[name] = self.options[name]
        live = frozenset(changed - set(refused))
        try:
            self._apply(fresh, live)  # every file it names is read again, changed or not
        except (OSError, ValueError) as e:
            return self._done("invalid", f"{why}: the configuration was not reloaded, the one in force stays whole: {e}")
        self.options = fresh
        if live:
            self.generation += 1
            metrics.CONFIG_GENERATION.set(self.generation)
        applied = ", ".join(sorted(n.replace("_", "-") for n in live)) or "nothing changed"
        result = "restart_needed" if refused else ("ok" if live else "unchanged")
        return self._done(result, f"{why}: configuration generation {self.generation} ({applied})")

    def _done(self, result: str, message: str) -> str:
        metrics.CONFIG_RELOADS.labels(result).inc()
        metrics.CONFIG_LAST_RELOAD.labels(result).set(time.time())
        (log.error if result == "invalid" else log.info)("%s", message)
        return result

    async def watch(self) -> None:
        """Reload whenever the config file changes (its time, size or inode), for ever."""
        if self.path is None:
            return
        while True:
            await trio.sleep(self.check_interval)
            if self._stat() != self._stamp:
                self.reload(f"{self.path} changed")
