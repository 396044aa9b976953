"""A file whose contents kfan keeps current: certificates, keys, passwords,
tokens, the users and quota files are re-read when they change on disk (a
rotated Kubernetes Secret swaps a symlink), without a restart; and the reading
of kfan's TOML files, with the errors an operator is shown.
"""

from __future__ import annotations

import logging
import os
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar

T = TypeVar("T")
log = logging.getLogger("kfan.security")

# A change is noticed at most this long after it happened; no stat per request.
CHECK_INTERVAL = 1.0


class WatchedFile(Generic[T]):
    """``value()``: ``load(path)``, loaded again when the file's identity, size or mtime changes.

    A file that fails to load after a change keeps the last good value, and
    says so in the log; one that never loaded raises.
    """

    def __init__(self, path: Path | str, load: Callable[[Path], T]) -> None:
        self.path = Path(path)
        self._load = load
        # A file that cannot be read at start is a configuration error: raise now.
        self._stamp: tuple[int, int, int, int] | None = self._stat()
        self._value: T = load(self.path)
        self._checked_at = time.monotonic()

    def _stat(self) -> tuple[int, int, int, int]:
        st = os.stat(self.path)  # follows symlinks: a Secret's ..data swap changes the inode
        return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def value(self) -> T:
        now = time.monotonic()
        if now - self._checked_at < CHECK_INTERVAL:
            return self._value
        self._checked_at = now
        try:
            stamp = self._stat()
            if stamp != self._stamp:
                self._value = self._load(self.path)
                self._stamp = stamp
        except Exception as e:
            log.warning("cannot load %s, keeping its previous version: %r", self.path, e)
        return self._value

    @property
    def stamp(self) -> tuple[int, int, int, int] | None:
        """Changes whenever a new version was loaded."""
        self.value()
        return self._stamp


def read_toml(path: Path, parse: Callable[[dict[str, Any]], T], invalid: type[Exception]) -> T:
    """``parse`` of a TOML file's document; raises :class:`ValueError` naming the file and what is wrong with it
    (unreadable, not TOML, or ``parse`` raised ``invalid``)."""
    try:
        return parse(tomllib.loads(path.read_text(encoding="utf-8")))
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not TOML: {e}") from None
    except invalid as e:
        raise ValueError(f"{path}: {e}") from None


def read_secret(path: Path) -> str:
    """A password or token file: its text without the trailing newline editors and `kubectl create secret` leave."""
    return path.read_text().rstrip("\r\n")
