"""The sans-IO SASL layer: kfan's exchanges against each other and against
independent peers (scramp's client and server, PyJWT-made tokens), the users
file and the JWT checks. No network.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from scramp import ScramClient, ScramException, ScramMechanism

from proxy.security import files
from proxy.security.oauth import TokenValidator, load_jwks
from proxy.security.sasl import (
    BAD_CREDENTIALS,
    MECHANISMS,
    Authenticator,
    ClientExchange,
    Credentials,
    SaslError,
    ServerExchange,
    ServerStep,
)
from proxy.security.users import ScramCredential, Users, add_user, derive

SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ISSUER = "https://idp.example"
AUDIENCE = "kafka"


# --- fixtures and helpers ------------------------------------------------------


@pytest.fixture
def users_path(tmp_path: Path) -> Path:
    path = tmp_path / "users.json"
    add_user(path, "alice", "alice-secret")
    add_user(path, "bob", "bob-secret", mechanisms=("SCRAM-SHA-512",))
    return path


@pytest.fixture
def users(users_path: Path) -> Users:
    return Users.load(users_path)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def jwk(public_key: Any, kid: str | None, **extra: str) -> dict[str, Any]:
    algorithm = RSAAlgorithm if isinstance(public_key, rsa.RSAPublicKey) else ECAlgorithm
    data = algorithm.to_jwk(public_key, as_dict=True)
    if kid is not None:
        data["kid"] = kid
    return {**data, **extra}


def write_jwks(path: Path, *keys: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"keys": list(keys)}))
    return path


@pytest.fixture
def jwks_path(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> Path:
    # The RSA key names no "alg" (as e.g. Azure AD's do), the EC one does.
    return write_jwks(tmp_path / "jwks.json", jwk(rsa_key.public_key(), "rsa1"), jwk(ec_key.public_key(), "ec1", alg="ES256", use="sig"))


@pytest.fixture
def validator(jwks_path: Path) -> TokenValidator:
    keys = load_jwks(jwks_path)
    return TokenValidator(lambda: keys, issuer=ISSUER, audience=AUDIENCE, leeway=30)


def claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    base: dict[str, Any] = {"sub": "svc-orders", "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + 600}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def rsa_token(key: rsa.RSAPrivateKey, kid: str | None = "rsa1", algorithm: str = "RS256", **overrides: Any) -> str:
    headers = {"kid": kid} if kid is not None else None
    return jwt.encode(claims(**overrides), key, algorithm=algorithm, headers=headers)


def converse(client: ClientExchange, server: ServerExchange) -> ServerStep:
    """Runs a whole exchange the way the proxy's two ends would; the last server step."""
    message = client.first()
    while True:
        step = server.step(message)
        if step.done:
            if step.error is None:
                assert client.step(step.reply) is None  # SCRAM: the client checks the server's signature here
            return step
        following = client.step(step.reply)
        assert following is not None
        message = following


def login(auth: Authenticator, credentials: Credentials) -> ServerStep:
    server = auth.start(credentials.mechanism)
    assert server is not None
    return converse(ClientExchange(credentials), server)


def scram_server_with_password(mechanism: str, name: str, password: str) -> Any:
    """scramp's own SCRAM server, knowing one user (an independent peer for kfan's client)."""
    info = ScramMechanism(mechanism).make_auth_info(password)
    return ScramMechanism(mechanism).make_server(lambda user: info if user == name else None)


# --- PLAIN ---------------------------------------------------------------------


def test_plain_round_trip(users: Users) -> None:
    auth = Authenticator(["PLAIN"], users=lambda: users)
    client = ClientExchange(Credentials("PLAIN", "alice", "alice-secret"))
    assert client.first() == b"\0alice\0alice-secret"
    step = auth.start("PLAIN").step(b"\0alice\0alice-secret")  # type: ignore[union-attr]
    assert step == ServerStep(b"", True, principal="alice", credentials=Credentials("PLAIN", "alice", "alice-secret"))
    assert client.step(b"") is None


def test_plain_through_kfan_client(users: Users) -> None:
    step = login(Authenticator(["PLAIN"], users=lambda: users), Credentials("PLAIN", "bob", "bob-secret"))
    assert (step.principal, step.error) == ("bob", None)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"\0alice\0wrong", BAD_CREDENTIALS),
        (b"\0mallory\0alice-secret", BAD_CREDENTIALS),
        (b"bob\0alice\0alice-secret", "PLAIN authorization id differs from the user name"),
        (b"alice\0alice-secret", "malformed PLAIN message"),
        (b"\0alice\0alice-secret\0", "malformed PLAIN message"),
        (b"\0\0alice-secret", "PLAIN message lacks a user name or password"),
        (b"\0alice\0", "PLAIN message lacks a user name or password"),
        (b"\0alice\0\xff\xfe", "PLAIN message is not UTF-8"),
    ],
)
def test_plain_failures(users: Users, message: bytes, error: str) -> None:
    step = Authenticator(["PLAIN"], users=lambda: users).start("PLAIN").step(message)  # type: ignore[union-attr]
    assert step.done and step.error == error
    assert step.principal is None and step.credentials is None


