"""kfan's options: one table, read from flags, environment and a config file.

Precedence is flag > environment (``KFAN_<NAME>``) > file (``--config``, TOML,
keys as the flag names without dashes, e.g. ``metrics-listen`` or
``metrics_listen``) > default. The README's configuration table is this
table; a test keeps the two in step.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.runtime.audit import parse_audit_apis


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def parse_addresses(text: str) -> list[tuple[str, int]]:
    return [parse_address(a) for a in str(text).split(",") if a.strip()]


def _bool(text: Any) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


parse_bool = _bool  # for `kfan cluster --log-json`, which takes no config file


def _choice(*choices: str) -> Callable[[Any], str]:
    def parse(text: Any) -> str:
        if str(text) not in choices:
            raise ValueError(f"expected {' or '.join(choices)}, got {text!r}")
        return str(text)

    return parse


_records_mode = _choice("full", "none")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _mechanisms(text: Any) -> tuple[str, ...]:
    names = [str(m).strip().upper() for m in (text if isinstance(text, list | tuple) else str(text).split(",")) if str(m).strip()]
    unknown = [m for m in names if m not in SASL_MECHANISMS]
    if unknown:
        raise ValueError(f"unknown SASL mechanisms {unknown}; kfan knows {', '.join(SASL_MECHANISMS)}")
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True)
class Option:
    name: str  # the flag without dashes
    parse: Callable[[Any], Any]
    default: Any
    help: str
    metavar: str | None = None
    flag: bool = True  # False: environment and file only (a secret must not sit in the process list)

    @property
    def env(self) -> str:
        return "KFAN_" + self.name.upper().replace("-", "_")

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")


# Options of `kfan serve` (and `kfan demo`, which fills in bootstrap itself).
OPTIONS: tuple[Option, ...] = (
    Option("bootstrap", parse_addresses, None, "brokers to bootstrap from; kfan starts when any one answers", "HOST:PORT[,...]"),
    Option("listen", parse_address, ("127.0.0.1", 9092), "where clients connect; port 0 picks a free port", "HOST:PORT"),
    Option("advertise", parse_address, None, "the address clients are told to use (default: the listen address)", "HOST:PORT"),
    Option("node-id", int, 0, "the node id kfan reports as its own, with --broker-ids kfan", "N"),
    Option(
        "broker-ids",
        _choice("kfan", "cluster"),
        "kfan",
        "what clients see as brokers: kfan alone (one node, --node-id), or the cluster's brokers under their own ids,"
        " every one at kfan's address (a client then keeps a connection per broker, as directly)",
        "kfan|cluster",
    ),
    Option(
        "broker-port-base",
        int,
        0,
        "with --broker-ids cluster: show broker N at port BASE+N of kfan's host, and listen there too, for clients that"
        " tell brokers apart by address (0: every broker at kfan's own port)",
        "BASE",
    ),
    Option("metrics-listen", parse_address, None, "HTTP listener for /metrics, /healthz, /readyz (default: none)", "HOST:PORT"),
    Option("workers", int, 1, "processes serving the same port (SO_REUSEPORT)", "N"),
    Option(
        "reuse-port",
        _bool,
        False,
        "let other kfan processes on this host listen on the same port (SO_REUSEPORT; the kernel spreads new connections)",
        "BOOL",
    ),
    Option("max-frame-bytes", int, 100 * 1024 * 1024, "largest request accepted; a larger size prefix closes the connection", "BYTES"),
    Option("max-inflight", int, 256, "requests in flight per client connection before kfan stops reading", "N"),
    Option(
        "max-connection-bytes",
        int,
        64 * 1024 * 1024,
        "bytes one client connection may hold (requests in flight, decoded, and unwritten responses) before kfan stops reading it",
        "BYTES",
    ),
    Option(
        "max-buffered-bytes",
        int,
        512 * 1024 * 1024,
        "bytes all client connections together may hold; beyond it kfan stops reading connections holding 64 KiB or more",
        "BYTES",
    ),
    Option(
        "fetch-ahead-bytes",
        int,
        16 * 1024 * 1024,
        "records a client connection's sub-fetches sent ahead of its next Fetch may bring in, all brokers together (0: none)",
        "BYTES",
    ),
    Option("max-connections", int, 10_000, "client connections at once; further ones are closed as they arrive", "N"),
    Option("request-timeout", float, 30.0, "seconds a broker may take beyond what the request itself allows", "SECONDS"),
    Option(
        "max-hold",
        float,
        300.0,
        "longest a request's own fields (Fetch max_wait, JoinGroup rebalance_timeout, timeouts) may let a broker keep it",
        "SECONDS",
    ),
    Option("idle-timeout", float, 600.0, "close a client connection idle this long (Kafka's connections.max.idle.ms)", "SECONDS"),
    Option("frame-timeout", float, 30.0, "close a client that takes longer than this to send a request or to read a response", "SECONDS"),
    Option("metadata-refresh", float, 30.0, "seconds between topology refreshes (leadership errors refresh at once)", "SECONDS"),
    Option(
        "rack",
        str,
        None,
        "kfan's own zone (Kafka's client.rack): Fetches go to a replica in it where the leader names one; a client's own rack wins",
        "ZONE",
    ),
    Option(
        "read-replica-max-age",
        float,
        300.0,
        "seconds a leader's preferred read replica is followed before the leader is asked again (Kafka's metadata.max.age.ms)",
        "SECONDS",
    ),
    Option("shutdown-timeout", float, 25.0, "on SIGTERM, seconds to finish in-flight requests before closing", "SECONDS"),
    Option(
        "connection-max-age",
        float,
        0.0,
        "close a client connection older than this at a safe point (nothing in flight), so clients reconnect through "
        "the load balancer to any replica (0: never)",
        "SECONDS",
    ),
    Option(
        "connection-max-age-jitter",
        float,
        0.0,
        "each connection's max age is --connection-max-age plus a random part up to this, so reconnects spread out",
        "SECONDS",
    ),
    Option(
        "drain-period",
        float,
        0.0,
        "on SIGTERM, close client connections at safe points spread over this many seconds before the shutdown "
        "(0: all at once, after answering what they sent)",
        "SECONDS",
    ),
    Option(
        "validate-records",
        _choice("crc", "off"),
        "crc",
        "crc: check each produced record batch (length, magic, count, CRC) before it is sent; a bad one is refused, not sent",
        "crc|off",
    ),
    Option("capture", Path, None, "record client exchanges as Parquet files in this directory", "DIR"),
    Option("capture-sample", float, 1.0, "fraction of exchanges captured", "FRACTION"),
    Option("capture-records", _records_mode, "full", "full, or none: record batches emptied so no payload is stored", "full|none"),
    # --- client telemetry (KIP-714)
    Option(
        "telemetry-subscriptions",
        Path,
        None,
        "answer client telemetry (KIP-714) with the subscriptions in this TOML file, and serve what clients push on /metrics",
        "FILE",
    ),
    Option("telemetry-max-bytes", int, 1024 * 1024, "largest telemetry push accepted, before and after decompression", "BYTES"),
    Option("telemetry-max-client-instances", int, 1000, "client instances whose pushed metrics are kept; the least recent go first", "N"),
    # --- governance: authorization and the audit log
    Option(
        "authorizer",
        _choice("none", "acls"),
        "none",
        "none, or acls: kfan judges every request by --acl-file, as a broker would",
        "none|acls",
    ),
    Option("acl-file", Path, None, "the ACLs (TOML, see README) for --authorizer acls; re-read when it changes and on SIGHUP", "FILE"),
    Option("acl-file-check", float, 2.0, "seconds between checks of --acl-file for changes", "SECONDS"),
    Option("authorizer-log", _choice("denied", "all", "none"), "denied", "which authorization decisions are logged", "denied|all|none"),
    Option("audit-log", str, None, "write the audit log (JSON lines) to this file, reopened on SIGHUP; - for stdout", "FILE|-"),
    Option("audit-topic", str, None, "write the audit log to this Kafka topic on the cluster itself (instead of a file)", "TOPIC"),
    Option(
        "audit-apis",
        parse_audit_apis,
        None,
        "requests audited: default (all but Produce, Fetch, share fetches, heartbeats), all, or API names",
        "LIST",
    ),
    Option("audit-queue-events", int, 10_000, "audit events held while the audit sink lags", "N"),
    Option(
        "audit-overflow",
        _choice("drop", "block"),
        "drop",
        "when the audit queue is full: drop (counted, logged) or block the client",
        "drop|block",
    ),
    # --- client quotas (KIP-13, KIP-124, KIP-219)
    Option(
        "quota-file",
        Path,
        None,
        "client quotas (TOML, see README: producer_byte_rate, consumer_byte_rate, request_percentage per user and client id), "
        "enforced by each kfan process as by each broker; re-read when it changes",
        "FILE",
    ),
    # --- TLS to clients
    Option("tls-cert", Path, None, "serve TLS to clients with this certificate chain (PEM); re-read when it changes", "FILE"),
    Option("tls-key", Path, None, "the private key of --tls-cert (PEM); re-read when it changes", "FILE"),
    Option(
        "tls-client-ca", Path, None, "require client certificates signed by this CA (mTLS); the subject is the client's principal", "FILE"
    ),
    # --- TLS to brokers
    Option("broker-tls", _bool, False, "connect to the brokers over TLS (bootstrap, control plane and every link)", "BOOL"),
    Option("broker-tls-ca", Path, None, "CA bundle the brokers' certificates are checked against (default: the system's CAs)", "FILE"),
    Option("broker-tls-cert", Path, None, "client certificate kfan presents to the brokers (mTLS)", "FILE"),
    Option("broker-tls-key", Path, None, "the private key of --broker-tls-cert", "FILE"),
    Option(
        "broker-tls-server-name",
        str,
        None,
        "the name every broker certificate is checked against (default: each broker's advertised host)",
        "NAME",
    ),
    # --- SASL to brokers
    Option("broker-sasl-mechanism", _choice(*SASL_MECHANISMS), None, "authenticate to the brokers with this SASL mechanism", "MECHANISM"),
    Option("broker-sasl-username", str, None, "kfan's SASL user name at the brokers", "NAME"),
    Option("broker-sasl-password-file", Path, None, "file holding kfan's SASL password; re-read when it changes", "FILE"),
    Option(
        "broker-sasl-password", str, None, "kfan's SASL password (environment or config file only, never a flag)", "PASSWORD", flag=False
    ),
    Option("broker-sasl-token-file", Path, None, "file holding kfan's OAUTHBEARER token; re-read when it changes", "FILE"),
    Option(
        "broker-identity",
        _choice("kfan", "client"),
        "kfan",
        "who the brokers see: kfan's own SASL identity, or each client's (PLAIN and OAUTHBEARER credentials replayed)",
        "kfan|client",
    ),
    # --- clients authenticated by kfan
    Option("client-auth", _choice("none", "mtls", "sasl"), "none", "how kfan authenticates clients", "none|mtls|sasl"),
    Option(
        "client-sasl-mechanisms",
        _mechanisms,
        None,
        "mechanisms offered to clients (default: those the configured files allow; with --broker-identity client no SCRAM)",
        "M[,...]",
    ),
    Option("client-users", Path, None, "users file for PLAIN and SCRAM (`kfan users add`); re-read when it changes", "FILE"),
    Option("client-oauth-jwks", Path, None, "JWKS file with the keys OAUTHBEARER tokens are signed with; re-read when it changes", "FILE"),
    Option("client-oauth-issuer", str, None, "the `iss` an OAUTHBEARER token must carry", "ISSUER"),
    Option("client-oauth-audience", str, None, "the `aud` an OAUTHBEARER token must carry", "AUDIENCE"),
    Option("client-oauth-clock-skew", float, 30.0, "seconds of clock difference allowed when checking a token's times", "SECONDS"),
    Option(
        "client-session-lifetime",
        float,
        0.0,
        "seconds a client's SASL login lasts before it must re-authenticate (KIP-368; a token's expiry shortens it); 0: no limit",
        "SECONDS",
    ),
    Option("client-auth-failure-delay", float, 0.1, "seconds before a failed authentication is answered", "SECONDS"),
    Option(
        "client-auth-max-receive-bytes",
        int,
        512 * 1024,
        "largest frame a client may send before it has logged in (Kafka's sasl.server.max.receive.size)",
        "BYTES",
    ),
    Option(
        "client-auth-timeout", float, 10.0, "seconds from a client's connection to its completed SASL login; later, it is closed", "SECONDS"
    ),
    Option(
        "max-unauthenticated-per-address",
        int,
        64,
        "connections from one client address that have not logged in yet (SASL login, else TLS handshake); more are closed as they arrive",
        "N",
    ),
    Option(
        "max-unauthenticated-bytes",
        int,
        32 * 1024 * 1024,
        "bytes held for all connections not logged in yet, apart from --max-buffered-bytes; past it they stop being read",
        "BYTES",
    ),
    Option("log-level", str, "INFO", "DEBUG, INFO, WARNING, ERROR", "LEVEL"),
    Option("log-json", _bool, False, "one JSON object per log line", "BOOL"),
)


def add_options(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Flags for every option; unset flags stay absent so the layers below can fill them."""
    parser.add_argument("--config", type=Path, default=argparse.SUPPRESS, metavar="FILE", help="TOML file with options")
    for o in OPTIONS:
        if o.name in skip or not o.flag:
            continue
        parser.add_argument(
            f"--{o.name}",
            dest=o.dest,
            type=o.parse,
            default=argparse.SUPPRESS,
            metavar=o.metavar,
            help=f"{o.help} [env {o.env}; default {o.default}]",
        )


def resolve(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Each option's value: flag, else environment, else config file, else default."""
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("KFAN_CONFIG")
    file_values: dict[str, Any] = {}
    if config_path:
        raw = tomllib.loads(Path(config_path).read_text())
        file_values = {k.replace("_", "-"): v for k, v in raw.items()}
        unknown = set(file_values) - {o.name for o in OPTIONS}
        if unknown:
            raise ValueError(f"{config_path}: unknown options {sorted(unknown)}")
    out: dict[str, Any] = {}
    for o in OPTIONS:
        if o.dest in flags:
            out[o.dest] = flags[o.dest]
        elif o.env in env:
            out[o.dest] = o.parse(env[o.env])
        elif o.name in file_values:
            value = file_values[o.name]
            out[o.dest] = o.parse(",".join(value) if isinstance(value, list) else value)
        else:
            out[o.dest] = o.default
    return out
