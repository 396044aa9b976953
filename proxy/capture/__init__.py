"""Traffic capture and the tools over it, apart from the data path.

- :mod:`.rows`: the capture format, one :class:`CaptureRow` per client
  exchange (its columns, Arrow schema, Parquet files, record scrubbing);
- :mod:`.recorder`: what ``kfan serve --capture`` runs (:class:`Capture`:
  sampling, a bounded queue, a writer task that never blocks a client);
- :mod:`.pcap`: ``kfan capture import``, a tcpdump of direct client-broker
  traffic as capture rows;
- :mod:`.live_replay`: ``kfan replay --target``, the recorded requests sent
  to a running kfan and its answers compared.

Boundaries: the core never imports this package; the connection only hands
rows to :class:`Capture`. This package imports :mod:`proxy.kafka` (bytes)
and :mod:`proxy.core` (the topology; the route table's read-only APIs for
the live replay) only, plus :mod:`proxy.runtime.metrics` for the recorder's drop
counter. The Spark replay checks live in ``spark/`` and read rows through
:class:`CaptureRow`.
"""

from .recorder import Capture, CaptureConfig
from .rows import COLUMNS, CaptureRow, FileWriter, arrow_schema, read_capture, read_rows, topology_document

__all__ = [
    "COLUMNS",
    "Capture",
    "CaptureConfig",
    "CaptureRow",
    "FileWriter",
    "arrow_schema",
    "read_capture",
    "read_rows",
    "topology_document",
]