def test_plain_authzid_equal_to_user_is_accepted(users: Users) -> None:
    step = Authenticator(["PLAIN"], users=lambda: users).start("PLAIN").step(b"alice\0alice\0alice-secret")  # type: ignore[union-attr]
    assert step.principal == "alice"


def test_plain_without_user_check_accepts_any_well_formed_message() -> None:
    auth = Authenticator(["PLAIN"], check_users=False)
    step = auth.start("PLAIN").step(b"\0anyone\0whatever")  # type: ignore[union-attr]
    assert step.principal == "anyone" and step.credentials == Credentials("PLAIN", "anyone", "whatever")
    assert auth.start("PLAIN").step(b"\0anyone").error == "malformed PLAIN message"  # type: ignore[union-attr]


def test_credentials_repr_hides_secrets() -> None:
    text = repr(Credentials("PLAIN", "alice", "hunter2", token="eyJtoken"))
    assert "alice" in text and "hunter2" not in text and "eyJtoken" not in text


def test_client_refuses_unusable_credentials() -> None:
    with pytest.raises(ValueError):
        ClientExchange(Credentials("PLAIN", "", "x"))
    with pytest.raises(ValueError):
        ClientExchange(Credentials("PLAIN", "a\0b", "x"))
    with pytest.raises(ValueError):
        ClientExchange(Credentials("OAUTHBEARER", token="not a token\x01auth=x"))
    with pytest.raises(ValueError):
        ClientExchange(Credentials("GSSAPI", "a", "b"))


# --- SCRAM ---------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_round_trip(users: Users, mechanism: str) -> None:
    server = Authenticator([mechanism], users=lambda: users).start(mechanism)
    assert server is not None and server.mechanism == mechanism
    step = converse(ClientExchange(Credentials(mechanism, "alice", "alice-secret")), server)
    assert step.done and step.error is None and step.principal == "alice"
    assert step.credentials is None  # SCRAM proves a password without revealing it: nothing to replay
    assert server.step(b"n,,n=alice,r=abc").error == "exchange already finished"


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scramp_client_drives_kfan_server(users: Users, mechanism: str) -> None:
    client = ScramClient([mechanism], "alice", "alice-secret")
    server = Authenticator(list(SCRAM), users=lambda: users).start(mechanism)
    assert server is not None
    first = server.step(client.get_client_first().encode())
    assert not first.done and first.reply.startswith(b"r=")
    client.set_server_first(first.reply.decode())
    final = server.step(client.get_client_final().encode())
    assert final.done and final.principal == "alice" and final.error is None
    client.set_server_final(final.reply.decode())  # raises if kfan's server signature were wrong


@pytest.mark.parametrize("mechanism", SCRAM)
@pytest.mark.parametrize("password", ["alice-secret", "wrong"])
def test_a_final_message_repeating_the_client_nonce_is_taken_as_kafka_3_took_it(users: Users, mechanism: str, password: str) -> None:
    """librdkafka before 2.6.1 sends r=<client nonce><server nonce> where the server nonce already
    starts with the client's (librdkafka#4895); its proof is over that message. kfan accepts it when
    the proof is right, refuses it when not, and a nonce that does not end with the server's."""
    client = ScramClient([mechanism], "alice", password)
    server = Authenticator(list(SCRAM), users=lambda: users).start(mechanism)
    assert server is not None
    first_message = client.get_client_first()
    client_nonce = first_message.split("r=", 1)[1]
    first = server.step(first_message.encode())
    client.set_server_first(first.reply.decode())
    client.nonce = type(client.nonce)(client_nonce + str(client.nonce))  # the old librdkafka's final message
    final = server.step(client.get_client_final().encode())
    assert final.done
    if password == "alice-secret":
        assert final.error is None and final.principal == "alice"
        client.set_server_final(final.reply.decode())
    else:
        assert final.error is not None and final.principal is None

    other = Authenticator(list(SCRAM), users=lambda: users).start(mechanism)
    assert other is not None
    client = ScramClient([mechanism], "alice", "alice-secret")
    client.set_server_first(other.step(client.get_client_first().encode()).reply.decode())
    client.nonce = type(client.nonce)(str(client.nonce) + "x")  # ends with something else
    refused = other.step(client.get_client_final().encode())
    assert refused.done and refused.error is not None


@pytest.mark.parametrize("mechanism", SCRAM)
def test_kfan_client_against_scramp_server(mechanism: str) -> None:
    server = scram_server_with_password(mechanism, "carol", "carol-secret")
    client = ClientExchange(Credentials(mechanism, "carol", "carol-secret"))
    server.set_client_first(client.first().decode())
    final = client.step(server.get_server_first().encode())
    assert final is not None
    server.set_client_final(final.decode())
    assert client.step(server.get_server_final().encode()) is None


