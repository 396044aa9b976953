"""The users file: the SCRAM credentials kfan checks its clients against.

One JSON file, ``{"version": 1, "users": {name: {mechanism: credential}}}``,
each credential in Kafka's own ScramCredential text (what ``kafka-configs
--describe`` shows), so credentials move between Kafka and kfan unchanged; it
never holds a password. This module reads and writes that file and checks a
PLAIN password against it; the SASL exchanges themselves are in sasl.py.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import tempfile
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from hmac import compare_digest
from hmac import new as hmac_new
from pathlib import Path
from types import MappingProxyType
from typing import Any

from scramp.core import IterationCount
from scramp.utils import ScramException, h, hi, hmac, saslprep

FORMAT_VERSION = 1
SCRAM_MECHANISMS: Mapping[str, Callable[..., Any]] = MappingProxyType({"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512})
MIN_ITERATIONS = 4096
# Beyond scramp's own cap its server refuses the credential; a file asking for
# more would only turn every login into a CPU burn.
MAX_ITERATIONS = IterationCount.MAX_ITERATION_COUNT
# scramp's server refuses shorter salts; Kafka's own are about 25 bytes.
MIN_SALT_LENGTH = 12
SALT_LENGTH = 32

_FIELDS = ("salt", "stored_key", "server_key", "iterations")


@dataclass(frozen=True)
class ScramCredential:
    """What a SCRAM server keeps of a password (RFC 5802 section 3)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def to_text(self) -> str:
        """Kafka's ScramCredentialUtils text: ``salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>``."""
        b64 = base64.b64encode
        return f"salt={b64(self.salt).decode()},stored_key={b64(self.stored_key).decode()},server_key={b64(self.server_key).decode()},iterations={self.iterations}"

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        """Parses Kafka's text (fields in any order, as Kafka accepts); ValueError on anything else."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")  # base64 padding is '=' too: split at the first only
            if not sep or key not in _FIELDS:
                raise ValueError(f"not a SCRAM credential: unexpected field {key!r}")
            if key in fields:
                raise ValueError(f"not a SCRAM credential: {key} given twice")
            fields[key] = value
        missing = [k for k in _FIELDS if k not in fields]
        if missing:
            raise ValueError(f"not a SCRAM credential: missing {', '.join(missing)}")
        decoded: dict[str, bytes] = {}
        for key in ("salt", "stored_key", "server_key"):
            try:
                decoded[key] = base64.b64decode(fields[key], validate=True)
            except binascii.Error:
                raise ValueError(f"not a SCRAM credential: {key} is not base64") from None
            if not decoded[key]:
                raise ValueError(f"not a SCRAM credential: {key} is empty")
        iterations = fields["iterations"]
        if not (iterations.isascii() and iterations.isdigit()) or int(iterations) < 1:
            raise ValueError("not a SCRAM credential: iterations is not a positive integer")
        return cls(decoded["salt"], decoded["stored_key"], decoded["server_key"], int(iterations))


def derive(mechanism: str, password: str, salt: bytes, iterations: int) -> ScramCredential:
    """The credential of ``password``, computed as Kafka's ScramFormatter does.

    Kafka hashes the password's UTF-8 bytes without SASLprep, so scramp's
    ``make_auth_info`` (which applies SASLprep) would disagree with Kafka-made
    credentials for some non-ASCII passwords; the steps are scramp's own helpers.
    """
    hf = SCRAM_MECHANISMS[mechanism]
    salted = hi(hf, password.encode("utf-8"), salt, iterations)
    return ScramCredential(salt, h(hf, hmac(hf, salted, b"Client Key")), hmac(hf, salted, b"Server Key"), iterations)


def check_name(name: str) -> None:
    """ValueError unless ``name`` can be a SCRAM user: non-empty, printable, no ',' or '=', unchanged by SASLprep."""
    if not name:
        raise ValueError("a user name must not be empty")
    if any(unicodedata.category(c).startswith("C") for c in name):
        raise ValueError("a user name must not contain control or unassigned characters")
    if "," in name or "=" in name:
        # SCRAM escapes them as =2C and =3D, which other tools get wrong often enough to refuse them outright.
        raise ValueError("a user name must not contain ',' or '='")
    try:
        prepared = saslprep(name)
    except ScramException:
        prepared = None
    if prepared != name:
        # scramp's server looks up the SASLprep'd name: any other spelling could never log in with SCRAM.
        raise ValueError("a user name must be unchanged by SASLprep (RFC 4013)")


def _check_credential(name: str, mechanism: str, cred: ScramCredential) -> None:
    if not MIN_ITERATIONS <= cred.iterations <= MAX_ITERATIONS:
        raise ValueError(f"user {name!r} {mechanism}: iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    if len(cred.salt) < MIN_SALT_LENGTH:
        raise ValueError(f"user {name!r} {mechanism}: the salt must be at least {MIN_SALT_LENGTH} bytes")
    size = SCRAM_MECHANISMS[mechanism]().digest_size
    if len(cred.stored_key) != size or len(cred.server_key) != size:
        raise ValueError(f"user {name!r} {mechanism}: stored_key and server_key must be {size} bytes")


# A credential that matches no password, so an unknown user's PLAIN check costs
# what a known one's does and its timing does not tell which names exist.
_DECOY = ScramCredential(secrets.token_bytes(SALT_LENGTH), b"", b"", MIN_ITERATIONS)


class VerifiedPasswords:
    """PLAIN passwords lately found to match their user's stored credential, so a client that logs
    in again and again costs one PBKDF2 derivation, not one a login.

    The newest ``size`` are kept (least recently used go first). Each is held as an
    HMAC-SHA256, under a key made for this process, of the user name, the password and
    the whole credential it matched: no password is kept, a dump of the memory cannot be
    searched offline without the key, and a changed credential (a new users file)
    matches none of its old entries. Only successes are kept: a wrong password is
    derived every time. Safe to use from several threads.
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._key = secrets.token_bytes(32)
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seen)

    def _digest(self, name: str, password: str, mechanism: str, cred: ScramCredential) -> bytes:
        mac = hmac_new(self._key, digestmod=hashlib.sha256)
        parts = (
            name.encode(),
            password.encode(),
            mechanism.encode(),
            cred.salt,
            cred.stored_key,
            cred.server_key,
            str(cred.iterations).encode(),
        )
        for part in parts:  # each one length-prefixed: no two different tuples give the same input
            mac.update(len(part).to_bytes(8, "big") + part)
        return mac.digest()

    def holds(self, name: str, password: str, mechanism: str, cred: ScramCredential) -> bool:
        digest = self._digest(name, password, mechanism, cred)
        with self._lock:
            if digest not in self._seen:
                return False
            self._seen.move_to_end(digest)
            return True

    def add(self, name: str, password: str, mechanism: str, cred: ScramCredential) -> None:
        digest = self._digest(name, password, mechanism, cred)
        with self._lock:
            self._seen[digest] = None
            self._seen.move_to_end(digest)
            while len(self._seen) > self.size:
                self._seen.popitem(last=False)


