"""OAUTHBEARER tokens: a JWT checked against the keys of a JWKS file.

kfan verifies the signature, expiry, issuer and audience of a client's token
and takes its ``sub`` as the principal, as Kafka's default validator does. It
fetches nothing: the JWKS file is kept current by whoever mounts it, and
reloaded through WatchedFile. Parsing the SASL message around the token is
sasl.py's job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from proxy.security.errors import SaslError

_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512", "secp256k1": "ES256K"}
# What PyJWK picks for a JWK without "alg"; any other algorithm_name came from the JWK itself.
_INFERRED = {"RSA": "RS256", "oct": "HS256"}


def load_jwks(path: Path) -> jwt.PyJWKSet:
    """The usable keys of a JWKS file (RFC 7517 section 5); ValueError if it has none or is not JSON."""
    try:
        return jwt.PyJWKSet.from_json(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
        raise ValueError(f"{path}: not a JWKS file: {e}") from None
    except jwt.PyJWKSetError as e:
        raise ValueError(f"{path}: {e}") from None


_PRIVATE = (rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey)


def _verifier(key: jwt.PyJWK) -> Any:
    # A JWKS that (wrongly) carries private parts still verifies with the public half.
    return key.key.public_key() if isinstance(key.key, _PRIVATE) else key.key


def _algorithms(key: jwt.PyJWK) -> frozenset[str]:
    """The signature algorithms ``key`` may verify: its own family, never "none", never HMAC with a public key."""
    material = _verifier(key)
    if isinstance(material, rsa.RSAPublicKey):
        family = _RSA_ALGORITHMS
    elif isinstance(material, ec.EllipticCurvePublicKey):
        family = frozenset({_EC_ALGORITHMS[material.curve.name]}) if material.curve.name in _EC_ALGORITHMS else frozenset()
    elif isinstance(material, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        family = frozenset({"EdDSA"})
    elif isinstance(material, bytes) and key.key_type == "oct":
        family = _HMAC_ALGORITHMS
    else:
        family = frozenset()
    if key.algorithm_name != _INFERRED.get(key.key_type or ""):
        # The JWK names its algorithm: only that one (if it belongs to the key's family at all).
        return family & {key.algorithm_name}
    return family


class TokenValidator:
    """Checks OAUTHBEARER tokens (JWS-signed JWTs) against ``jwks()``."""

    def __init__(self, jwks: Callable[[], jwt.PyJWKSet], *, issuer: str | None, audience: str | None, leeway: float) -> None:
        self._jwks = jwks
        self.issuer = issuer
        self.audience = audience
        self.leeway = leeway

    def current(self) -> TokenValidator:
        """This validator over the key set as it is now: for checks in a worker thread, which must not re-read the JWKS file."""
        try:
            keys = self._jwks()
        except Exception as e:
            failure = e

            def jwks() -> jwt.PyJWKSet:
                raise failure

            return TokenValidator(jwks, issuer=self.issuer, audience=self.audience, leeway=self.leeway)
        return TokenValidator(lambda: keys, issuer=self.issuer, audience=self.audience, leeway=self.leeway)

    def validate(self, token: str) -> tuple[str, float | None]:
        """(subject, expiry as a unix time); SaslError with a reason fit for logs (never the token) otherwise."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise SaslError("malformed token") from None
        alg, kid = header.get("alg"), header.get("kid")
        if not isinstance(alg, str) or alg.lower() == "none":
            raise SaslError("token is not signed")
        key = self._key(kid)
        if key.public_key_use not in (None, "sig"):
            raise SaslError("the token's key is not a signing key")
        if alg not in _algorithms(key):
            raise SaslError(f"algorithm {alg[:20]!r} does not fit the token's key")
        try:
            claims = jwt.decode(
                token,
                _verifier(key),
                algorithms=[alg],
                issuer=self.issuer,
                audience=self.audience,
                leeway=self.leeway,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except jwt.PyJWTError as e:
            raise SaslError(_reason(e)) from None
        except Exception as e:  # a key or claim shape PyJWT did not expect: still a bad token, not a crash
            raise SaslError(f"token check failed ({type(e).__name__})") from None
        subject, expiry = claims.get("sub"), claims.get("exp")
        if not isinstance(subject, str) or not subject:
            raise SaslError("the token's sub claim is empty")
        if not isinstance(expiry, int | float) or isinstance(expiry, bool):
            raise SaslError("the token's exp claim is not a number")
        return subject, float(expiry)

    def _key(self, kid: Any) -> jwt.PyJWK:
        try:
            keys = list(self._jwks())
        except Exception as e:
            raise SaslError(f"no JWKS to check tokens against ({type(e).__name__})") from None
        if kid is None:
            if len(keys) == 1:
                return keys[0]
            raise SaslError(f"token has no kid and the JWKS has {len(keys)} keys")
        for key in keys:
            if key.key_id == kid:
                return key
        raise SaslError("token's kid is not in the JWKS")


def _reason(e: jwt.PyJWTError) -> str:
    # PyJWT's own messages may quote header or claim values; these are fixed.
    if isinstance(e, jwt.ExpiredSignatureError):
        return "token expired"
    if isinstance(e, jwt.ImmatureSignatureError):
        return "token not yet valid"
    if isinstance(e, jwt.InvalidIssuerError):
        return "wrong issuer"
    if isinstance(e, jwt.InvalidAudienceError):
        return "wrong audience"
    if isinstance(e, jwt.MissingRequiredClaimError):
        return f"token lacks the {e.claim} claim"
    if isinstance(e, jwt.InvalidSignatureError):
        return "bad signature"
    if isinstance(e, jwt.DecodeError):
        return "malformed token"
    return f"invalid token ({type(e).__name__})"
