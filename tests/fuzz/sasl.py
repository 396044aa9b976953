"""Fuzz target (c'): SASL, where kfan reads what a peer sends before it knows who the peer is.

* ``sasl_server`` — a client's SASL messages (PLAIN, SCRAM-SHA-256/512,
  OAUTHBEARER), valid conversations with one message mutated, into kfan's
  server exchanges: ``ServerExchange.step`` never raises, whatever it gets.
* ``sasl_client`` — a broker's SASL answers, mutated, into kfan's client
  exchanges: ``ClientExchange.step`` raises only ``SaslError``.
* ``sasl_session`` — SaslHandshake and SaslAuthenticate frames, mutated,
  into a client connection's login state (:class:`proxy.server.client_auth.ClientSession`):
  only ``Refused`` or ``Malformed`` (the connection closes), or an answer.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from functools import cache
from typing import Any

import jwt
import trio
from cryptography.hazmat.primitives.asymmetric import rsa

from proxy.kafka import apis
from proxy.kafka.wire import Malformed
from proxy.security.oauth import TokenValidator
from proxy.security.sasl import MECHANISMS, Authenticator, ClientExchange, Credentials, SaslError
from proxy.security.users import MIN_ITERATIONS, Users, derive
from proxy.server.client_auth import ClientAuthConfig, ClientSession, Refused

from .harness import HANG_SECONDS, Tally, check
from .mutate import encode_request, mutate

SERVER, CLIENT, SESSION = "sasl_server", "sasl_client", "sasl_session"
USER, PASSWORD = "alice", "alice-secret"


@cache
def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@cache
def authenticator() -> Authenticator:
    salt = b"fuzz-salt-0123456789"
    users = Users({USER: {m: derive(m, PASSWORD, salt, MIN_ITERATIONS) for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")}})
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(_key().public_key()))
    jwks = jwt.PyJWKSet.from_dict({"keys": [{**jwk, "kid": "k1", "alg": "RS256", "use": "sig"}]})
    tokens = TokenValidator(lambda: jwks, issuer=None, audience=None, leeway=30)
    return Authenticator(MECHANISMS, users=lambda: users, tokens=tokens)


def _credentials(mechanism: str) -> Credentials:
    if mechanism == "OAUTHBEARER":
        token = jwt.encode({"sub": USER, "exp": int(time.time()) + 3600}, _key(), algorithm="RS256", headers={"kid": "k1"})
        return Credentials(mechanism, token=token)
    return Credentials(mechanism, USER, password=PASSWORD)


@cache
def conversation(mechanism: str) -> tuple[list[bytes], list[bytes]]:
    """A successful login, as (client messages, server answers)."""
    client, server = ClientExchange(_credentials(mechanism)), authenticator().start(mechanism)
    assert server is not None
    sent, answered = [client.first()], []
    while True:
        step = server.step(sent[-1])
        assert step.error is None, step.error
        answered.append(step.reply)
        following = client.step(step.reply)
        if following is None:
            return sent, answered
        sent.append(following)


def server_case(rng: random.Random) -> tuple[str, list[bytes]]:
    mechanism = rng.choice(MECHANISMS)
    sent, _ = conversation(mechanism)
    upto = rng.randrange(len(sent))
    return mechanism, [*sent[:upto], mutate(sent[upto], rng) if rng.random() < 0.9 else bytes(rng.randbytes(rng.randrange(64)))]


def run_server(mechanism: str, messages: list[bytes]) -> None:
    exchange = authenticator().start(mechanism)
    assert exchange is not None
    for message in messages:
        step = exchange.step(message)
        if step.done and step.error is None and step.principal != USER:
            raise AssertionError(f"a mutated login succeeded as {step.principal!r}")
        if step.done:
            return


def client_case(rng: random.Random) -> tuple[str, list[bytes]]:
    mechanism = rng.choice(MECHANISMS)
    _, answered = conversation(mechanism)
    upto = rng.randrange(len(answered))
    return mechanism, [*answered[:upto], mutate(answered[upto], rng)]


def run_client(mechanism: str, answers: list[bytes]) -> None:
    exchange = ClientExchange(_credentials(mechanism))
    exchange.first()
    for answer in answers:
        if exchange.step(answer) is None:
            return


def session_case(rng: random.Random) -> list[bytes]:
    """A login's requests (SaslHandshake v0/v1, SaslAuthenticate v0-2), one of them mutated."""
    mechanism = rng.choice(MECHANISMS)
    sent, _ = conversation(mechanism)
    handshake_version = rng.choice((0, 1))
    frames = [encode_request(apis.SASL_HANDSHAKE, handshake_version, {"mechanism": mechanism})]
    if handshake_version == 0:
        frames += sent  # bare tokens
    else:
        frames += [encode_request(apis.SASL_AUTHENTICATE, rng.choice((0, 1, 2)), {"auth_bytes": m}) for m in sent]
    frames.append(
        encode_request(
            apis.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        )
    )
    i = rng.randrange(len(frames))
    frames[i] = mutate(frames[i], rng)
    return frames


def run_session(frames: list[bytes]) -> None:
    async def login() -> None:
        session = ClientSession(ClientAuthConfig(authenticator(), failure_delay=0.0), "fuzz")
        for payload in frames:
            answer = await session.admit(payload)
            if answer is not None and answer.close is not None:
                return

    try:
        trio.run(login)
    except (Refused, Malformed):
        raise
    except BaseExceptionGroup as eg:  # only trio's own wrapping, unwrapped
        raise eg.exceptions[0] from None


def case_rng(seed: int | str, index: int) -> random.Random:
    return random.Random(f"sasl {seed} {index}")


def run_case(rng: random.Random, tally: Tally, index: int, hang_seconds: float = HANG_SECONDS) -> None:
    which = rng.random()
    if which < 0.4:
        mechanism, messages = server_case(rng)
        tally.count(SERVER)
        check(tally, SERVER, index, _repro(mechanism, messages), (), lambda: run_server(mechanism, messages), hang_seconds=hang_seconds)
    elif which < 0.7:
        mechanism, answers = client_case(rng)
        tally.count(CLIENT)
        check(
            tally,
            CLIENT,
            index,
            _repro(mechanism, answers),
            (SaslError,),
            lambda: run_client(mechanism, answers),
            hang_seconds=hang_seconds,
        )
    else:
        frames = session_case(rng)
        tally.count(SESSION)
        check(tally, SESSION, index, _repro("frames", frames), (Refused, Malformed), lambda: run_session(frames), hang_seconds=hang_seconds)


def _repro(what: str, messages: list[bytes]) -> Callable[[], dict[str, Any]]:
    return lambda: {"what": what, "messages": " ".join(m.hex() for m in messages)}


def campaign(seed: int | str, indexes: range, tally: Tally, hang_seconds: float = HANG_SECONDS, deadline: float | None = None) -> None:
    logging.getLogger("kfan.auth").setLevel(logging.ERROR)  # every failed login is logged: millions of lines
    for i in indexes:
        if deadline is not None and time.monotonic() > deadline:
            break
        run_case(case_rng(seed, i), tally, i, hang_seconds)
