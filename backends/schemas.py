"""Preloading the protocol schemas of the versions kfan advertises, off the event loop, whenever they change.

The control plane learns the brokers' API versions at bootstrap and from each
probe (:class:`backends.cluster.Cluster`); :meth:`SchemaPreloader.want` is told
the advertised versions each time, and one task loads the codecs of those not
loaded yet (:func:`proxy.kafka.preload.preload`) in a worker thread: the
first load imports a few hundred modules and takes seconds of CPU, far too
long for the event loop. Requests that come meanwhile load what they need
themselves, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

import trio

from proxy.kafka.preload import preload

log = logging.getLogger("kfan.cluster")

RETRY_S = 10.0  # after a failed preload (at the descriptor limit, most likely)


class SchemaPreloader:
    def __init__(self) -> None:
        self._wanted: dict[int, tuple[int, int]] | None = None
        self._wake = trio.Event()
        self.loaded = 0  # codecs this preloader loaded, for tests and the log

    def want(self, versions: Mapping[int, tuple[int, int]]) -> None:
        """Have the codecs of ``versions`` loaded soon (only the latest call counts)."""
        self._wanted = dict(versions)
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            versions, self._wanted = self._wanted, None
            if not versions:
                continue
            started = time.perf_counter()
            try:
                loaded = await trio.to_thread.run_sync(preload, versions, abandon_on_cancel=True)
            except Exception as e:  # out of descriptors already, say: requests load what they need, as before
                log.warning("protocol schemas: preloading failed (%r); trying again in %.0f s", e, RETRY_S)
                await trio.sleep(RETRY_S)
                if self._wanted is None:
                    self.want(versions)
                continue
            if loaded:
                self.loaded += loaded
                log.info(
                    "protocol schemas: %d codecs loaded for the %d APIs kfan advertises, in %.2f s",
                    loaded,
                    len(versions),
                    time.perf_counter() - started,
                )
