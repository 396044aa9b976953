"""The brokers' answers a merge could not decode and failed, for the I/O layer to log and count.

A merge turns an answer that does not decode into a retriable error for that
broker's part and carries on (DESIGN principle 6), so the reply alone does not
say it happened, and a broker that babbles would go unnoticed. The places
where a merge gives up on an answer :func:`note` it (its payload and why);
the I/O layer :func:`collect` s around its call to the merge and, knowing
which broker sent which payload, logs and counts them. With nobody collecting
(the replay job, unit tests of the core) :func:`note` does nothing.

An answer a merge reads only in part and forwards as it came (a coordinator's
answer breaking the schema) is not noted: the client gets the broker's bytes,
not an error.
"""

from __future__ import annotations

from contextvars import ContextVar

# (payload, why it does not decode), in the order noted.
Noted = list[tuple[object, str]]

_COLLECTING: ContextVar[Noted | None] = ContextVar("kfan_undecodable_answers", default=None)


def note(payload: object, error: Exception) -> None:
    """The answer ``payload`` (as the merge got it in its Response) did not decode and was failed."""
    noted = _COLLECTING.get()
    if noted is not None and not any(p is payload for p, _ in noted):
        noted.append((payload, str(error)))


class _Collecting:
    # A class rather than @contextmanager: it is entered once per merge, and a generator costs three times as much.
    __slots__ = ("_token",)

    def __enter__(self) -> Noted:
        noted: Noted = []
        self._token = _COLLECTING.set(noted)
        return noted

    def __exit__(self, *exc: object) -> None:
        _COLLECTING.reset(self._token)


def collect() -> _Collecting:
    """A block whose noted answers it gives (``with collect() as noted``); nested blocks collect apart."""
    return _Collecting()
