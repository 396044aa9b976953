"""kfan's own SASL identity at the brokers, from its configuration: a
password (environment or file) or an OAUTHBEARER token file, each re-read
when it changes, so every login uses what is on disk now.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .files import WatchedFile, read_secret
from .sasl import Credentials


def configured_credentials(
    mechanism: str,
    *,
    username: str | None = None,
    password: str | None = None,
    password_file: Path | None = None,
    token_file: Path | None = None,
) -> Callable[[], Credentials]:
    """The credentials of each login; raises ValueError when the configuration cannot make any."""
    if mechanism == "OAUTHBEARER":
        if token_file is None:
            raise ValueError("--broker-sasl-mechanism OAUTHBEARER needs --broker-sasl-token-file")
        token = WatchedFile(token_file, read_secret)
        return lambda: Credentials(mechanism, username or "", token=token.value())
    if not username:
        raise ValueError(f"--broker-sasl-mechanism {mechanism} needs --broker-sasl-username")
    if password_file is not None:
        secret = WatchedFile(password_file, read_secret)
        return lambda: Credentials(mechanism, username, password=secret.value())
    if password is None:
        raise ValueError(f"--broker-sasl-mechanism {mechanism} needs --broker-sasl-password-file or KFAN_BROKER_SASL_PASSWORD")
    fixed = Credentials(mechanism, username, password=password)
    return lambda: fixed
