"""kfan: a stateless Kafka protocol proxy. The folders are its layers, each importing only those before it:

- :mod:`proxy.kafka`: Kafka's bytes (wire primitives, the codec compiled from Kafka's schemas, frames,
  headers, API keys, error codes); stdlib, kio and crc32c only.
- :mod:`proxy.core`: the sans-IO core (the route table, one module per routing policy, identity
  rewriting, the topology snapshot); imports only proxy.kafka.
- :mod:`proxy.security`: TLS contexts, SASL exchanges, users and tokens, beside the core.
- :mod:`proxy.runtime`: trio leaves both sides use (metrics, memory budgets, frames on streams, logs).
- :mod:`proxy.capture`: capture rows and the recorder.
- :mod:`backends`: kfan's side of the brokers (links, logins, backoff, the cluster's state).
- :mod:`proxy.server`: the trio server (admission, one state machine per client connection, each
  request's owner, workers).
- :mod:`proxy.tools`: the bench, the embedded cluster, the demo, pcap import, live replay; serving
  never imports them. :mod:`spark` (the replay job) sits beside them.
- :mod:`proxy.cli`: the ``kfan`` command, wiring them together.

``tests/test_layers.py`` pins the rule; README "Architecture" explains it.
"""
