"""A 3-broker cluster reached only over TLS, with SASL required by the brokers' fronts.

Per broker of a :class:`~proxy.tools.mock_cluster.MockCluster`::

    client --TLS--> stunnel4 --plaintext--> sasl_front --plaintext--> mock broker

Each mock broker advertises its stunnel's address ("localhost:PORT"), so every
connection a client opens, bootstrap included, goes through TLS and SASL.
stunnel (Debian's, OpenSSL) is the TLS server; :mod:`tests.support.sasl_front`
(independent of kfan's SASL code) checks PLAIN, SCRAM-SHA-256/512 and
OAUTHBEARER (RS256 JWTs from :meth:`SecureCluster.token`) and logs what it saw.
With ``mtls=True`` stunnel also requires a client certificate signed by the
client CA (:attr:`SecureCluster.client_cert_file` is one, CN ``client_cn``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa

from proxy.tools.mock_cluster import MockCluster
from tests.support import ROOT
from tests.support.certs import Authority, PemFiles
from tests.support.json_lines import whole_json_lines
from tests.support.processes import follow_output, stop_process
from tests.support.sasl_front import MECHANISMS
from tests.support.stunnel import Stunnel, start_stunnel

DEFAULT_USERS = {"kfan": "kfan-secret", "alice": "alice-secret", "bob": "bob-secret"}
LISTENING = r"sasl_front: listening on (\S+):(\d+)"


class SecureCluster:
    """MockCluster(brokers) behind per-broker SASL fronts and stunnel TLS servers; a context manager.

    ``workdir``: where certificates, configurations and logs go (a fresh
    directory per cluster). Everything is started by the constructor and
    stopped by :meth:`close` / ``__exit__``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        brokers: int = 3,
        mechanisms: Sequence[str] = MECHANISMS,
        session_lifetime_ms: int | None = None,
        mtls: bool = False,
        client_cn: str = "kfan",
        users: dict[str, str] | None = None,
        log_requests: bool = False,
    ) -> None:
        """``log_requests``: the fronts log every request they relay, with its principal ("request" events)."""
        self.log_requests = log_requests
        self.workdir = Path(workdir).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mechanisms = list(mechanisms)
        self.session_lifetime_ms = session_lifetime_ms
        self.mtls = mtls
        self.client_cn = client_cn
        self.users: dict[str, str] = dict(DEFAULT_USERS if users is None else users)
        self.stunnels: dict[int, Stunnel] = {}
        self.front_processes: dict[int, subprocess.Popen[str]] = {}
        self.front_logs: dict[int, list[str]] = {}  # each front's stdout (errors show here)
        self.event_files: dict[int, Path] = {}
        self.fronts: dict[int, tuple[str, int]] = {}  # the SASL fronts, plaintext (not advertised: for raw tests)
        self.brokers: dict[int, tuple[str, int]] = {}  # TLS addresses, as advertised
        self.mock = MockCluster(brokers)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    @classmethod
    def for_tests(cls, tmp_path_factory: Any, **options: Any) -> SecureCluster:
        """A cluster in a fresh directory of pytest's ``tmp_path_factory``."""
        return cls(tmp_path_factory.mktemp("secure-cluster"), **options)

    # -- start and stop --

    def _start(self) -> None:
        certs = self.workdir / "certs"
        self.broker_authority = Authority("brokers")
        self.server_cert: PemFiles = self.broker_authority.server(certs, "localhost", "127.0.0.1")
        self.ca_file: Path = self.server_cert.ca
        self.client_authority = Authority("clients")
        client = self.client_authority.client(certs, self.client_cn)
        self.client_cert_file: Path = client.cert
        self.client_key_file: Path = client.key
        self.client_ca_file: Path = client.ca

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self._kid = uuid.uuid4().hex[:12]
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self._key.public_key()))
        self.jwks_file: Path = self.workdir / "jwks.json"
        self.jwks_file.write_text(json.dumps({"keys": [{**jwk, "kid": self._kid, "alg": "RS256", "use": "sig"}]}))
        users_file = self.workdir / "users.json"
        users_file.write_text(json.dumps(self.users))

        env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        for broker, (host, port) in self.mock.brokers.items():
            events = self.event_files[broker] = self.workdir / f"front-{broker}.jsonl"
            events.touch()
            cmd = [sys.executable, "-m", "tests.support.sasl_front", "--listen", "127.0.0.1:0", "--upstream", f"{host}:{port}"]
            cmd += ["--users", str(users_file), "--mechanisms", ",".join(self.mechanisms), "--jwks", str(self.jwks_file)]
            cmd += ["--log", str(events), "--proxy-protocol"]
            if self.log_requests:
                cmd += ["--log-requests"]
            if self.session_lifetime_ms is not None:
                cmd += ["--session-lifetime-ms", str(self.session_lifetime_ms)]
            self.front_processes[broker] = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
            )
        for broker, proc in self.front_processes.items():  # started together, awaited in turn
            log, listening = follow_output(proc, LISTENING, 30)
            self.front_logs[broker] = log
            if listening is None:
                raise RuntimeError(f"sasl_front for broker {broker} did not start:\n" + "".join(log))
            self.fronts[broker] = ("127.0.0.1", int(listening.group(2)))
        for broker, (_, front_port) in self.fronts.items():
            tls = start_stunnel(
                None,
                front_port,
                self.server_cert.cert,
                self.server_cert.key,
                verify_ca=self.client_ca_file if self.mtls else None,
                workdir=self.workdir,
                proxy_protocol=True,
                name=f"stunnel-{broker}",
            )
            self.stunnels[broker] = tls
            self.brokers[broker] = ("localhost", tls.accept_port)
            self.mock.set_broker_address(broker, "localhost", tls.accept_port)
        self.bootstrap: str = ",".join(f"{h}:{p}" for h, p in self.brokers.values())

    def close(self) -> None:
        """Stop the TLS fronts, the SASL fronts, then the brokers. Idempotent."""
        for tls in self.stunnels.values():
            tls.stop()
        for proc in self.front_processes.values():
            stop_process(proc, 5)
        self.mock.close()

    def __enter__(self) -> SecureCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def alive(self) -> bool:
        return all(t.alive() for t in self.stunnels.values()) and all(p.poll() is None for p in self.front_processes.values())

    # -- credentials --

    def token(self, sub: str, lifetime_s: float = 300.0, **claims: Any) -> str:
        """An RS256 JWT for ``sub``, valid for ``lifetime_s`` seconds (negative: already expired), that the fronts accept."""
        now = int(time.time())
        payload = {"sub": sub, "iat": now, "exp": now + int(lifetime_s), "scope": "kafka", **claims}
        return jwt.encode(payload, self._key, algorithm="RS256", headers={"kid": self._kid})

    def client_cert(self, common_name: str) -> PemFiles:
        """Another client certificate from the client CA (the one stunnel trusts with ``mtls``)."""
        return self.client_authority.client(self.workdir / "certs", common_name)

    def librdkafka_config(self, mechanism: str = "SCRAM-SHA-512", user: str = "alice", password: str | None = None) -> dict[str, Any]:
        """confluent-kafka settings for a direct SASL_SSL client (PLAIN/SCRAM); with ``mtls`` the client certificate too."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.ca_file),
            "sasl.mechanisms": mechanism,
        }
        if mechanism != "OAUTHBEARER":
            conf["sasl.username"] = user
            conf["sasl.password"] = self.users[user] if password is None else password
        if self.mtls:
            conf["ssl.certificate.location"] = str(self.client_cert_file)
            conf["ssl.key.location"] = str(self.client_key_file)
        return conf

    # -- what the brokers' side saw --

    def front_events(self, event: str | None = None) -> list[dict[str, Any]]:
        """Every front's events (JSON lines, plus "broker": id), in time order; ``event``: only that kind."""
        out: list[dict[str, Any]] = []
        for broker, path in self.event_files.items():
            for record in whole_json_lines(path):  # a front may be writing its last line as we read
                if event is None or record["event"] == event:
                    out.append({**record, "broker": broker})
        return sorted(out, key=lambda r: r["time"])

    def front_output(self) -> str:
        """The fronts' own output (start lines, tracebacks of failed connections)."""
        return "".join(f"[front {b}] {line}" for b, log in self.front_logs.items() for line in log)

    def stunnel_output(self) -> str:
        return "".join(f"[stunnel {b}] {line}" for b, t in self.stunnels.items() for line in t.log)
