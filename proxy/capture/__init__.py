"""Traffic capture, apart from the data path.

- :mod:`.rows`: the capture format, one :class:`~.rows.CaptureRow` per client
  exchange (its columns, Arrow schema, Parquet files, record scrubbing);
- :mod:`.recorder`: what ``kfan serve --capture`` runs (:class:`~.recorder.Capture`:
  sampling, a bounded queue, a writer task that never blocks a client).

Boundaries: the core never imports this package; the connection only hands
rows to the recorder. It imports :mod:`proxy.kafka` (bytes) and
:mod:`proxy.core` (the topology) only, plus :mod:`proxy.runtime.metrics` for
the recorder's drop counter. The tools over captures live in
:mod:`proxy.tools` (pcap import, live replay) and ``spark/`` (the replay job),
which read rows through :mod:`.rows` alone: this package's ``__init__``
imports nothing, so reading rows does not load the recorder (trio, metrics).
"""
