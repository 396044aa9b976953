"""Waiting in tests: the one way a test waits for something that happens asynchronously.

A log line written by another process, a metric, a file, a front's event, a
counter bumped by another thread: each appears some time after the event that
causes it, so a test never reads it once right after the event and never
sleeps a fixed time hoping it is there. It polls a condition until a deadline,
and when the deadline passes it fails saying what it waited for (and, where
given, what it saw instead).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import trio

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
EVERY_S = 0.02


class Timeout(AssertionError):
    """The condition a test waited for did not hold by its deadline."""


def _failure(what: str, timeout: float, seen: Callable[[], object] | None) -> Timeout:
    detail = ""
    if seen is not None:
        try:
            detail = f"\nseen instead:\n{seen()}"
        except Exception as e:  # the description must never hide the timeout itself
            detail = f"\n(could not describe what was seen: {e!r})"
    return Timeout(f"timed out after {timeout:g} s waiting for {what}{detail}")


def wait_for(
    what: str, ok: Callable[[], T], timeout: float = DEFAULT_TIMEOUT_S, *, seen: Callable[[], object] | None = None, every: float = EVERY_S
) -> T:
    """Poll ``ok()`` until it returns something truthy, and return that.

    ``what`` names the condition for the failure message; ``seen``, if given, describes
    what was there instead (a log tail, the events so far) when the deadline passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = ok()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise _failure(what, timeout, seen)
        time.sleep(every)


async def wait_for_async(
    what: str, ok: Callable[[], T], timeout: float = DEFAULT_TIMEOUT_S, *, seen: Callable[[], object] | None = None, every: float = EVERY_S
) -> T:
    """:func:`wait_for` inside a trio test: the same polling, yielding to trio between polls."""
    deadline = trio.current_time() + timeout
    while True:
        value = ok()
        if value:
            return value
        if trio.current_time() >= deadline:
            raise _failure(what, timeout, seen)
        await trio.sleep(every)


def wait_for_line(lines: Sequence[str], pattern: str, timeout: float = DEFAULT_TIMEOUT_S, *, start: int = 0) -> re.Match[str]:
    """The first line of ``lines[start:]`` (a process's output, growing as another thread
    appends to it) that matches the regular expression ``pattern``, waiting for it to appear."""

    def match() -> re.Match[str] | None:
        for line in list(lines[start:]):
            if m := re.search(pattern, line):
                return m
        return None

    return wait_for(f"a line matching {pattern!r}", match, timeout, seen=lambda: "".join(list(lines[start:])[-40:]))


def elapsed_until(what: str, ok: Callable[[], object], timeout: float = DEFAULT_TIMEOUT_S) -> float:
    """Seconds until ``ok()`` holds (for tests that report how long something took, never to judge it)."""
    started = time.monotonic()
    wait_for(what, ok, timeout)
    return time.monotonic() - started
