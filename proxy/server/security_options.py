"""kfan's security options turned into what the server runs with: the client
listener's TLS, how clients log in, and how kfan reaches the brokers.

Combinations that cannot work are refused at start-up with a message naming
the options, rather than discovered by the first client.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from backends.transport import BrokerSecurity
from proxy.security.credentials import configured_credentials
from proxy.security.files import WatchedFile
from proxy.security.oauth import TokenValidator, load_jwks
from proxy.security.sasl import Authenticator
from proxy.security.tls import BrokerTLS, ServerTLS
from proxy.security.users import Users
from proxy.server.client_auth import ClientAuthConfig

log = logging.getLogger("kfan.security")

# SCRAM proves the password without sending it: there is nothing to replay to a broker (a delegation token goes instead).
REPLAYABLE = ("PLAIN", "OAUTHBEARER")


@dataclass(frozen=True)
class Security:
    tls: ServerTLS | None = None
    client_auth: ClientAuthConfig | None = None
    broker: BrokerSecurity = field(default_factory=BrokerSecurity)
    summary: tuple[str, ...] = ()  # one line per side, logged at start-up


def security_from(options: Mapping[str, Any]) -> Security:
    """Raises ValueError for options that do not fit together."""
    o = options
    summary: list[str] = []
    tls = None
    if (o["tls_cert"] is None) != (o["tls_key"] is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if o["tls_cert"] is not None:
        tls = ServerTLS(o["tls_cert"], o["tls_key"], o["tls_client_ca"])
        summary.append("clients: TLS" + (", client certificates required (mTLS)" if o["tls_client_ca"] else ""))
    elif o["tls_client_ca"] is not None:
        raise ValueError("--tls-client-ca needs --tls-cert and --tls-key (client certificates come with TLS)")

    mode = o["client_auth"]
    carry = o["broker_identity"] == "client"
    if mode == "mtls" and o["tls_client_ca"] is None:
        raise ValueError("--client-auth mtls needs --tls-client-ca (and --tls-cert, --tls-key)")
    if carry and mode != "sasl":
        raise ValueError("--broker-identity client needs --client-auth sasl: kfan carries the credentials a client logs in with")
    client_auth = _client_auth(o, carry) if mode == "sasl" else None
    if client_auth is not None:
        summary.append(
            f"clients: SASL {', '.join(client_auth.authenticator.mechanisms)}"
            + (f", sessions of {o['client_session_lifetime']:.0f} s" if o["client_session_lifetime"] > 0 else "")
        )

    broker_tls = None
    if o["broker_tls"]:
        broker_tls = BrokerTLS(o["broker_tls_ca"], o["broker_tls_cert"], o["broker_tls_key"])
    elif any(o[k] is not None for k in ("broker_tls_ca", "broker_tls_cert", "broker_tls_key", "broker_tls_server_name")):
        raise ValueError("--broker-tls-ca, --broker-tls-cert, --broker-tls-key and --broker-tls-server-name need --broker-tls")
    if (o["broker_tls_cert"] is None) != (o["broker_tls_key"] is None):
        raise ValueError("--broker-tls-cert and --broker-tls-key go together")
    credentials = None
    if o["broker_sasl_mechanism"] is not None:
        credentials = configured_credentials(
            o["broker_sasl_mechanism"],
            username=o["broker_sasl_username"],
            password=o["broker_sasl_password"],
            password_file=o["broker_sasl_password_file"],
            token_file=o["broker_sasl_token_file"],
        )
    elif carry:
        raise ValueError("--broker-identity client needs --broker-sasl-mechanism too: kfan's own requests (metadata) log in as kfan")
    broker = BrokerSecurity(broker_tls, o["broker_tls_server_name"], credentials)
    parts = ["TLS" if broker_tls else "plaintext"]
    if credentials is not None:
        parts.append(f"SASL {o['broker_sasl_mechanism']} as {'each client' if carry else 'kfan'}")
    summary.append("brokers: " + ", ".join(parts))
    return Security(tls, client_auth, broker, tuple(summary))


def _client_auth(o: Mapping[str, Any], carry: bool) -> ClientAuthConfig:
    users = None
    if o["client_users"] is not None:
        watched_users = WatchedFile(o["client_users"], Users.load)
        users = watched_users.value
    tokens = None
    if o["client_oauth_jwks"] is not None:
        jwks = WatchedFile(o["client_oauth_jwks"], load_jwks)
        tokens = TokenValidator(
            jwks.value, issuer=o["client_oauth_issuer"], audience=o["client_oauth_audience"], leeway=o["client_oauth_clock_skew"]
        )
    possible = []
    if users is not None or carry:
        possible.append("PLAIN")
    if users is not None:
        possible += ["SCRAM-SHA-256", "SCRAM-SHA-512"]
    if tokens is not None:
        possible.append("OAUTHBEARER")
    asked = o["client_sasl_mechanisms"]
    if asked is None:
        # Carried to the brokers, SCRAM is offered only when asked for: it needs delegation tokens there (KIP-48).
        mechanisms = tuple(m for m in possible if not carry or m in REPLAYABLE)
    else:
        if missing := [m for m in asked if m not in possible]:
            raise ValueError(
                f"--client-sasl-mechanisms {', '.join(missing)}: nothing to check them against (--client-users, --client-oauth-jwks)"
            )
        mechanisms = tuple(asked)
    if not mechanisms:
        raise ValueError("--client-auth sasl needs --client-users (PLAIN, SCRAM) or --client-oauth-jwks (OAUTHBEARER)")
    if carry and (scram := [m for m in mechanisms if m not in REPLAYABLE]):
        log.info(
            "--broker-identity client: %s logins reach the brokers as delegation tokens kfan makes for each client", " and ".join(scram)
        )
    authenticator = Authenticator(mechanisms, users=users, tokens=tokens, check_users=users is not None)
    return ClientAuthConfig(authenticator, o["client_session_lifetime"], o["client_auth_failure_delay"], carry)
