"""Fuzzing kfan's sans-IO core: nothing a client or a broker sends may stop kfan.

Two targets, both pure functions over bytes, seeded and reproducible:

* :mod:`tests.fuzz.client_frames` — mutated client frames through
  :class:`proxy.kafka.frames.FrameReader` and :func:`proxy.core.plan_request`; the
  only exceptions allowed are :class:`proxy.kafka.wire.Malformed` and
  :class:`proxy.core.Unsupported`.
* :mod:`tests.fuzz.broker_answers` — mutated broker answers through every
  plan's merge, :func:`tests.support.core_inputs.satisfied`,
  :func:`proxy.core.fetch.answer_watermarks` and the control plane's decoders; merges may
  raise only :class:`proxy.core.BrokerUnavailable`, the rest nothing but what
  their contract names.

Inputs come from :mod:`tests.fuzz.mutate` (valid requests for every API key
and version kfan advertises, valid broker answers for a plan, byte-level
mutators). ``python -m tests.fuzz`` runs a long campaign; ``tests/test_fuzz.py``
runs a bounded one in the normal test run.
"""
