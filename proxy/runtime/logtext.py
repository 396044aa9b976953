"""Text a peer chose, made fit for a log line.

Anything a client sends (a mechanism name, a user name, a group id) may be
megabytes long and hold control characters, terminal escapes or fake line
breaks: logged as it came, it amplifies (a 16 MB mechanism name made 66 MB of
log) and can forge lines. :func:`printable` bounds it and escapes it.
"""

from __future__ import annotations

LIMIT = 128


def printable(text: str | bytes | bytearray | memoryview | None, limit: int = LIMIT) -> str:
    """``text`` with what is not printable escaped (``\\n``, ``\\x1b``, ``\\u202e``; a backslash as ``\\\\``),
    cut after at most ``limit`` characters with a marker giving the whole length: ``abc...(409600 chars)``.

    Bytes are read as UTF-8, each undecodable byte written ``\\xNN``. The work
    done is bounded by ``limit``, not by the length of ``text``.
    """
    if text is None:
        return "None"
    if isinstance(text, str):
        size, unit, head = len(text), "chars", text[: limit + 1]
    else:
        # limit + 1 characters take at most 4 * (limit + 1) bytes of UTF-8.
        size, unit = len(text), "bytes"
        head = bytes(text[: 4 * (limit + 1)]).decode("utf-8", errors="surrogateescape")
    out: list[str] = []
    used = 0
    for c in head:
        if "\udc80" <= c <= "\udcff":  # a byte that was not UTF-8 (surrogateescape)
            piece = f"\\x{ord(c) - 0xDC00:02x}"
        elif c == "\\":
            piece = "\\\\"
        elif c.isprintable():
            piece = c
        else:
            piece = c.encode("unicode_escape").decode("ascii")
        if used + len(piece) > limit:
            return "".join(out) + f"...({size} {unit})"
        out.append(piece)
        used += len(piece)
    return "".join(out)
