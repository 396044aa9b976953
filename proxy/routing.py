"""The routing table: which APIs kfan serves and how each request is routed.

Policies (DESIGN.md): ``local`` (answered by kfan), ``leader`` (split by
partition leader), ``coordinator`` (whole to the group or transaction
coordinator), ``any`` (whole to a live broker, identity rewritten in the
answer). An API absent from this table is never advertised, and a request for
it closes the connection, as a broker does.
"""

from __future__ import annotations

import enum


class Policy(enum.Enum):
    LOCAL = "local"
    LEADER = "leader"
    COORDINATOR = "coordinator"
    ANY = "any"


PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
TXN_OFFSET_COMMIT = 28
CREATE_PARTITIONS = 37
OFFSET_DELETE = 47
DESCRIBE_CLUSTER = 60
CONSUMER_GROUP_HEARTBEAT = 68

ROUTES: dict[int, Policy] = {
    API_VERSIONS: Policy.LOCAL,
    PRODUCE: Policy.LEADER,
    FETCH: Policy.LEADER,
    LIST_OFFSETS: Policy.LEADER,
    OFFSET_FOR_LEADER_EPOCH: Policy.LEADER,
    DELETE_RECORDS: Policy.LEADER,
    JOIN_GROUP: Policy.COORDINATOR,
    SYNC_GROUP: Policy.COORDINATOR,
    HEARTBEAT: Policy.COORDINATOR,
    LEAVE_GROUP: Policy.COORDINATOR,
    OFFSET_COMMIT: Policy.COORDINATOR,
    OFFSET_FETCH: Policy.COORDINATOR,
    OFFSET_DELETE: Policy.COORDINATOR,
    TXN_OFFSET_COMMIT: Policy.COORDINATOR,
    CONSUMER_GROUP_HEARTBEAT: Policy.COORDINATOR,
    INIT_PRODUCER_ID: Policy.COORDINATOR,  # to any broker when not transactional
    ADD_PARTITIONS_TO_TXN: Policy.COORDINATOR,
    ADD_OFFSETS_TO_TXN: Policy.COORDINATOR,
    END_TXN: Policy.COORDINATOR,
    FIND_COORDINATOR: Policy.ANY,  # answered with kfan itself as the coordinator
    METADATA: Policy.ANY,
    DESCRIBE_CLUSTER: Policy.ANY,
    CREATE_TOPICS: Policy.ANY,
    DELETE_TOPICS: Policy.ANY,
    CREATE_PARTITIONS: Policy.ANY,
}

# Versions kfan itself cannot serve even where kio and the brokers can.
# AddPartitionsToTxn v4+ is the broker-to-broker batched form; clients use v0-3.
VERSION_CAPS: dict[int, tuple[int, int]] = {
    ADD_PARTITIONS_TO_TXN: (0, 3),
}
