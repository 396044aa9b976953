"""What the sans-IO core tests feed the core: kfan's identity, three brokers, and every version kfan knows of each API it routes."""

from __future__ import annotations

from backends.topology import Broker
from proxy import routing
from proxy.core import Identity
from proxy.kafka import schema

IDENTITY = Identity(node_id=42, host="kfan.example", port=19092)
BROKERS = {i: Broker(i, f"broker{i}.internal", 9000 + i) for i in (1, 2, 3)}
ALL_VERSIONS = {k: (r.start, r.stop - 1) for k in routing.ROUTES if (r := schema.known_versions(k))}  # api key -> (lowest, highest)
