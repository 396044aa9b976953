"""The Apache Kafka cluster's secured side: a SASL_SSL listener on every broker and Kafka's own authorizer.

Each broker gets a second listener, ``SASL_SSL``, serving SCRAM-SHA-512 (users
added at format time, as ``kafka-storage format --add-scram`` does), PLAIN
(users in the listener's JAAS line) and OAUTHBEARER with Kafka's unsecured
validator (tokens with ``alg: none`` and no signature, for tests only). A third,
``OAUTH`` (also SASL_SSL), serves SCRAM-SHA-512 and OAUTHBEARER checked the way
production brokers check it: Kafka's ``OAuthBearerValidatorCallbackHandler``
verifying signed JWTs against a JWKS (a file here; :meth:`Secured.token` signs
with its key). Certificates come from a CA of the test run's own; the CA file
is what clients trust.

Every node runs ``StandardAuthorizer`` (the KRaft authorizer; ACLs live in the
metadata log, so controllers need it too). Super users: ``kfan`` (kfan's own
identity at the brokers) and ``ANONYMOUS``, the principal of the PLAINTEXT
listeners, so the tests that use those, the brokers among themselves and the
controller see no change. Every other principal needs ACLs.

The authorizer's decisions (Kafka's ``kafka.authorizer.logger``: denials at
INFO, allowed requests at DEBUG) go to ``authorizer-<node>.log``, without the
super user ``ANONYMOUS``'s (the whole suite's traffic).
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.certs import Authority

USERS = {"kfan": "kfan-secret", "alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
SUPER_USERS = "User:kfan;User:ANONYMOUS"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM = "SCRAM-SHA-512"

LOG4J2_AUTHORIZER = """\
appender.authz.type = File
appender.authz.name = AUTHZ
appender.authz.fileName = ${sys:kfan.authorizer.log}
appender.authz.layout.type = PatternLayout
appender.authz.layout.pattern = [%d] %p %m%n
appender.authz.filter.anonymous.type = RegexFilter
appender.authz.filter.anonymous.regex = .*User:ANONYMOUS.*
appender.authz.filter.anonymous.onMatch = DENY
appender.authz.filter.anonymous.onMismatch = ACCEPT
logger.authz.name = kafka.authorizer.logger
logger.authz.level = DEBUG
logger.authz.additivity = false
logger.authz.appenderRef.authz.ref = AUTHZ
"""


@dataclass(frozen=True)
class Secured:
    """What clients of the secured listeners need: the CA to trust, the users' passwords, tokens for ``OAUTH``."""

    ca_file: Path
    users: dict[str, str]
    jwks_file: Path
    key: Any = field(repr=False)
    kid: str = ""

    def token(self, sub: str, lifetime_s: float = 600.0) -> str:
        """An RS256 JWT for ``sub`` that the ``OAUTH`` listener (and a kfan given :attr:`jwks_file`) accepts."""
        now = int(time.time())
        claims = {"sub": sub, "aud": AUDIENCE, "iss": ISSUER, "iat": now, "exp": now + int(lifetime_s)}
        return jwt.encode(claims, self.key, algorithm="RS256", headers={"kid": self.kid})


OAUTH_LISTENER = "OAUTH"
# Kafka 4.4's validator insists on checking both (it refuses to start without them):
AUDIENCE, ISSUER = "kfan-tests-kafka", "https://issuer.kfan.test"
VALIDATOR = "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler"


