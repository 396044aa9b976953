"""The differential authorization test's world: ACL bindings (a fixed core and a seeded random rest), and the
requests every principal sends, one per routed API that Kafka checks against its ACLs.

Requests are written so that sending one twice (once through each kfan) gives the same answer: admin changes
are ``validate_only``, deletions name what is absent or what the principal may not delete (decided by the ACLs
themselves, never by an answer), auto-creation is asked only where the principal may not create.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass
from typing import Any

from proxy.core.acls import CLUSTER_NAME, AclBinding, Acls, Operation, PatternType, Permission, ResourceType
from proxy.kafka import apis
from proxy.kafka.records import record_batch

T, G, X, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
Op = Operation
PRINCIPALS = ("alice", "bob", "carol")  # carol: only what User:* bindings give
OTHER_HOST = "10.9.9.9"  # a host no client of the test comes from
FETCH_WAIT_MS = 500  # how long a Fetch of a partition without new records waits


@dataclass(frozen=True)
class Names:
    prefix: str

    def __getattr__(self, item: str) -> str:
        return f"{self.prefix}-{item.replace('_', '-')}"


def bindings(n: Names, seed: int, extra: int = 24) -> list[AclBinding]:
    """The core bindings (literal, prefixed and wildcard names; DENY over ALLOW; implied operations; a host that
    never matches), then ``extra`` drawn at random from the same space."""

    def b(
        who: str, op: Operation, t: ResourceType, name: str, pattern: PatternType = LIT, perm: Permission = ALLOW, host: str = "*"
    ) -> AclBinding:
        principal = who if who.startswith("User:") else f"User:{who}"
        return AclBinding(principal, host, t, name, pattern, op, perm)

    core = [
        b("alice", Op.ALL, T, f"{n.prefix}-ord", PRE),
        b("alice", Op.READ, T, n.pay),
        b("alice", Op.READ, T, f"{n.prefix}-pa", PRE, DENY),
        b("alice", Op.DESCRIBE, T, n.logs),
        b("alice", Op.READ, G, f"{n.prefix}-g-", PRE),
        b("alice", Op.DELETE, G, n.g_etl),
        b("alice", Op.WRITE, X, f"{n.prefix}-tx-a", PRE),
        b("alice", Op.DESCRIBE, C, CLUSTER_NAME),
        b("alice", Op.ALTER_CONFIGS, T, n.orders),
        b("alice", Op.READ, G, n.share),
        b("bob", Op.DESCRIBE, T, "*"),
        b("bob", Op.DESCRIBE, T, n.logs, perm=DENY),
        b("bob", Op.WRITE, T, n.pay),
        b("bob", Op.READ, T, n.orders, host=OTHER_HOST),
        b("bob", Op.DESCRIBE, G, n.g_app),
        b("bob", Op.READ, G, n.share),
        b("bob", Op.DESCRIBE, X, f"{n.prefix}-tx", PRE),
        b("bob", Op.ALTER, C, CLUSTER_NAME),
        b("bob", Op.DESCRIBE_CONFIGS, C, CLUSTER_NAME),
        b("User:*", Op.DESCRIBE, G, f"{n.prefix}-g-", PRE),
        b("User:*", Op.ALL, T, n.gone, perm=DENY),
    ]
    rng = random.Random(seed)
    topics = [n.orders, n.pay, n.logs, f"{n.prefix}-o", f"{n.prefix}-new-"]
    groups = [n.g_app, n.g_etl, n.g_cg, n.share, n.share_idle, n.share_none, f"{n.prefix}-g-"]
    txns = [n.tx_a, n.tx_b, f"{n.prefix}-tx-"]
    space: list[tuple[ResourceType, list[str], list[Operation]]] = [
        (T, topics, [Op.READ, Op.WRITE, Op.DESCRIBE, Op.CREATE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.ALL]),
        (G, groups, [Op.READ, Op.DESCRIBE, Op.DELETE, Op.ALL]),
        (X, txns, [Op.WRITE, Op.DESCRIBE, Op.ALL]),
        (
            C,
            [CLUSTER_NAME],
            [Op.DESCRIBE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.CREATE, Op.IDEMPOTENT_WRITE, Op.CLUSTER_ACTION],
        ),
    ]
    drawn = []
    for _ in range(extra):
        t, names, ops = rng.choice(space)
        name = rng.choice(names)
        pattern = PRE if name.endswith("-") else LIT
        who = rng.choice(["alice", "bob", "User:*"])
        perm = DENY if rng.random() < 0.25 else ALLOW
        host = OTHER_HOST if rng.random() < 0.1 else "*"
        drawn.append(b(who, rng.choice(ops), t, name, pattern, perm, host))
    return list(dict.fromkeys(core + drawn))


@dataclass(frozen=True)
class Case:
    label: str
    api: int
    version: int
    body: dict[str, Any]


def cases(n: Names, principal: str, acls: Acls, topic_ids: dict[str, uuid.UUID], share_member: str) -> list[Case]:
    """Every request ``principal`` sends (the same through both kfans)."""
    me = f"User:{principal}"

    def allows(op: Operation, t: ResourceType, name: str) -> bool:
        return acls.allows(me, "127.0.0.1", op, t, name)

    records = record_batch([b"audited"])
    three = [0, 1, 2]
    out = [
        Case(
            "produce",
            apis.PRODUCE,
            9,
            {
                "acks": -1,
                "timeout": 10_000,
                "topic_data": [
                    {"name": t, "partition_data": [{"index": i, "records": records} for i in three]} for t in (n.orders, n.pay, n.ghost)
                ],
            },
        ),
        Case(
            "list-offsets",
            apis.LIST_OFFSETS,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [
                    {"name": t, "partitions": [{"partition_index": i, "timestamp": -1, "current_leader_epoch": -1} for i in three]}
                    for t in (n.orders, n.pay, n.logs, n.ghost)
                ],
            },
        ),
        Case(
            "offset-for-leader-epoch",
            apis.OFFSET_FOR_LEADER_EPOCH,
            4,
            {
                "replica_id": -1,
                "topics": [
                    {"topic": t, "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}
                    for t in (n.orders, n.logs)
                ],
            },
        ),
        Case(
            "delete-records",
            apis.DELETE_RECORDS,
            2,
            {"timeout": 10_000, "topics": [{"name": t, "partitions": [{"partition_index": 0, "offset": 0}]} for t in (n.orders, n.pay)]},
        ),
        Case(
            "describe-producers",
            apis.DESCRIBE_PRODUCERS,
            0,
            {"topics": [{"name": t, "partition_indexes": [0, 1]} for t in (n.orders, n.pay, n.logs)]},
        ),
        Case(
            "metadata-named",
            apis.METADATA,
            12,
            {
                "topics": [{"name": t} for t in (n.orders, n.pay, n.logs, n.ghost, n.gone)],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": True,
            },
        ),
        Case(
            "metadata-all",
            apis.METADATA,
            12,
            {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": True},
        ),
        Case(
            "metadata-by-id",
            apis.METADATA,
            12,
            {"topics": [{"topic_id": topic_ids[n.orders], "name": None}, {"topic_id": topic_ids[n.pay], "name": None}]},
        ),
        Case(
            "describe-topic-partitions",
            apis.DESCRIBE_TOPIC_PARTITIONS,
            0,
            {"topics": [{"name": t} for t in (n.orders, n.pay, n.logs, n.ghost)], "response_partition_limit": 100},
        ),
        Case("find-coordinator-groups", apis.FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [n.g_app, n.g_etl, n.other_group]}),
        Case("find-coordinator-txns", apis.FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [n.tx_a, n.tx_b]}),
        Case(
            "join-group",
            apis.JOIN_GROUP,
            7,
            {
                # A group of its own: the member it leaves pending must not change the answers to the others.
                "group_id": n.g_join,
                "session_timeout": 10_000,
                "rebalance_timeout": 10_000,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        ),
        Case(
            "sync-group",
            apis.SYNC_GROUP,
            5,
            {
                "group_id": n.g_app,
                "generation_id": 1,
                "member_id": "nobody",
                "protocol_type": "consumer",
                "protocol_name": "range",
                "assignments": [],
            },
        ),
        Case("leave-group", apis.LEAVE_GROUP, 4, {"group_id": n.g_app, "members": [{"member_id": "nobody"}]}),
        Case(
            "offset-commit",
            apis.OFFSET_COMMIT,
            8,
            {
                "group_id": n.g_etl,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "topics": [
                    {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1}]}
                    for t in (n.orders, n.pay)
                ],
            },
        ),
        Case(
            "offset-fetch",
            apis.OFFSET_FETCH,
            8,
            {
                "groups": [
                    {"group_id": n.g_etl, "topics": [{"name": t, "partition_indexes": [0]} for t in (n.orders, n.pay, n.logs)]},
                    {"group_id": n.g_app, "topics": None},
                    {"group_id": n.other_group, "topics": None},
                ]
            },
        ),
        Case(
            "describe-groups", apis.DESCRIBE_GROUPS, 5, {"groups": [n.g_app, n.g_etl, n.other_group], "include_authorized_operations": True}
        ),
        Case("list-groups", apis.LIST_GROUPS, 4, {"states_filter": []}),
        Case(
            "delete-groups",
            apis.DELETE_GROUPS,
            2,
            {"groups_names": [n.absent_group] + [g for g in (n.g_app, n.g_etl) if not allows(Op.DELETE, G, g)]},
        ),
        Case(
            "offset-delete",
            apis.OFFSET_DELETE,
            0,
            {"group_id": n.g_etl, "topics": [{"name": t, "partitions": [{"partition_index": 0}]} for t in (n.logs, n.pay)]},
        ),
        Case(
            "consumer-group-heartbeat",
            apis.CONSUMER_GROUP_HEARTBEAT,
            0,
            {
                "group_id": n.g_cg,
                "member_id": str(uuid.uuid4()),
                "member_epoch": 0,
                "rebalance_timeout": 10_000,
                "subscribed_topic_names": [n.orders, n.logs],
                "topic_partitions": [],
            },
        ),
        Case(
            "consumer-group-describe",
            apis.CONSUMER_GROUP_DESCRIBE,
            0,
            {"group_ids": [n.g_cg, n.other_group], "include_authorized_operations": True},
        ),
        Case(
            "share-group-heartbeat",
            apis.SHARE_GROUP_HEARTBEAT,
            1,
            {"group_id": n.share, "member_id": share_member, "member_epoch": 0, "subscribed_topic_names": [n.orders]},
        ),
        Case("share-group-describe", apis.SHARE_GROUP_DESCRIBE, 1, {"group_ids": [n.share], "include_authorized_operations": True}),
        Case(
            "describe-share-group-offsets",
            apis.DESCRIBE_SHARE_GROUP_OFFSETS,
            0,
            {"groups": [{"group_id": n.share, "topics": [{"topic_name": t, "partitions": [0]} for t in (n.orders, n.pay)]}]},
        ),
        Case(
            "init-producer-id-txn",
            apis.INIT_PRODUCER_ID,
            4,
            {"transactional_id": n.tx_a, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1},
        ),
        Case(
            "init-producer-id-idempotent",
            apis.INIT_PRODUCER_ID,
            4,
            {"transactional_id": None, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1},
        ),
        Case(
            "add-partitions-to-txn",
            apis.ADD_PARTITIONS_TO_TXN,
            3,
            {
                "v3_and_below_transactional_id": n.tx_a,
                "v3_and_below_producer_id": 999_999,
                "v3_and_below_producer_epoch": 0,
                "v3_and_below_topics": [{"name": t, "partitions": [0]} for t in (n.orders, n.pay)],
            },
        ),
        Case(
            "add-offsets-to-txn",
            apis.ADD_OFFSETS_TO_TXN,
            3,
            {"transactional_id": n.tx_a, "producer_id": 999_999, "producer_epoch": 0, "group_id": n.g_etl},
        ),
        Case("end-txn", apis.END_TXN, 3, {"transactional_id": n.tx_b, "producer_id": 999_999, "producer_epoch": 0, "committed": False}),
        Case(
            "txn-offset-commit",
            apis.TXN_OFFSET_COMMIT,
            3,
            {
                "transactional_id": n.tx_a,
                "group_id": n.g_etl,
                "producer_id": 999_999,
                "producer_epoch": 0,
                "generation_id": -1,
                "member_id": "",
                "topics": [
                    {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1}]}
                    for t in (n.orders, n.pay)
                ],
            },
        ),
        Case("describe-transactions", apis.DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [n.tx_a, n.tx_b, n.other_txn]}),
        Case("list-transactions", apis.LIST_TRANSACTIONS, 1, {"state_filters": [], "producer_id_filters": [], "duration_filter": -1}),
        Case(
            "create-topics",
            apis.CREATE_TOPICS,
            7,
            {
                "topics": [{"name": t, "num_partitions": 1, "replication_factor": 1} for t in (n.new_one, n.ord_new, n.plain_new)],
                "timeout": 10_000,
                "validate_only": True,
            },
        ),
        Case(
            "delete-topics",
            apis.DELETE_TOPICS,
            6,
            {
                "topics": [
                    {"name": t}
                    for t in [n.gone, n.never]
                    + [t for t in (n.logs,) if not (allows(Op.DELETE, T, t) or allows(Op.DELETE, C, CLUSTER_NAME))]
                ],
                "timeout": 10_000,
            },
        ),
        Case(
            "create-partitions",
            apis.CREATE_PARTITIONS,
            3,
            {
                "topics": [{"name": t, "count": 4, "assignments": None} for t in (n.orders, n.pay, n.ghost)],
                "timeout": 10_000,
                "validate_only": True,
            },
        ),
        Case(
            "describe-configs",
            apis.DESCRIBE_CONFIGS,
            4,
            {
                "resources": [
                    {"resource_type": 2, "resource_name": n.orders, "configuration_keys": ["retention.ms"]},
                    {"resource_type": 2, "resource_name": n.pay, "configuration_keys": ["retention.ms"]},
                    {"resource_type": 4, "resource_name": "", "configuration_keys": ["log.retention.hours"]},
                ]
            },
        ),
        Case(
            "incremental-alter-configs",
            apis.INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 2,
                        "resource_name": t,
                        "configs": [{"name": "retention.ms", "config_operation": 0, "value": "86400000"}],
                    }
                    for t in (n.orders, n.pay)
                ],
                "validate_only": True,
            },
        ),
        Case(
            "alter-configs",
            apis.ALTER_CONFIGS,
            2,
            {
                "resources": [
                    {"resource_type": 2, "resource_name": t, "configs": [{"name": "retention.ms", "value": "86400000"}]}
                    for t in (n.orders, n.logs)
                ],
                "validate_only": True,
            },
        ),
        Case(
            "describe-acls",
            apis.DESCRIBE_ACLS,
            3,
            {
                "resource_type_filter": 2,
                "resource_name_filter": n.ghost,
                "pattern_type_filter": 3,
                "principal_filter": None,
                "host_filter": None,
                "operation": 1,
                "permission_type": 1,
            },
        ),
        Case(
            "create-acls",
            apis.CREATE_ACLS,
            3,
            {
                "creations": [
                    {
                        "resource_type": 2,
                        "resource_name": n.ghost,
                        "resource_pattern_type": 3,
                        "principal": "User:ghost",
                        "host": "*",
                        "operation": 3,
                        "permission_type": 3,
                    }
                ]
            },
        ),
        Case(
            "delete-acls",
            apis.DELETE_ACLS,
            3,
            {
                "filters": [
                    {
                        "resource_type_filter": 2,
                        "resource_name_filter": n.never,
                        "pattern_type_filter": 3,
                        "principal_filter": "User:ghost",
                        "host_filter": None,
                        "operation": 1,
                        "permission_type": 1,
                    }
                ]
            },
        ),
        Case("describe-log-dirs", apis.DESCRIBE_LOG_DIRS, 4, {"topics": [{"topic": n.orders, "partitions": [0]}]}),
        Case(
            "elect-leaders",
            apis.ELECT_LEADERS,
            2,
            {"election_type": 0, "topic_partitions": [{"topic": n.orders, "partitions": [0]}], "timeout": 10_000},
        ),
        Case(
            "alter-partition-reassignments",
            apis.ALTER_PARTITION_REASSIGNMENTS,
            0,
            {"timeout": 10_000, "topics": [{"name": n.orders, "partitions": [{"partition_index": 0, "replicas": None}]}]},
        ),
        Case(
            "list-partition-reassignments",
            apis.LIST_PARTITION_REASSIGNMENTS,
            0,
            {"timeout": 10_000, "topics": [{"name": n.orders, "partition_indexes": [0]}]},
        ),
        Case(
            "describe-client-quotas",
            apis.DESCRIBE_CLIENT_QUOTAS,
            1,
            {"components": [{"entity_type": "user", "match_type": 0, "match": "ghost"}], "strict": False},
        ),
        Case(
            "alter-client-quotas",
            apis.ALTER_CLIENT_QUOTAS,
            1,
            {
                "entries": [
                    {
                        "entity": [{"entity_type": "user", "entity_name": "ghost"}],
                        "ops": [{"key": "producer_byte_rate", "value": 1024.0, "remove": False}],
                    }
                ],
                "validate_only": True,
            },
        ),
        Case("describe-user-scram-credentials", apis.DESCRIBE_USER_SCRAM_CREDENTIALS, 0, {"users": [{"name": "ghost"}]}),
        Case(
            "alter-user-scram-credentials",
            apis.ALTER_USER_SCRAM_CREDENTIALS,
            0,
            {"deletions": [{"name": "ghost", "mechanism": 2}], "upsertions": []},
        ),
        Case(
            "describe-quorum",
            apis.DESCRIBE_QUORUM,
            2,
            {"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
        ),
        Case("update-features", apis.UPDATE_FEATURES, 1, {"timeout": 10_000, "feature_updates": [], "validate_only": True}),
        Case("describe-cluster", apis.DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": True, "endpoint_type": 1}),
        Case("list-config-resources", apis.LIST_CONFIG_RESOURCES, 1, {"resource_types": [16]}),
    ]
    # One partition per Fetch: a Fetch spread over brokers is answered once one broker's answer is in (as a
    # broker answers once it has data or an error), the others' partitions "no data yet", whose answer is timing.
    out += [
        Case(
            f"fetch-{t}-{i}",
            apis.FETCH,
            12,
            {
                "replica_id": -1,
                "max_wait": FETCH_WAIT_MS,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": t,
                        "partitions": [
                            {
                                "partition": i,
                                "fetch_offset": 0,
                                "partition_max_bytes": 1 << 16,
                                "current_leader_epoch": -1,
                                "last_fetched_epoch": -1,
                                "log_start_offset": -1,
                            }
                        ],
                    }
                ],
            },
        )
        for t in (n.orders, n.pay, n.logs)
        for i in three
    ]
    share_topics = [
        {"topic_id": topic_ids[t], "partitions": [{"partition_index": 0, "acknowledgement_batches": []}]} for t in (n.orders, n.pay)
    ]
    out += [
        Case(
            "share-fetch",
            apis.SHARE_FETCH,
            1,
            {
                "group_id": n.share,
                "member_id": share_member,
                "share_session_epoch": 0,
                "max_wait": FETCH_WAIT_MS,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "topics": share_topics,
                "forgotten_topics_data": [],
            },
        ),
        Case(
            "alter-share-group-offsets",
            apis.ALTER_SHARE_GROUP_OFFSETS,
            0,
            {
                "group_id": n.share_idle,
                "topics": [{"topic_name": t, "partitions": [{"partition_index": 0, "start_offset": 0}]} for t in (n.orders, n.pay)],
            },
        ),
        Case(
            "streams-group-describe",
            apis.STREAMS_GROUP_DESCRIBE,
            0,
            {"group_ids": [n.g_streams, n.other_group], "include_authorized_operations": True},
        ),
        Case(
            "remove-raft-voter", apis.REMOVE_RAFT_VOTER, 0, {"cluster_id": None, "voter_id": 999, "voter_directory_id": uuid.UUID(int=999)}
        ),
    ]
    # A group with no offsets to delete: deleting them changes nothing.
    out.append(
        Case(
            "delete-share-group-offsets",
            apis.DELETE_SHARE_GROUP_OFFSETS,
            0,
            {"group_id": n.share_none, "topics": [{"topic_name": t} for t in (n.orders, n.pay)]},
        )
    )
    if allows(Op.READ, G, n.share):
        # Acknowledging nothing in the session the share fetch opened. Compared only where the group may be read: kfan
        # carrying the client's identity answers an acknowledgement with nothing to route itself, so the brokers
        # never judge the group's READ (kfan judging by ACLs refuses it, as Kafka does: tests/test_authorize.py).
        out.append(
            Case(
                "share-acknowledge",
                apis.SHARE_ACKNOWLEDGE,
                1,
                {"group_id": n.share, "member_id": share_member, "share_session_epoch": 1, "topics": share_topics},
            )
        )
    creatable = allows(Op.CREATE, C, CLUSTER_NAME) or allows(Op.CREATE, T, n.auto_new)
    described = allows(Op.DESCRIBE, T, n.auto_new)
    if not creatable or not described:  # asked to auto-create only where it cannot: a creation would change the second answer
        out.append(Case("metadata-auto-create", apis.METADATA, 12, {"topics": [{"name": n.auto_new}], "allow_auto_topic_creation": True}))
    return out
