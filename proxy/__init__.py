"""kfan's client-facing side, in three layers that import one way:

- :mod:`proxy.kafka`: Kafka's bytes (wire primitives, the codec compiled from
  Kafka's schemas, frames, headers, API keys, error codes); stdlib and kio only.
- :mod:`proxy.core`: the sans-IO core (the route table, one module per routing
  policy, identity rewriting, the topology snapshot); imports only proxy.kafka.
- the trio layer: :mod:`proxy.server.connection` (one client), :mod:`proxy.server.forwarder`
  (each request's owner) and the modules beside them, :mod:`proxy.server.serve`,
  :mod:`proxy.cli`, which use everything, including the broker side in
  :mod:`backends`.

:mod:`proxy.capture` (capture, pcap import, live replay) builds on the core
and never on the connection layer. ``tests/test_layers.py`` pins the rule.
"""
