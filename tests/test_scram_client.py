"""kfan's SCRAM login to brokers takes what Kafka's Java client takes: any
non-empty salt (a Kafka implementation with 10-byte salts exists; scramp alone
refuses salts under 12 bytes), but not fewer than 4096 iterations, and the
broker's signature is still checked. The broker here is a scripted RFC 5802
server computed with hashlib, independent of scramp and of kfan.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

import pytest

from proxy.security.sasl import ClientExchange, Credentials, SaslError

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class ScriptedBroker:
    """The server side of one SCRAM exchange for one user, from the password (RFC 5802 section 3)."""

    def __init__(self, mechanism: str, password: str, salt: bytes, iterations: int = 4096) -> None:
        self.hash = HASHES[mechanism]
        self.salt = salt
        self.iterations = iterations
        salted = hashlib.pbkdf2_hmac(self.hash, password.encode(), salt, iterations)
        self.stored_key = hashlib.new(self.hash, self._mac(salted, b"Client Key")).digest()
        self.server_key = self._mac(salted, b"Server Key")

    def _mac(self, key: bytes, message: bytes) -> bytes:
        return hmac.digest(key, message, self.hash)

    def first(self, client_first: bytes) -> bytes:
        self.client_first_bare = client_first.decode().removeprefix("n,,")
        client_nonce = dict(a.split("=", 1) for a in self.client_first_bare.split(","))["r"]
        salt = base64.b64encode(self.salt).decode()
        self.server_first = f"r={client_nonce}srv0nce,s={salt},i={self.iterations}"
        return self.server_first.encode()

    def final(self, client_final: bytes) -> bytes:
        """``v=<server signature>`` if the client's proof is right (it knew the password and used our salt)."""
        without_proof, _, proof = client_final.decode().rpartition(",p=")
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        client_signature = self._mac(self.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof), client_signature, strict=True))
        assert hashlib.new(self.hash, client_key).digest() == self.stored_key, "kfan's client proof is wrong"
        return b"v=" + base64.b64encode(self._mac(self.server_key, auth_message))


@pytest.mark.parametrize("mechanism", list(HASHES))
def test_a_broker_with_10_byte_salts_is_logged_in_to(mechanism: str) -> None:
    broker = ScriptedBroker(mechanism, "kfan-secret", os.urandom(10))
    client = ClientExchange(Credentials(mechanism, "kfan", "kfan-secret"))
    final = client.step(broker.first(client.first()))
    assert final is not None
    assert client.step(broker.final(final)) is None


@pytest.mark.parametrize("salt_length", [1, 11])
def test_any_non_empty_salt_is_taken(salt_length: int) -> None:
    broker = ScriptedBroker("SCRAM-SHA-256", "pw", os.urandom(salt_length))
    client = ClientExchange(Credentials("SCRAM-SHA-256", "kfan", "pw"))
    assert client.step(broker.final(client.step(broker.first(client.first())))) is None  # type: ignore[arg-type]


def test_the_server_signature_is_still_checked_with_a_short_salt() -> None:
    broker = ScriptedBroker("SCRAM-SHA-512", "kfan-secret", os.urandom(10))
    client = ClientExchange(Credentials("SCRAM-SHA-512", "kfan", "kfan-secret"))
    final = client.step(broker.first(client.first()))
    assert final is not None
    signature = bytearray(base64.b64decode(broker.final(final)[2:]))
    signature[-1] ^= 1
    with pytest.raises(SaslError, match="signature"):
        client.step(b"v=" + base64.b64encode(bytes(signature)))


def test_a_broker_that_does_not_know_the_password_is_refused() -> None:
    # The broker's signature proves it holds the server key of kfan's password.
    impostor = ScriptedBroker("SCRAM-SHA-256", "other", os.urandom(10))
    client = ClientExchange(Credentials("SCRAM-SHA-256", "kfan", "kfan-secret"))
    final = client.step(impostor.first(client.first()))
    assert final is not None
    impostor.stored_key = ScriptedBroker("SCRAM-SHA-256", "kfan-secret", impostor.salt).stored_key  # pass the proof check
    with pytest.raises(SaslError, match="signature"):
        client.step(impostor.final(final))


@pytest.mark.parametrize(
    ("server_first", "reason"),
    [
        ("r={nonce}x,s=QUJDRA==,i=4095", "less than the minimum 4096"),
        ("r={nonce}x,s=QUJDRA==,i=99999999", "more than the maximum"),
        ("r={nonce}x,s=QUJDRA==,i=4096000000", "not a number"),
        ("r={nonce}x,s=QUJDRA==,i=04096x", "not a number"),
        ("r={nonce}x,s=,i=4096", "empty"),
        ("r={nonce}x,s=not*base64,i=4096", "base64"),
        ("r={nonce},s=QUJDRA==,i=4096", "nonce"),
        ("r=someone-else,s=QUJDRA==,i=4096", "nonce"),
        ("s=QUJDRA==,r={nonce}x,i=4096", "Malformed"),
        ("m=ext,r={nonce}x,s=QUJDRA==,i=4096", "extension"),
        ("e=unknown-user", "unknown-user"),
    ],
)
def test_server_first_messages_kafka_refuses_are_refused(server_first: str, reason: str) -> None:
    client = ClientExchange(Credentials("SCRAM-SHA-256", "kfan", "pw"))
    nonce = dict(a.split("=", 1) for a in client.first().decode().removeprefix("n,,").split(","))["r"]
    with pytest.raises(SaslError, match=reason):
        client.step(server_first.format(nonce=nonce).encode())
    with pytest.raises(SaslError):
        client.step(b"v=anything")  # and the exchange stays failed
