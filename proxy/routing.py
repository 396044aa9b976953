# ruff: noqa: F403, F405  (temporary, until the route table replaces this module)
"""The routing table: which APIs kfan serves and how each request is routed.

Policies (DESIGN.md): ``local`` (answered by kfan), ``leader`` (split by
partition leader), ``coordinator`` (to the group or transaction coordinator;
batched forms naming several groups or transactions are split by
coordinator), ``every broker`` (asked of each broker, answers concatenated),
``any`` (whole to a live broker, identity rewritten in the answer). An API absent from this table is never advertised, and a request for
it closes the connection, as a broker does.
"""

from __future__ import annotations

import enum

from .kafka.apis import *  # noqa: F403 (temporary, until the route table replaces this module)


class Policy(enum.Enum):
    LOCAL = "local"
    LEADER = "leader"
    COORDINATOR = "coordinator"
    EVERY_BROKER = "every broker"
    ANY = "any"



ROUTES: dict[int, Policy] = {
    API_VERSIONS: Policy.LOCAL,
    PRODUCE: Policy.LEADER,
    FETCH: Policy.LEADER,
    LIST_OFFSETS: Policy.LEADER,
    OFFSET_FOR_LEADER_EPOCH: Policy.LEADER,
    DELETE_RECORDS: Policy.LEADER,
    DESCRIBE_PRODUCERS: Policy.LEADER,
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
    DESCRIBE_GROUPS: Policy.COORDINATOR,
    DELETE_GROUPS: Policy.COORDINATOR,
    CONSUMER_GROUP_DESCRIBE: Policy.COORDINATOR,
    DESCRIBE_TRANSACTIONS: Policy.COORDINATOR,
    LIST_GROUPS: Policy.EVERY_BROKER,
    LIST_TRANSACTIONS: Policy.EVERY_BROKER,
    DESCRIBE_LOG_DIRS: Policy.EVERY_BROKER,
    FIND_COORDINATOR: Policy.ANY,  # answered with kfan itself as the coordinator
    METADATA: Policy.ANY,
    DESCRIBE_CLUSTER: Policy.ANY,
    CREATE_TOPICS: Policy.ANY,
    DELETE_TOPICS: Policy.ANY,
    CREATE_PARTITIONS: Policy.ANY,
    DESCRIBE_CONFIGS: Policy.ANY,  # a BROKER resource naming kfan goes to one real broker
    ALTER_CONFIGS: Policy.ANY,
    INCREMENTAL_ALTER_CONFIGS: Policy.ANY,
    DESCRIBE_TOPIC_PARTITIONS: Policy.ANY,
    ELECT_LEADERS: Policy.ANY,
    ALTER_PARTITION_REASSIGNMENTS: Policy.ANY,
    LIST_PARTITION_REASSIGNMENTS: Policy.ANY,
    DESCRIBE_ACLS: Policy.ANY,
    CREATE_ACLS: Policy.ANY,
    DELETE_ACLS: Policy.ANY,
    DESCRIBE_CLIENT_QUOTAS: Policy.ANY,
    ALTER_CLIENT_QUOTAS: Policy.ANY,
    DESCRIBE_USER_SCRAM_CREDENTIALS: Policy.ANY,
}

# Versions kfan itself cannot serve even where kio and the brokers can.
VERSION_CAPS: dict[int, tuple[int, int]] = {}

# Admin APIs that change the set of topics or partitions: the topology is
# refreshed after them so the next request routes the new partitions.
TOPOLOGY_CHANGING = {CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS, ALTER_PARTITION_REASSIGNMENTS, ELECT_LEADERS}

# Admin APIs a ZooKeeper-era broker serves only on the controller; KRaft
# brokers forward them, so the controller is a preference, not a must.
CONTROLLER_PREFERRED = {
    CREATE_TOPICS,
    DELETE_TOPICS,
    CREATE_PARTITIONS,
    ELECT_LEADERS,
    ALTER_PARTITION_REASSIGNMENTS,
    LIST_PARTITION_REASSIGNMENTS,
}


# APIs that only read: replaying or asking them again changes nothing on the cluster.
READ_ONLY = frozenset(
    {
        FETCH,
        LIST_OFFSETS,
        METADATA,
        OFFSET_FETCH,
        FIND_COORDINATOR,
        DESCRIBE_GROUPS,
        LIST_GROUPS,
        API_VERSIONS,
        DESCRIBE_ACLS,
        DESCRIBE_CONFIGS,
        DESCRIBE_LOG_DIRS,
        OFFSET_FOR_LEADER_EPOCH,
        LIST_PARTITION_REASSIGNMENTS,
        DESCRIBE_CLIENT_QUOTAS,
        DESCRIBE_USER_SCRAM_CREDENTIALS,
        DESCRIBE_CLUSTER,
        DESCRIBE_PRODUCERS,
        DESCRIBE_TRANSACTIONS,
        LIST_TRANSACTIONS,
        CONSUMER_GROUP_DESCRIBE,
        DESCRIBE_TOPIC_PARTITIONS,
    }
)

