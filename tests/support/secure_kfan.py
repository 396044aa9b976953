"""kfan's security options as the tests give them: its client-side
certificate, its users file, and its TLS+SASL way to a :class:`SecureCluster`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from proxy.security.users import add_user
from tests.support.certs import Authority, PemFiles
from tests.support.secure_cluster import SecureCluster

CLIENT_USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@dataclass
class KfanSecrets:
    """kfan's server certificate (for clients), the CA of client certificates (mTLS), and its users file."""

    workdir: Path
    server: PemFiles
    clients: Authority
    client_ca: Path
    users_file: Path
    passwords: dict[str, str] = field(default_factory=dict)

    def client_cert(self, common_name: str) -> PemFiles:
        return self.clients.client(self.workdir / "clients", common_name)

    def tls_args(self, *, mtls: bool = False) -> list[str]:
        args = ["--tls-cert", str(self.server.cert), "--tls-key", str(self.server.key)]
        return args + (["--tls-client-ca", str(self.client_ca)] if mtls else [])

    def sasl_args(self, jwks: Path | None = None) -> list[str]:
        args = ["--client-auth", "sasl", "--client-users", str(self.users_file)]
        return args + (["--client-oauth-jwks", str(jwks)] if jwks is not None else [])


def kfan_secrets(workdir: Path, users: dict[str, str] | None = None) -> KfanSecrets:
    workdir.mkdir(parents=True, exist_ok=True)
    server = Authority("kfan").server(workdir / "server", "localhost", "127.0.0.1")
    clients = Authority("kfan-clients")
    users_file = workdir / "users.json"
    passwords = dict(CLIENT_USERS if users is None else users)
    for name, password in passwords.items():
        add_user(users_file, name, password)
    return KfanSecrets(workdir, server, clients, clients.write_ca(workdir / "clients"), users_file, passwords)


def broker_args(cluster: SecureCluster, *, mechanism: str = "SCRAM-SHA-512", user: str = "kfan", password: str | None = None) -> list[str]:
    """kfan to the cluster's brokers: TLS against its CA, SASL as ``user`` (password in a file, as a Secret would be)."""
    secret = cluster.workdir / f"broker-password-{user}"
    secret.write_text((cluster.users[user] if password is None else password) + "\n")
    secret.chmod(0o600)
    args = ["--broker-tls", "true", "--broker-tls-ca", str(cluster.ca_file)]
    args += ["--broker-sasl-mechanism", mechanism, "--broker-sasl-username", user, "--broker-sasl-password-file", str(secret)]
    if cluster.mtls:
        args += ["--broker-tls-cert", str(cluster.client_cert_file), "--broker-tls-key", str(cluster.client_key_file)]
    return args