class Users(Mapping[str, Mapping[str, ScramCredential]]):
    """An immutable map: user name -> {mechanism: ScramCredential}."""

    def __init__(self, users: Mapping[str, Mapping[str, ScramCredential]] | None = None) -> None:
        self._users: Mapping[str, Mapping[str, ScramCredential]] = MappingProxyType(
            {name: MappingProxyType(dict(creds)) for name, creds in (users or {}).items()}
        )

    def __getitem__(self, name: str) -> Mapping[str, ScramCredential]:
        return self._users[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._users)

    def __len__(self) -> int:
        return len(self._users)

    def __repr__(self) -> str:
        return f"Users({sorted(self._users)})"  # names only: credentials are password equivalents for offline guessing

    @property
    def names(self) -> frozenset[str]:
        return frozenset(self._users)

    def scram(self, name: str, mechanism: str) -> ScramCredential | None:
        return self._users.get(name, {}).get(mechanism)

    def check_password(self, name: str, password: str, verified: VerifiedPasswords | None = None) -> bool:
        """Whether ``password`` is ``name``'s, checked against the user's first SCRAM credential (PLAIN has none of its own).

        With ``verified``, a password it holds for that very credential is taken without deriving it again.
        """
        creds = self._users.get(name, {})
        mechanism = next((m for m in SCRAM_MECHANISMS if m in creds), None)
        if mechanism is None:
            derive("SCRAM-SHA-256", password, _DECOY.salt, _DECOY.iterations)
            return False
        cred = creds[mechanism]
        if verified is not None and verified.holds(name, password, mechanism, cred):
            return True
        ok = compare_digest(derive(mechanism, password, cred.salt, cred.iterations).stored_key, cred.stored_key)
        if ok and verified is not None:
            verified.add(name, password, mechanism, cred)
        return ok

    @classmethod
    def load(cls, path: Path) -> Users:
        """Reads and checks a users file; ValueError (naming the file) if it is malformed."""
        try:
            doc = json.loads(path.read_bytes())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{path}: not a JSON users file: {e}") from None
        try:
            return cls.from_json(doc)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def from_json(cls, doc: Any) -> Users:
        if not isinstance(doc, dict):
            raise ValueError("the users file must hold a JSON object")
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported users file version {doc.get('version')!r} (expected {FORMAT_VERSION})")
        unknown = set(doc) - {"version", "users"}
        if unknown:
            raise ValueError(f"unknown keys in the users file: {sorted(unknown)}")
        entries = doc.get("users") or {}
        if not isinstance(entries, dict):
            raise ValueError('"users" must be an object of user name -> {mechanism: credential}')
        users: dict[str, dict[str, ScramCredential]] = {}
        for name, creds in entries.items():
            # Only add_user holds names to check_name's rules: names Kafka took (a ',' or '=' in them) still work here.
            if not name:
                raise ValueError("a user name must not be empty")
            if not isinstance(creds, dict):
                raise ValueError(f"user {name!r}: expected an object of mechanism -> credential")
            users[name] = {}
            for mechanism, text in creds.items():
                if mechanism not in SCRAM_MECHANISMS:
                    raise ValueError(f"user {name!r}: unknown mechanism {mechanism!r} (known: {', '.join(SCRAM_MECHANISMS)})")
                if not isinstance(text, str):
                    raise ValueError(f"user {name!r} {mechanism}: the credential must be a string")
                try:
                    cred = ScramCredential.from_text(text)
                except ValueError as e:
                    raise ValueError(f"user {name!r} {mechanism}: {e}") from None
                _check_credential(name, mechanism, cred)
                users[name][mechanism] = cred
        return cls(users)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "users": {name: {m: c.to_text() for m, c in sorted(creds.items())} for name, creds in sorted(self._users.items())},
        }


