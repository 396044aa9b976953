"""scramp's SCRAM client, taking any salt length a broker uses, as Kafka's clients do.

scramp (1.5) refuses a server-first message whose salt is shorter than 12 bytes
(its ``Salt.MIN_LENGTH``, checked while it parses the message). That is scramp's
own policy, not SCRAM's or Kafka's: RFC 5802 asks only for a base64 salt, and
Kafka's Java client (ScramSaslClient) and librdkafka take any, so kfan could not
log in to a Kafka implementation whose stored salts are 10 bytes while the
brokers' own clients could. Only the parsing of that one message is kfan's
here; the nonce, the client proof and the check of the server's signature stay
scramp's, so this is a different salt policy, not a second SCRAM.
"""

from __future__ import annotations

import binascii
from base64 import b64decode

from scramp import ScramClient, ScramException
from scramp.core import ClientStage

from proxy.security.users import MAX_ITERATIONS, MIN_ITERATIONS


class KafkaScramClient(ScramClient):
    """A :class:`scramp.ScramClient` whose ``set_server_first`` checks the message as Kafka's client does, and that
    can log in with a delegation token (its id and HMAC as user name and password, and the ``tokenauth=true``
    extension after the nonce, as Kafka's ScramSaslClient sends it)."""

    def __init__(self, mechanisms: list[str], username: str, password: str, *, token_auth: bool = False) -> None:
        super().__init__(mechanisms, username, password)
        self.token_auth = token_auth

    def get_client_first(self) -> str:
        first = super().get_client_first()
        if not self.token_auth:
            return first
        # The extension is part of the bare message the proofs are computed over.
        self.client_first_bare += ",tokenauth=true"
        return first + ",tokenauth=true"

    def set_server_first(self, message: str) -> None:
        # The same stage check and the same three attributes scramp's own method sets,
        # so scramp's get_client_final and set_server_final carry on unchanged.
        self._set_stage(ClientStage.set_server_first)
        self.server_first = message
        self.nonce, self.salt, self.iterations = parse_server_first(message, str(self.c_nonce))


def parse_server_first(message: str, client_nonce: str) -> tuple[str, bytes, int]:
    """The nonce, salt and iteration count of a server-first-message (RFC 5802 section 7), checked.

    server-first-message = [reserved-mext ","] nonce "," salt "," iteration-count ["," extensions]
    """
    attributes = message.split(",")
    if attributes[0].startswith("e="):  # not in the RFC's grammar for this message, but scramp and some servers send it
        raise ScramException(f"The server returned an error: {attributes[0][2:80]}")
    if attributes[0].startswith("m="):
        raise ScramException("The server requires an extension kfan does not know (m=)")
    if len(attributes) < 3 or [a[:2] for a in attributes[:3]] != ["r=", "s=", "i="]:
        raise ScramException("Malformed server first message: expected r=, s= and i= attributes")
    nonce, salt_text, iterations_text = (a[2:] for a in attributes[:3])
    if not nonce.startswith(client_nonce) or len(nonce) <= len(client_nonce):
        raise ScramException("Client nonce doesn't match.")
    if not all(0x21 <= ord(c) <= 0x7E for c in nonce):
        raise ScramException("Nonce contains invalid characters")
    try:
        salt = b64decode(salt_text, validate=True)
    except (binascii.Error, ValueError):
        raise ScramException("The salt is not valid base64") from None
    if not salt:
        raise ScramException("The salt is empty")
    if not (iterations_text.isascii() and iterations_text.isdigit()) or len(iterations_text) > 9:
        raise ScramException(f"The iteration count {iterations_text[:20]!r} is not a number kfan accepts")
    iterations = int(iterations_text)
    # Kafka's ScramSaslClient refuses fewer than its mechanisms' minimum (4096, both
    # SHA-256 and SHA-512). The cap is kfan's: a broker asking for more would make
    # each login a long CPU burn in kfan's worker thread.
    if iterations < MIN_ITERATIONS:
        raise ScramException(f"Requested iterations {iterations} is less than the minimum {MIN_ITERATIONS}")
    if iterations > MAX_ITERATIONS:
        raise ScramException(f"Requested iterations {iterations} is more than the maximum {MAX_ITERATIONS}")
    return nonce, salt, iterations