@pytest.mark.parametrize("mechanism", SCRAM)
def test_kfan_client_rejects_a_forged_server_final(mechanism: str) -> None:
    server = scram_server_with_password(mechanism, "carol", "carol-secret")
    client = ClientExchange(Credentials(mechanism, "carol", "carol-secret"))
    server.set_client_first(client.first().decode())
    server.set_client_final(client.step(server.get_server_first().encode()).decode())  # type: ignore[union-attr]
    signature = bytearray(base64.b64decode(server.get_server_final()[2:]))
    signature[0] ^= 1
    with pytest.raises(SaslError, match="signature"):
        client.step(b"v=" + base64.b64encode(bytes(signature)))
    with pytest.raises(SaslError):
        client.step(b"v=anything")  # and it stays failed


def test_kfan_client_reports_server_error() -> None:
    server = scram_server_with_password("SCRAM-SHA-256", "carol", "carol-secret")
    client = ClientExchange(Credentials("SCRAM-SHA-256", "carol", "wrong"))
    server.set_client_first(client.first().decode())
    final = client.step(server.get_server_first().encode())
    with pytest.raises(ScramException):
        server.set_client_final(final.decode())  # type: ignore[union-attr]
    error_final = server.get_server_final()
    assert error_final == "e=invalid-proof"
    with pytest.raises(SaslError, match="invalid-proof"):
        client.step(error_final.encode())


def test_kfan_client_rejects_malformed_server_first() -> None:
    client = ClientExchange(Credentials("SCRAM-SHA-256", "carol", "x"))
    client.first()
    with pytest.raises(SaslError):
        client.step(b"r=not-my-nonce,s=AAAAAAAAAAAAAAAAAAAAAA==,i=4096")
    client = ClientExchange(Credentials("SCRAM-SHA-256", "carol", "x"))
    client.first()
    with pytest.raises(SaslError):
        client.step(b"\xff")


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_wrong_password_fails(users: Users, mechanism: str) -> None:
    step = login(Authenticator(SCRAM, users=lambda: users), Credentials(mechanism, "alice", "nope"))
    assert step.done and step.error == BAD_CREDENTIALS and step.principal is None
    assert step.reply == b"e=invalid-proof"


def test_scram_unknown_user_looks_like_a_wrong_password(users: Users) -> None:
    auth = Authenticator(SCRAM, users=lambda: users)
    salts = []
    for _ in range(2):
        server = auth.start("SCRAM-SHA-256")
        client = ClientExchange(Credentials("SCRAM-SHA-256", "mallory", "guess"))
        first = server.step(client.first())  # type: ignore[union-attr]
        assert not first.done  # no early "unknown user"
        salts.append(dict(kv.split("=", 1) for kv in first.reply.decode().split(","))["s"])
        final = server.step(client.step(first.reply))  # type: ignore[union-attr, arg-type]
        assert final.done and final.error == BAD_CREDENTIALS and final.principal is None and final.reply == b"e=invalid-proof"
    assert salts[0] == salts[1]  # a salt that changed per attempt would betray a made-up user


def test_scram_user_without_that_mechanism_fails(users: Users) -> None:
    # bob has only SCRAM-SHA-512.
    step = login(Authenticator(SCRAM, users=lambda: users), Credentials("SCRAM-SHA-256", "bob", "bob-secret"))
    assert step.error == BAD_CREDENTIALS and step.principal is None
    step = login(Authenticator(SCRAM, users=lambda: users), Credentials("SCRAM-SHA-512", "bob", "bob-secret"))
    assert step.principal == "bob"


def test_scram_saslname_escapes_are_decoded() -> None:
    # Names with ',' or '=' can come from Kafka; on the wire they are =2C and =3D.
    salt = os.urandom(16)
    users = Users({"a,b=c": {"SCRAM-SHA-256": derive("SCRAM-SHA-256", "pw", salt, 4096)}})
    client = ClientExchange(Credentials("SCRAM-SHA-256", "a,b=c", "pw"))
    first = client.first()
    assert b"n=a=2Cb=3Dc," in first
    server = Authenticator(SCRAM, users=lambda: users).start("SCRAM-SHA-256")
    step = server.step(first)  # type: ignore[union-attr]
    step = server.step(client.step(step.reply))  # type: ignore[union-attr, arg-type]
    assert step.principal == "a,b=c"


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"\xff\xfe",
        b"n,,",
        b"n,a=alice,n=alice,r=abc",
        b"p=tls-unique,,n=alice,r=abc",
        b"x,,n=alice,r=abc",
        b"n,,n=al=ZZice,r=abc",
        b"n,,r=abc,n=alice",
    ],
)
def test_scram_malformed_client_first_fails(users: Users, message: bytes) -> None:
    step = Authenticator(SCRAM, users=lambda: users).start("SCRAM-SHA-256").step(message)  # type: ignore[union-attr]
    assert step.done and step.error and step.principal is None


