"""Large buffers given back off the event loop.

Unmapping a brokers' answer of 12 MiB (its frame is mapped memory, see
:func:`proxy.kafka.frames.FrameReader.receive_buffer`) costs the kernel 2-3
ms; when a burst of such answers expires together, the event loop spent 40
ms at once on it, with every other client waiting. A buffer handed to
:func:`release_later` loses its last reference in a thread of its own
instead, and ``munmap`` runs there without the GIL.
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

_queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
_started = threading.Lock()
_thread: threading.Thread | None = None


def _forget_thread() -> None:
    """In a forked child the thread is gone: start another on first use."""
    global _queue, _thread, _started
    _queue, _thread, _started = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_forget_thread)


def _release_forever() -> None:
    while True:
        item = _queue.get()
        del item  # the last reference, most often: the buffer is freed here


def release_later(item: Any) -> None:
    """Drop ``item`` (and what it holds) in the releasing thread; the caller must hold no other reference to it."""
    global _thread
    if _thread is None:
        with _started:
            if _thread is None:
                _thread = threading.Thread(target=_release_forever, name="kfan-release", daemon=True)
                _thread.start()
    _queue.put(item)