def java_flags(secured: Secured) -> list[str]:
    """Kafka 4 fetches a JWKS only from URLs this system property allows."""
    return [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={secured.jwks_file.as_uri()}"]


def _inline(pem: bytes) -> str:
    """A PEM block as one properties-file value (``\\n`` escapes: Java's Properties turns them back)."""
    return pem.decode().strip().replace("\n", "\\n")


def prepare(workdir: Path, users: dict[str, str] = USERS) -> tuple[Secured, dict[str, str]]:
    """The secured listener's certificate and users; returns them and the broker properties they need
    (the listener itself is named by the caller, who picks its port)."""
    authority = Authority("apache-kafka")
    server = authority.server(workdir / "tls", "localhost", "127.0.0.1")
    # Kafka's PEM key store reads PKCS#8 keys only; trustme writes the traditional RSA form.
    tls_key = serialization.load_pem_private_key(server.key.read_bytes(), password=None)
    pkcs8 = tls_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    plain_users = " ".join(f'user_{name}="{password}"' for name, password in users.items())
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = uuid.uuid4().hex[:12]
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    jwks = workdir / "jwks.json"
    jwks.write_text(json.dumps({"keys": [{**jwk, "kid": kid, "alg": "RS256", "use": "sig"}]}))
    oauth = OAUTH_LISTENER.lower()
    props = {
        "sasl.enabled.mechanisms": f"{SCRAM},PLAIN,OAUTHBEARER",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.key": _inline(pkcs8),
        "ssl.keystore.certificate.chain": _inline(server.cert.read_bytes()),
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "listener.name.sasl_ssl.plain.sasl.jaas.config": f"org.apache.kafka.common.security.plain.PlainLoginModule required {plain_users};",
        "listener.name.sasl_ssl.oauthbearer.sasl.jaas.config": (
            'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="kfan";'
        ),
        f"listener.name.{oauth}.sasl.enabled.mechanisms": f"{SCRAM},OAUTHBEARER",
        f"listener.name.{oauth}.scram-sha-512.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        f"listener.name.{oauth}.oauthbearer.sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
        f"listener.name.{oauth}.oauthbearer.sasl.server.callback.handler.class": VALIDATOR,
        "sasl.oauthbearer.jwks.endpoint.url": jwks.as_uri(),
        "sasl.oauthbearer.expected.audience": AUDIENCE,
        "sasl.oauthbearer.expected.issuer": ISSUER,
    }
    return Secured(server.ca, dict(users), jwks, key, kid), props


TOKEN_SECRET = "kfan-test-delegation-token-secret"


def authorizer_props() -> dict[str, str]:
    """What every node of a secured cluster needs: the authorizer and its super users, and the secret delegation
    tokens are made and checked with (KIP-48: controllers make them, brokers check them)."""
    return {"authorizer.class.name": AUTHORIZER, "super.users": SUPER_USERS, "delegation.token.secret.key": TOKEN_SECRET}


def scram_format_args(users: dict[str, str]) -> list[str]:
    """``format`` arguments that add each user's SCRAM-SHA-512 credentials to the metadata log."""
    args: list[str] = []
    for name, password in users.items():
        args += ["--add-scram", f"{SCRAM}=[name={name},password={password}]"]
    return args


def secret_file(directory: Path, name: str, value: str) -> Path:
    """``value`` in a file only its owner reads, as kfan's secrets are given to it."""
    path = directory / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def kfan_to_brokers(secured: Secured, directory: Path, mechanism: str = SCRAM, user: str = "kfan") -> list[str]:
    """kfan's options to reach the brokers' SASL_SSL listeners as ``user`` (OAUTHBEARER: an unsecured token)."""
    args = ["--broker-tls", "true", "--broker-tls-ca", str(secured.ca_file), "--broker-sasl-mechanism", mechanism]
    if mechanism == "OAUTHBEARER":
        return args + ["--broker-sasl-token-file", str(secret_file(directory, f"token-{user}", unsecured_token(user)))]
    password = secret_file(directory, f"password-{user}", secured.users[user])
    return args + ["--broker-sasl-username", user, "--broker-sasl-password-file", str(password)]


def unsecured_token(sub: str, lifetime_s: float = 3600.0) -> str:
    """A token Kafka's unsecured validator accepts: ``alg: none``, no signature, ``sub`` the principal."""

    def part(obj: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    now = int(time.time())
    return f"{part({'alg': 'none'})}.{part({'sub': sub, 'iat': now, 'exp': now + int(lifetime_s)})}."