def test_scram_malformed_client_final_fails(users: Users) -> None:
    server = Authenticator(SCRAM, users=lambda: users).start("SCRAM-SHA-256")
    first = server.step(b"n,,n=alice,r=clientnonce")  # type: ignore[union-attr]
    nonce = first.reply.decode().split(",")[0]
    step = server.step(f"c=biws,{nonce},p=AAAA".encode())  # type: ignore[union-attr]
    assert step.done and step.error and step.principal is None


def test_derive_matches_scramp_and_kafka_format() -> None:
    salt = bytes(range(20))
    for mechanism in SCRAM:
        ours = derive(mechanism, "pencil", salt, 4096)
        assert (ours.salt, ours.stored_key, ours.server_key, ours.iterations) == ScramMechanism(mechanism).make_auth_info(
            "pencil", 4096, salt
        )


# --- OAUTHBEARER ---------------------------------------------------------------


def test_oauth_round_trip(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey) -> None:
    token = rsa_token(rsa_key)
    assert ClientExchange(Credentials("OAUTHBEARER", token=token)).first() == b"n,,\x01auth=Bearer " + token.encode() + b"\x01\x01"
    step = login(Authenticator(["OAUTHBEARER"], tokens=validator), Credentials("OAUTHBEARER", token=token))
    assert step.done and step.error is None and step.principal == "svc-orders"
    assert step.credentials == Credentials("OAUTHBEARER", "svc-orders", token=token)
    assert step.expires_at == jwt.decode(token, options={"verify_signature": False})["exp"]


def test_oauth_authzid_and_extensions(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey) -> None:
    token = rsa_token(rsa_key).encode()
    auth = Authenticator(["OAUTHBEARER"], tokens=validator)
    ok = auth.start("OAUTHBEARER").step(b"n,a=svc-orders,\x01auth=Bearer " + token + b"\x01traceid=abc 123\x01\x01")  # type: ignore[union-attr]
    assert ok.principal == "svc-orders"
    bad = auth.start("OAUTHBEARER").step(b"n,a=admin,\x01auth=Bearer " + token + b"\x01\x01")  # type: ignore[union-attr]
    assert bad.done and bad.principal is None and bad.error == "OAUTHBEARER authorization id differs from the token subject"


@pytest.mark.parametrize(
    "message",
    [
        b"",
        b"n,,auth=Bearer x\x01\x01",
        b"n,,\x01auth=Bearer \x01\x01",
        b"n,,\x01auth=Basic abc\x01\x01",
        b"n,,\x01foo=bar\x01\x01",
        b"y,,\x01auth=Bearer abc\x01\x01",
        b"n,,\x01auth=Bearer abc\x01auth=Bearer abc\x01\x01",
        b"n,,\x01auth=Bearer abc\x01",
        "n,,\x01auth=Bearer ab\u00e9\x01\x01".encode(),
    ],
)
def test_oauth_malformed_messages_fail(validator: TokenValidator, message: bytes) -> None:
    step = Authenticator(["OAUTHBEARER"], tokens=validator).start("OAUTHBEARER").step(message)  # type: ignore[union-attr]
    assert step.done and step.error and step.principal is None and step.credentials is None


def test_oauth_bad_token_fails_without_echoing_it(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey) -> None:
    token = rsa_token(rsa_key, exp=int(time.time()) - 3600)
    step = Authenticator(["OAUTHBEARER"], tokens=validator).start("OAUTHBEARER").step(f"n,,\x01auth=Bearer {token}\x01\x01".encode())  # type: ignore[union-attr]
    assert step.done and step.error == "OAUTHBEARER: token expired" and step.principal is None
    assert token not in step.error and step.reply == b""


def test_oauth_client_reports_broker_rejection() -> None:
    client = ClientExchange(Credentials("OAUTHBEARER", token="a.b.c"))
    client.first()
    with pytest.raises(SaslError, match="invalid_token"):
        client.step(b'{"status":"invalid_token"}')
    assert ClientExchange(Credentials("OAUTHBEARER", token="a.b.c")).first()
    other = ClientExchange(Credentials("OAUTHBEARER", token="a.b.c"))
    other.first()
    assert other.step(b"") is None


def test_validator_accepts_valid_rsa_and_ec_tokens(
    validator: TokenValidator, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey
) -> None:
    exp = int(time.time()) + 300
    assert validator.validate(rsa_token(rsa_key, exp=exp)) == ("svc-orders", float(exp))
    # The RSA JWK names no alg: the whole RSA family is allowed, PSS too.
    assert validator.validate(rsa_token(rsa_key, algorithm="PS256", sub="pss"))[0] == "pss"
    ec_token = jwt.encode(claims(sub="svc-ec"), ec_key, algorithm="ES256", headers={"kid": "ec1"})
    assert validator.validate(ec_token)[0] == "svc-ec"