def add_user(
    path: Path,
    name: str,
    password: str,
    mechanisms: Sequence[str] = ("SCRAM-SHA-256", "SCRAM-SHA-512"),
    iterations: int = 4096,
) -> None:
    """Sets ``name``'s credentials for ``mechanisms`` in the users file at ``path`` (made if missing).

    Other users, and this user's other mechanisms, are kept. The file is
    replaced atomically and left readable by its owner only.
    """
    check_name(name)
    if not password:
        raise ValueError("the password must not be empty")
    if not mechanisms:
        raise ValueError("no mechanisms given")
    for mechanism in mechanisms:
        if mechanism not in SCRAM_MECHANISMS:
            raise ValueError(f"unknown mechanism {mechanism!r} (known: {', '.join(SCRAM_MECHANISMS)})")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be from {MIN_ITERATIONS} to {MAX_ITERATIONS}")
    users = Users.load(path) if path.exists() else Users()
    updated = {n: dict(creds) for n, creds in users.items()}
    creds = updated.setdefault(name, {})
    for mechanism in mechanisms:
        creds[mechanism] = derive(mechanism, password, secrets.token_bytes(SALT_LENGTH), iterations)
    _write_atomically(path, (json.dumps(Users(updated).to_json(), indent=2) + "\n").encode())


def _write_atomically(path: Path, data: bytes) -> None:
    # The temporary file sits in the target's directory so os.replace is a
    # rename on one file system: a reader sees the old file or the new, never half.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash only once the directory is on disk
    finally:
        os.close(dir_fd)
