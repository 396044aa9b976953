"""The world every golden route case runs in (tests/test_routes.py): kfan is node 42 in front of brokers 1, 2
and 3; topic "orders" has partitions 0, 1, 2 led by brokers 1, 2, 3; the controller is broker 2; groups g1 and g2
are coordinated by brokers 2 and 3, transactions tx1 and tx3 by brokers 3 and 1; everything else is unknown."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from proxy.core import Coordinator, Identity, KeyType
from proxy.core.routes import ROUTES
from proxy.core.topology import Broker, Topology
from proxy.kafka import schema
from tests.support.golden import SAME, WHOLE, Golden
from tests.support.records import record_batch

IDENTITY = Identity(node_id=42, host="kfan.example", port=19092)
KFAN_BROKER = {"node_id": 42, "host": "kfan.example", "port": 19092, "rack": None}
ORDERS_ID = uuid.UUID("00000000-0000-0000-0000-0000000000a1")
PAYMENTS_ID = uuid.UUID("00000000-0000-0000-0000-0000000000b2")
BATCH_0, BATCH_2 = record_batch(b"batch-0"), record_batch(b"batch-2")  # whole batches: kfan checks them before sending
TOPOLOGY = Topology(
    brokers={1: Broker(1, "broker1", 9091), 2: Broker(2, "broker2", 9092), 3: Broker(3, "broker3", 9093)},
    leaders={"orders": {0: 1, 1: 2, 2: 3}},
    topic_ids={ORDERS_ID: "orders"},
    cluster_id="golden",
    controller_id=2,
)
GROUP, TXN = KeyType.GROUP, KeyType.TRANSACTION
COORDINATORS = {
    Coordinator(GROUP, "g1"): 2,
    Coordinator(GROUP, "g2"): 3,
    Coordinator(TXN, "tx1"): 3,
    Coordinator(TXN, "tx3"): 1,
}
# kfan advertises every version it has a schema for (the cases pick theirs).
ADVERTISED = {k: (r.start, r.stop - 1) for k in ROUTES if (r := schema.known_versions(k)) is not None}

CONTROLLER = 2
GROUP_ID_NOT_FOUND = 69
ELECTION_NOT_NEEDED = 84
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8  # config resource types


def one_whole(
    name: str, api: int, version: int, to: Any, request: dict, answer: dict, effects: tuple = (), *, client_identity: bool = False
) -> Golden:
    """The common shape: the client's bytes to one destination, its answer back unchanged."""
    golden = Golden(name, api, version, request, subs={to: WHOLE}, answers={to: answer}, merged=SAME, effects=effects)
    return replace(golden, client_identity=client_identity)