def test_validator_leeway(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey) -> None:
    now = int(time.time())
    assert validator.validate(rsa_token(rsa_key, exp=now - 10))[0] == "svc-orders"  # inside the 30 s leeway
    with pytest.raises(SaslError, match="expired"):
        validator.validate(rsa_token(rsa_key, exp=now - 120))
    with pytest.raises(SaslError, match="not yet valid"):
        validator.validate(rsa_token(rsa_key, nbf=now + 120))


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"iss": "https://evil.example"}, "wrong issuer"),
        ({"aud": "other"}, "wrong audience"),
        ({"aud": None}, "lacks the aud claim"),
        ({"iss": None}, "lacks the iss claim"),
        ({"sub": None}, "lacks the sub claim"),
        ({"exp": None}, "lacks the exp claim"),
        ({"sub": ""}, "sub"),
    ],
)
def test_validator_claim_failures(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey, overrides: dict[str, Any], reason: str) -> None:
    with pytest.raises(SaslError, match=reason):
        validator.validate(rsa_token(rsa_key, **overrides))


def test_validator_without_issuer_or_audience_ignores_them(jwks_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    keys = load_jwks(jwks_path)
    lax = TokenValidator(lambda: keys, issuer=None, audience=None, leeway=0)
    assert lax.validate(rsa_token(rsa_key, iss="anyone", aud="anything"))[0] == "svc-orders"


def test_validator_key_selection(validator: TokenValidator, tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with pytest.raises(SaslError, match="bad signature"):
        validator.validate(rsa_token(other))  # kid rsa1, signed by another key
    with pytest.raises(SaslError, match="kid is not in the JWKS"):
        validator.validate(rsa_token(rsa_key, kid="rsa2"))
    with pytest.raises(SaslError, match="no kid"):
        validator.validate(rsa_token(rsa_key, kid=None))  # two keys: which one?
    single = load_jwks(write_jwks(tmp_path / "one.json", jwk(rsa_key.public_key(), None)))
    alone = TokenValidator(lambda: single, issuer=ISSUER, audience=AUDIENCE, leeway=0)
    assert alone.validate(rsa_token(rsa_key, kid=None))[0] == "svc-orders"


def test_validator_rejects_unsigned_tokens(validator: TokenValidator) -> None:
    token = jwt.encode(claims(), None, algorithm="none", headers={"kid": "rsa1"})
    with pytest.raises(SaslError, match="not signed"):
        validator.validate(token)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def test_validator_rejects_hmac_with_the_public_key(validator: TokenValidator, rsa_key: rsa.RSAPrivateKey) -> None:
    # The classic confusion attack: HS256 keyed with the public key everyone can fetch.
    public_pem = rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    signing_input = (
        f"{_b64url(json.dumps({'alg': 'HS256', 'typ': 'JWT', 'kid': 'rsa1'}).encode())}.{_b64url(json.dumps(claims()).encode())}"
    )
    signature = hmac.new(public_pem, signing_input.encode(), hashlib.sha256).digest()
    with pytest.raises(SaslError, match="does not fit"):
        validator.validate(f"{signing_input}.{_b64url(signature)}")


def test_validator_algorithm_must_be_the_jwks_own(tmp_path: Path, rsa_key: rsa.RSAPrivateKey, ec_key: ec.EllipticCurvePrivateKey) -> None:
    keys = load_jwks(write_jwks(tmp_path / "k.json", jwk(rsa_key.public_key(), "rsa1", alg="RS512"), jwk(ec_key.public_key(), "ec1")))
    strict = TokenValidator(lambda: keys, issuer=None, audience=None, leeway=0)
    assert strict.validate(rsa_token(rsa_key, algorithm="RS512"))[0] == "svc-orders"
    with pytest.raises(SaslError, match="does not fit"):
        strict.validate(rsa_token(rsa_key, algorithm="RS256"))  # the JWK says RS512 only
    es384 = f"{_b64url(json.dumps({'alg': 'ES384', 'kid': 'ec1'}).encode())}.{_b64url(json.dumps(claims()).encode())}.{_b64url(bytes(96))}"
    with pytest.raises(SaslError, match="does not fit"):
        strict.validate(es384)  # a P-256 key is ES256 only


def test_validator_symmetric_jwks(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    secret = os.urandom(64)
    keys = load_jwks(write_jwks(tmp_path / "oct.json", {"kty": "oct", "kid": "s1", "k": _b64url(secret)}))
    sym = TokenValidator(lambda: keys, issuer=None, audience=None, leeway=0)
    assert sym.validate(jwt.encode(claims(), secret, algorithm="HS384", headers={"kid": "s1"}))[0] == "svc-orders"
    with pytest.raises(SaslError, match="does not fit"):
        sym.validate(rsa_token(rsa_key, kid="s1"))


def test_validator_rejects_encryption_keys(tmp_path: Path, rsa_key: rsa.RSAPrivateKey) -> None:
    keys = load_jwks(write_jwks(tmp_path / "enc.json", jwk(rsa_key.public_key(), "rsa1", use="enc")))
    with pytest.raises(SaslError, match="not a signing key"):
        TokenValidator(lambda: keys, issuer=None, audience=None, leeway=0).validate(rsa_token(rsa_key))


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "eyJhbGciOiJSUzI1NiJ9.e30.", "." * 5000])
def test_validator_malformed_tokens(validator: TokenValidator, token: str) -> None:
    with pytest.raises(SaslError):
        validator.validate(token)


def test_validator_without_jwks_fails_cleanly(rsa_key: rsa.RSAPrivateKey) -> None:
    def missing() -> jwt.PyJWKSet:
        raise FileNotFoundError("jwks.json")

    with pytest.raises(SaslError, match="no JWKS"):
        TokenValidator(missing, issuer=None, audience=None, leeway=0).validate(rsa_token(rsa_key))


@pytest.mark.parametrize("text", ["not json", '{"keys": []}', '{"keys": [{"kty": "nope"}]}', "[]"])
def test_load_jwks_rejects_bad_files(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="bad.json"):
        load_jwks(path)


# --- Authenticator -------------------------------------------------------------


def test_authenticator_mechanisms(users: Users, validator: TokenValidator) -> None:
    auth = Authenticator(["SCRAM-SHA-512", "PLAIN", "SCRAM-SHA-512"], users=lambda: users)
    assert auth.mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert auth.start("SCRAM-SHA-256") is None
    assert auth.start("OAUTHBEARER") is None
    assert auth.start("plain") is None
    assert auth.start("PLAIN") is not None
    assert set(MECHANISMS) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"}
    with pytest.raises(ValueError, match="GSSAPI"):
        Authenticator(["GSSAPI"], users=lambda: users)
    with pytest.raises(ValueError, match="users"):
        Authenticator(["SCRAM-SHA-256"], check_users=False)
    with pytest.raises(ValueError, match="users"):
        Authenticator(["PLAIN"])
    with pytest.raises(ValueError, match="OAUTHBEARER"):
        Authenticator(["OAUTHBEARER"], users=lambda: users)


def test_authenticator_follows_the_users_file(users_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "CHECK_INTERVAL", 0.0)
    watched = files.WatchedFile(users_path, Users.load)
    auth = Authenticator(["PLAIN", *SCRAM], users=watched.value)
    assert auth.start("PLAIN").step(b"\0dave\0dave-secret").error == BAD_CREDENTIALS  # type: ignore[union-attr]
    add_user(users_path, "dave", "dave-secret")
    assert auth.start("PLAIN").step(b"\0dave\0dave-secret").principal == "dave"  # type: ignore[union-attr]
    assert login(auth, Credentials("SCRAM-SHA-512", "dave", "dave-secret")).principal == "dave"


def test_a_failing_users_source_is_a_failed_step_not_a_crash() -> None:
    def broken() -> Users:
        raise OSError("gone")

    auth = Authenticator(["PLAIN", *SCRAM], users=broken)
    assert auth.start("PLAIN").step(b"\0a\0b").error  # type: ignore[union-attr]
    step = auth.start("SCRAM-SHA-256").step(b"n,,n=a,r=abc")  # type: ignore[union-attr]
    assert step.done and step.error and step.principal is None


# --- the users file ------------------------------------------------------------


def test_add_user_keeps_other_users_and_mechanisms(users_path: Path) -> None:
    users = Users.load(users_path)
    assert users.names == {"alice", "bob"}
    assert set(users["alice"]) == set(SCRAM) and set(users["bob"]) == {"SCRAM-SHA-512"}
    old_512 = users.scram("alice", "SCRAM-SHA-512")
    add_user(users_path, "alice", "new-secret", mechanisms=("SCRAM-SHA-256",))
    after = Users.load(users_path)
    assert after.names == {"alice", "bob"}
    assert after.scram("alice", "SCRAM-SHA-512") == old_512  # untouched
    assert after.scram("alice", "SCRAM-SHA-256") != users.scram("alice", "SCRAM-SHA-256")
    assert after.scram("bob", "SCRAM-SHA-512") == users.scram("bob", "SCRAM-SHA-512")
    assert after.scram("bob", "SCRAM-SHA-256") is None


def test_users_file_is_private_and_holds_no_password(users_path: Path) -> None:
    assert stat.S_IMODE(users_path.stat().st_mode) == 0o600
    data = users_path.read_bytes()
    for password in (b"alice-secret", b"bob-secret"):
        assert password not in data
        assert base64.b64encode(password) not in data
    assert [p.name for p in users_path.parent.iterdir()] == ["users.json"]  # no temporary file left behind


def test_users_file_format(users_path: Path) -> None:
    doc = json.loads(users_path.read_text())
    assert doc["version"] == 1
    text = doc["users"]["alice"]["SCRAM-SHA-256"]
    assert [part.split("=", 1)[0] for part in text.split(",")] == ["salt", "stored_key", "server_key", "iterations"]
    assert text.endswith(",iterations=4096")


def test_check_password(users: Users) -> None:
    assert users.check_password("alice", "alice-secret")
    assert users.check_password("bob", "bob-secret")  # only a SHA-512 credential
    assert not users.check_password("alice", "bob-secret")
    assert not users.check_password("alice", "")
    assert not users.check_password("nobody", "alice-secret")
    assert "alice-secret" not in repr(users) and "stored_key" not in repr(users)


def test_kafka_credential_text_round_trip() -> None:
    # As `kafka-configs --describe --entity-type users` prints it (Kafka's ScramCredentialUtils).
    text = "salt=MWx2NHBkbnc0ZndxN25vdGN4bTB5eTFrN3E=,stored_key=GGNSGxAMSDTmCQnN+jz8PPeZ6YGiRvp3PGiwhhd2V4c=,server_key=8Kl5KKPjVjYxi+NPfNEABNLU3omeHb9iMeBsfnyhxMM=,iterations=8192"
    cred = ScramCredential.from_text(text)
    assert cred.salt == b"1lv4pdnw4fwq7notcxm0yy1k7q" and cred.iterations == 8192 and len(cred.stored_key) == 32
    assert cred.to_text() == text
    reordered = "iterations=8192,server_key=8Kl5KKPjVjYxi+NPfNEABNLU3omeHb9iMeBsfnyhxMM=,salt=MWx2NHBkbnc0ZndxN25vdGN4bTB5eTFrN3E=,stored_key=GGNSGxAMSDTmCQnN+jz8PPeZ6YGiRvp3PGiwhhd2V4c="
    assert ScramCredential.from_text(reordered) == cred


@pytest.mark.parametrize(
    "text",
    [
        "",
        "salt=AAAA,stored_key=AAAA,server_key=AAAA",
        "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=4096,extra=1",
        "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=4096,iterations=4096",
        "salt=!!!!,stored_key=AAAA,server_key=AAAA,iterations=4096",
        "salt=,stored_key=AAAA,server_key=AAAA,iterations=4096",
        "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=-1",
        "salt=AAAA,stored_key=AAAA,server_key=AAAA,iterations=4k",
        "salt AAAA,stored_key=AAAA,server_key=AAAA,iterations=4096",
    ],
)
def test_credential_text_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        ScramCredential.from_text(text)


def _good_credential_text() -> str:
    return derive("SCRAM-SHA-256", "pw", bytes(16), 4096).to_text()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[1, 2]", "JSON object"),
        ("{not json", "not a JSON users file"),
        ('{"users": {}}', "version"),
        ('{"version": 2, "users": {}}', "version"),
        ('{"version": 1, "users": [], "extra": 1}', "unknown keys"),
        ('{"version": 1, "users": ["alice"]}', '"users" must be an object'),
        ('{"version": 1, "users": {"alice": "x"}}', "alice"),
        ('{"version": 1, "users": {"alice": {"SCRAM-SHA-1": "x"}}}', "unknown mechanism"),
        ('{"version": 1, "users": {"alice": {"SCRAM-SHA-256": 5}}}', "must be a string"),
        ('{"version": 1, "users": {"alice": {"SCRAM-SHA-256": "salt=AAAA"}}}', "not a SCRAM credential"),
        ('{"version": 1, "users": {"alice": {"SCRAM-SHA-512": "GOOD"}}}', "must be 64 bytes"),
        ('{"version": 1, "users": {"alice": {"SCRAM-SHA-256": "GOOD1024"}}}', "iterations"),
        ('{"version": 1, "users": {"": {}}}', "empty"),
    ],
)
def test_users_load_rejects_malformed_files(tmp_path: Path, doc: str, message: str) -> None:
    path = tmp_path / "users.json"
    good = _good_credential_text()
    path.write_text(doc.replace("GOOD1024", good.replace("iterations=4096", "iterations=1024")).replace("GOOD", good))
    with pytest.raises(ValueError, match=message) as info:
        Users.load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("doc", ['{"version": 1}', '{"version": 1, "users": {}}', '{"version": 1, "users": null}'])
