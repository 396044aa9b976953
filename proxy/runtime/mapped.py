"""Mapped buffers for large frames, used again once nothing views them.

A large frame (a Fetch answer of several MiB) is received into an anonymous
mapping (:func:`proxy.kafka.frames.FrameReader.receive_buffer`). A fresh
mapping costs the kernel a page fault per 4 KiB as the bytes arrive, and an
``munmap`` when it goes: on a 2-core VM 1.4 ms of CPU per MB, several times
what receiving the bytes costs (0.3 ms per MB into pages already mapped).
So the mappings are kept and handed out again.

A mapping is handed out again only when no view of it is left anywhere (its
only references are this module's): a frame's bytes are sliced into the
answers kfan writes, its Fetch memory and its capture, and whoever holds a
slice keeps the mapping from being reused, as it kept it from being unmapped
before. A reused mapping still holds an earlier frame's bytes, but a frame is
handed out only once all of its bytes were received into it.

Bounded: the mappings kept add up to at most :data:`RETAINED_BYTES` per
process (made in whole MiB; a frame gets the smallest unviewed one that
fits, if under twice its size); beyond that a frame gets a mapping of its
own, unmapped when its last view goes, as before. One not handed out for
:data:`IDLE_SECONDS` is given back (:func:`forget_idle_forever`), so a burst
leaves nothing behind at rest. The process's memory pool counts the frames'
bytes wherever they are held; this is what it keeps on top, at most.
"""

from __future__ import annotations

import mmap
import os
import sys
import time
from collections.abc import Callable

import trio

from proxy.runtime.reclaim import release_later

RETAINED_BYTES = 64 * 1024 * 1024
IDLE_SECONDS = 5.0  # a mapping not handed out for this long is given back (a burst leaves no trace at rest)
_GRAIN = 1024 * 1024  # mappings are made in whole MiB, so that frames of similar size share them
# A mapping's references when nothing views it: the entry that keeps it, and getrefcount's argument.
_UNVIEWED = 2


class _Kept:
    __slots__ = ("mapping", "taken_at")

    def __init__(self, mapping: mmap.mmap, taken_at: float) -> None:
        self.mapping = mapping
        self.taken_at = taken_at


class MappedBuffers:
    """The mappings kept for reuse (one set per process: :func:`take`)."""

    def __init__(self, retained_bytes: int = RETAINED_BYTES) -> None:
        self.retained_bytes = retained_bytes
        self._kept: list[_Kept] = []
        self._kept_bytes = 0

    @property
    def kept_bytes(self) -> int:
        return self._kept_bytes

    def take(self, n: int) -> memoryview:
        """A writable view of ``n`` bytes of a mapping nothing else views (its bytes are not zeroed)."""
        now = time.monotonic()
        best: _Kept | None = None
        for kept in self._kept:
            size = len(kept.mapping)
            # The smallest that fits, and not one twice the size (a larger frame may want it).
            if n <= size <= 2 * n and (best is None or size < len(best.mapping)) and sys.getrefcount(kept.mapping) == _UNVIEWED:
                best = kept
        if best is not None:
            best.taken_at = now
            return memoryview(best.mapping)[:n]
        size = -(-n // _GRAIN) * _GRAIN
        if self._kept_bytes + size > self.retained_bytes:
            self._give_back(lambda kept: True, self._kept_bytes + size - self.retained_bytes)
        mapping = mmap.mmap(-1, size)
        if self._kept_bytes + size <= self.retained_bytes:
            self._kept.append(_Kept(mapping, now))
            self._kept_bytes += size
        return memoryview(mapping)[:n]

    def forget_idle(self, idle: float = IDLE_SECONDS) -> None:
        """Give back the unviewed mappings not handed out for ``idle`` seconds."""
        since = time.monotonic() - idle
        self._give_back(lambda kept: kept.taken_at < since, self.retained_bytes)

    def _give_back(self, which: Callable[[_Kept], bool], wanted: int) -> None:
        """Stop keeping unviewed mappings that ``which`` names, oldest first, until ``wanted`` bytes are given back."""
        for kept in sorted(self._kept, key=lambda k: k.taken_at):
            if wanted <= 0:
                break
            if which(kept) and sys.getrefcount(kept.mapping) == _UNVIEWED:
                self._kept.remove(kept)
                self._kept_bytes -= len(kept.mapping)
                wanted -= len(kept.mapping)
                release_later(kept.mapping)  # unmapped off the event loop
                kept.mapping = None  # type: ignore[assignment]

    def clear(self) -> None:
        """Keep nothing (views still held keep their mappings alive until they go)."""
        self._kept.clear()
        self._kept_bytes = 0


_buffers = MappedBuffers()
os.register_at_fork(after_in_child=_buffers.clear)  # a worker keeps its own


def take(n: int) -> memoryview:
    """A writable view of ``n`` bytes of a mapping nothing else views, from the process's kept mappings."""
    return _buffers.take(n)


async def forget_idle_forever(every: float = 1.0) -> None:
    """Give back the process's idle mappings (:data:`IDLE_SECONDS`), checking every ``every`` seconds (trio)."""
    while True:
        await trio.sleep(every)
        _buffers.forget_idle()
