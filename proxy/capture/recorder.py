"""The recorder behind ``kfan serve --capture``: sampling, a bounded queue, and a writer task.

Rows are offered without waiting: when the writer lags, the row is dropped
and counted (``kfan_capture_dropped_total``), never the client's request.
The writer task batches rows and writes them off the event loop (a worker
thread), rotating files by size and age (:class:`~proxy.capture.rows.FileWriter`).
With ``records="none"`` every record batch in the rows is emptied before
writing, so no payload is stored; the rows say so (``records_scrubbed``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import trio

from proxy.runtime import metrics

from .rows import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_FILE_SECONDS, CaptureRow, FileWriter, scrubbed


@dataclass(frozen=True)
class CaptureConfig:
    directory: Path
    sample: float = 1.0
    records: str = "full"  # or "none"
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_file_seconds: float = DEFAULT_MAX_FILE_SECONDS
    queue_rows: int = 10_000


class Capture:
    def __init__(self, config: CaptureConfig) -> None:
        self.config = config
        self._send, self._receive = trio.open_memory_channel[CaptureRow](config.queue_rows)
        self.dropped = 0
        self.written = 0
        config.directory.mkdir(parents=True, exist_ok=True)

    def sampled(self) -> bool:
        """Whether to capture the next exchange (``--capture-sample``)."""
        return self.config.sample >= 1.0 or random.random() < self.config.sample

    def offer(self, row: CaptureRow) -> None:
        """Queue ``row`` for writing, or drop and count it if the writer lags; never waits.

        Scrubbing (``records="none"``) happens in the writer, off the data path.
        """
        try:
            self._send.send_nowait(row)
        except trio.WouldBlock:
            self.dropped += 1
            metrics.CAPTURE_DROPPED.inc()

    async def run(self) -> None:
        """Write rows until cancelled; rows still queued then, and the file in progress, are completed on the way out."""
        writer = FileWriter(self.config.directory, self.config.max_file_bytes, self.config.max_file_seconds)
        batch: list[CaptureRow] = []
        try:
            while True:
                batch.append(await self._receive.receive())
                with trio.move_on_after(0.5):
                    while len(batch) < 1000:
                        batch.append(await self._receive.receive())
                self._take_queued(batch)
                rows, batch = batch, []
                # Not abandoned on cancel: a write in progress finishes first.
                await trio.to_thread.run_sync(self._write, writer, rows)
        finally:
            self._take_queued(batch)
            if batch:
                self._write(writer, batch)
            writer.close()

    def _take_queued(self, batch: list[CaptureRow]) -> None:
        while True:
            try:
                batch.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.ClosedResourceError, trio.EndOfChannel):
                return

    def _write(self, writer: FileWriter, rows: list[CaptureRow]) -> None:
        if self.config.records == "none":
            rows = [scrubbed(r) for r in rows]
        writer.write(rows)
        self.written += len(rows)