def test_users_load_accepts_no_users(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "users.json"
    path.write_text(doc)
    users = Users.load(path)
    assert len(users) == 0 and users.scram("alice", "SCRAM-SHA-256") is None and not users.check_password("alice", "x")


@pytest.mark.parametrize("name", ["", "a,b", "a=b", "tab\there", "nul\0", "line\nbreak", "\u200bzero-width", "\ufb01"])
def test_add_user_rejects_awkward_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValueError):
        add_user(tmp_path / "users.json", name, "pw")
    assert not (tmp_path / "users.json").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"iterations": 1000}, "iterations"),
        ({"mechanisms": ("SCRAM-SHA-1",)}, "unknown mechanism"),
        ({"mechanisms": ()}, "no mechanisms"),
        ({"password": ""}, "password"),
    ],
)
def test_add_user_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"password": "pw", **kwargs}
    with pytest.raises(ValueError, match=message):
        add_user(tmp_path / "users.json", "alice", **arguments)


def test_add_user_does_not_overwrite_a_malformed_file(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text("{oops")
    with pytest.raises(ValueError):
        add_user(path, "alice", "pw")
    assert path.read_text() == "{oops"


def test_add_user_accepts_unicode_names_and_passwords(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user(path, "zoë", "pässwörd", iterations=8192)
    users = Users.load(path)
    assert users.check_password("zoë", "pässwörd") and users.scram("zoë", "SCRAM-SHA-256").iterations == 8192  # type: ignore[union-attr]
    step = login(Authenticator(SCRAM, users=lambda: users), Credentials("SCRAM-SHA-256", "zoë", "pässwörd"))
    assert step.principal == "zoë"


# --- never raises on arbitrary input -------------------------------------------


@pytest.fixture(scope="module")
def fuzz_setup(tmp_path_factory: pytest.TempPathFactory, rsa_key: rsa.RSAPrivateKey) -> tuple[Authenticator, dict[str, list[bytes]]]:
    """An authenticator with every mechanism, and one valid conversation (client messages) per mechanism."""
    directory = tmp_path_factory.mktemp("fuzz")
    add_user(directory / "users.json", "alice", "alice-secret")
    users = Users.load(directory / "users.json")
    keys = load_jwks(write_jwks(directory / "jwks.json", jwk(rsa_key.public_key(), "rsa1")))
    auth = Authenticator(MECHANISMS, users=lambda: users, tokens=TokenValidator(lambda: keys, issuer=ISSUER, audience=AUDIENCE, leeway=30))
    valid: dict[str, list[bytes]] = {}
    for mechanism in MECHANISMS:
        credentials = Credentials(mechanism, "alice", "alice-secret", token=rsa_token(rsa_key, exp=int(time.time()) + 86400))
        client, server = ClientExchange(credentials), auth.start(mechanism)
        assert server is not None
        messages = [client.first()]
        step = server.step(messages[-1])
        while not step.done:
            messages.append(client.step(step.reply))  # type: ignore[arg-type]
            step = server.step(messages[-1])
        assert step.principal == "alice" or step.principal == "svc-orders"
        valid[mechanism] = messages
    return auth, valid


def _checked(step: Any) -> ServerStep:
    assert isinstance(step, ServerStep) and isinstance(step.reply, bytes)
    if step.error is not None:
        assert step.done and step.principal is None and step.credentials is None
    elif step.done:
        assert step.principal  # a finished exchange either failed with a reason or named who logged in
    else:
        assert step.principal is None
    return step


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@FUZZ
@given(mechanism=st.sampled_from(MECHANISMS), messages=st.lists(st.binary(max_size=300), min_size=1, max_size=3))
def test_server_step_never_raises_on_arbitrary_bytes(fuzz_setup: tuple[Authenticator, Any], mechanism: str, messages: list[bytes]) -> None:
    auth, _ = fuzz_setup
    server = auth.start(mechanism)
    assert server is not None
    for message in messages:
        step = _checked(server.step(message))
        assert step.principal is None  # random bytes never authenticate


def _mutate(message: bytes, data: st.DataObject) -> bytes:
    if not message:
        return data.draw(st.binary(max_size=10))
    at = data.draw(st.integers(0, len(message) - 1))
    kind = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate", "repeat", "huge"]))
    if kind == "flip":
        return message[:at] + bytes([message[at] ^ data.draw(st.integers(1, 255))]) + message[at + 1 :]
    if kind == "insert":
        return message[:at] + data.draw(st.binary(min_size=1, max_size=8)) + message[at:]
    if kind == "delete":
        return message[:at] + message[at + 1 :]
    if kind == "truncate":
        return message[:at]
    if kind == "repeat":
        return message[:at] + message[at:] * 2
    return message[:at] + b"A" * 200_000 + message[at:]


@FUZZ
@given(mechanism=st.sampled_from(MECHANISMS), data=st.data())
def test_server_step_never_raises_on_mutated_valid_messages(
    fuzz_setup: tuple[Authenticator, dict[str, list[bytes]]], mechanism: str, data: st.DataObject
) -> None:
    auth, valid = fuzz_setup
    messages = list(valid[mechanism])
    which = data.draw(st.integers(0, len(messages) - 1))
    messages[which] = _mutate(messages[which], data)
    server = auth.start(mechanism)
    assert server is not None
    for message in messages:
        step = _checked(server.step(message))
        if step.done:
            break


def test_exchanges_are_independent(fuzz_setup: tuple[Authenticator, dict[str, list[bytes]]]) -> None:
    # A replayed SCRAM conversation fails: the server's nonce is new each time.
    auth, valid = fuzz_setup
    server = auth.start("SCRAM-SHA-256")
    first, final = valid["SCRAM-SHA-256"]
    assert not server.step(first).done  # type: ignore[union-attr]
    step = server.step(final)  # type: ignore[union-attr]
    assert step.done and step.principal is None and step.error
