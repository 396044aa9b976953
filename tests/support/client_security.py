"""How a test client reaches a secured kfan: TLS (a CA, maybe a client
certificate) and SASL (a mechanism with a user and password, or an
OAUTHBEARER token), said once and translated into each client library's own
settings (librdkafka for confluent-kafka and kcat, kafka-python, aiokafka).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ClientSecurity:
    ca: Path | None = None  # TLS when set: the CA kfan's certificate is checked against
    cert: Path | None = None  # mTLS: the client's certificate and key
    key: Path | None = None
    mechanism: str | None = None  # SASL when set
    username: str = ""
    password: str = field(default="", repr=False)
    token: Callable[[], str] | None = field(default=None, repr=False)  # OAUTHBEARER: a fresh JWT per call

    @property
    def protocol(self) -> str:
        return {(False, False): "PLAINTEXT", (True, False): "SSL", (False, True): "SASL_PLAINTEXT", (True, True): "SASL_SSL"}[
            (self.ca is not None, self.mechanism is not None)
        ]

    def librdkafka(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"security.protocol": self.protocol}
        if self.ca is not None:
            conf["ssl.ca.location"] = str(self.ca)
        if self.cert is not None:
            conf["ssl.certificate.location"] = str(self.cert)
            conf["ssl.key.location"] = str(self.key)
        if self.mechanism is not None:
            conf["sasl.mechanisms"] = self.mechanism
            if self.mechanism == "OAUTHBEARER":
                token = self.token
                assert token is not None
                conf["oauth_cb"] = lambda _config: _with_expiry(token())
            else:
                conf["sasl.username"] = self.username
                conf["sasl.password"] = self.password
        return conf

    def kcat(self) -> list[str]:
        """``-X`` options for kcat (librdkafka underneath; OAUTHBEARER tokens need a callback kcat lacks)."""
        assert self.mechanism != "OAUTHBEARER", "kcat cannot fetch OAUTHBEARER tokens"
        out: list[str] = []
        for k, v in self.librdkafka().items():
            out += ["-X", f"{k}={v}"]
        return out

    def kafka_python(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"security_protocol": self.protocol}
        if self.ca is not None:
            conf["ssl_cafile"] = str(self.ca)
        if self.cert is not None:
            conf["ssl_certfile"] = str(self.cert)
            conf["ssl_keyfile"] = str(self.key)
        if self.mechanism == "OAUTHBEARER":
            try:  # kafka-python 3 moved it
                from kafka.net.sasl.oauth import AbstractTokenProvider
            except ImportError:
                from kafka.sasl.oauth import AbstractTokenProvider
            token = self.token

            class Provider(AbstractTokenProvider):  # type: ignore[misc]
                def token(self) -> str:
                    assert token is not None
                    return token()

            return conf | self._python_sasl(Provider())
        return conf | self._python_sasl(None)

    def aiokafka(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"security_protocol": self.protocol}
        if self.ca is not None:
            from aiokafka.helpers import create_ssl_context

            conf["ssl_context"] = create_ssl_context(
                cafile=str(self.ca),
                certfile=str(self.cert) if self.cert else None,
                keyfile=str(self.key) if self.key else None,
            )
        if self.mechanism == "OAUTHBEARER":
            from aiokafka.abc import AbstractTokenProvider

            token = self.token

            class Provider(AbstractTokenProvider):  # type: ignore[misc]
                async def token(self) -> str:
                    assert token is not None
                    return token()

            return conf | self._python_sasl(Provider())
        return conf | self._python_sasl(None)

    def _python_sasl(self, token_provider: Any) -> dict[str, Any]:
        """The SASL settings kafka-python and aiokafka name alike; ``token_provider`` each library's own kind."""
        if self.mechanism is None:
            return {}
        if self.mechanism == "OAUTHBEARER":
            return {"sasl_mechanism": self.mechanism, "sasl_oauth_token_provider": token_provider}
        return {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.username, "sasl_plain_password": self.password}


def _with_expiry(token: str) -> tuple[str, float]:
    """A token and when it expires, as librdkafka's oauth_cb returns them: its own exp claim (librdkafka
    fetches a new token ahead of that), never a guessed lifetime that a short-lived token would not have."""
    import jwt

    exp = jwt.decode(token, options={"verify_signature": False}).get("exp")
    return token, float(exp) if exp is not None else time.time() + 300


PLAINTEXT = ClientSecurity()
