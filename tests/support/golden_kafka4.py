"""Golden route cases of the APIs Kafka 4 added for clients and admin tools: share groups (KIP-932), streams
groups (KIP-1071), delegation tokens, SCRAM credentials, features, the metadata quorum and config resources.

The world is tests/support/golden_world.py's; tests/test_routes.py runs these with its own cases.
"""

from __future__ import annotations

import uuid

from proxy.core import ANY_BROKER, Coordinator, ForgetCoordinators, RefreshTopology, ReopenShareSessions, ShareSession
from proxy.core.share import INVALID_SHARE_SESSION_EPOCH
from proxy.kafka import apis, errors
from tests.support.golden import Golden
from tests.support.golden_world import BATCH_0, BROKER, BROKER_LOGGER, GROUP, GROUP_ID_NOT_FOUND, ORDERS_ID, one_whole

CLIENT_METRICS = 16  # config resource type
TOKEN_HMAC = b"\x01\x02\x03\x04"

SHARE_KEY = ("g1", "m-1")
# The client's share session after it fetched orders 0 and 2 (led by brokers 1 and 3): kfan's sessions there
# are at epochs 4 and 2; the client's next request carries its epoch 5.
SHARE_SESSION = ShareSession(5, {(ORDERS_ID, 0): 1, (ORDERS_ID, 2): 3}, {1: 4, 3: 2})
ACK = {"first_offset": 10, "last_offset": 19, "acknowledge_types": [1]}  # accepted
KFAN_ENDPOINT = {"node_id": 42, "host": "kfan.example", "port": 19092, "rack": None}

KAFKA4_CASES: list[Golden] = [
    # --- share: split by partition leader, a share session per broker -----------------------------
    Golden(
        "ShareFetch",
        apis.SHARE_FETCH,
        1,
        # A new share session (epoch 0) with all three partitions: each leader opens its own with its own.
        request={
            "group_id": "g1",
            "member_id": "m-1",
            "share_session_epoch": 0,
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 3000,
            "max_records": 500,
            "batch_size": 500,
            "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": i} for i in (0, 1, 2)]}],
        },
        subs={
            b: {"max_bytes": 1000, "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": i}]}]}
            for b, i in ((1, 0), (2, 1), (3, 2))
        },
        answers={
            1: {
                "error_code": 0,
                "acquisition_lock_timeout": 30000,
                "responses": [
                    {
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "error_code": 0,
                                "records": BATCH_0,
                                "acquired_records": [{"first_offset": 0, "last_offset": 0, "delivery_count": 1}],
                            }
                        ],
                    }
                ],
            },
            2: {
                "error_code": 0,
                "acquisition_lock_timeout": 30000,
                "responses": [
                    {
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "partition_index": 1,
                                "error_code": errors.NOT_LEADER_OR_FOLLOWER,
                                "current_leader": {"leader_id": 3, "leader_epoch": 7},
                            }
                        ],
                    }
                ],
                "node_endpoints": [{"node_id": 3, "host": "broker3", "port": 9093, "rack": None}],
            },
            3: {"error_code": 0, "acquisition_lock_timeout": 30000, "responses": []},
        },
        merged={
            "acquisition_lock_timeout": 30000,
            "responses": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "error_code": 0,
                            "records": BATCH_0,
                            "acquired_records": [{"first_offset": 0, "last_offset": 0, "delivery_count": 1}],
                        },
                        {
                            "partition_index": 1,
                            "error_code": errors.NOT_LEADER_OR_FOLLOWER,
                            "current_leader": {"leader_id": 42, "leader_epoch": 7},
                        },
                    ],
                }
            ],
            "node_endpoints": [KFAN_ENDPOINT],
        },
        effects=(RefreshTopology(),),
    ),
    Golden(
        "ShareAcknowledge",
        apis.SHARE_ACKNOWLEDGE,
        1,
        # Acknowledgements go to the brokers that delivered the records, each in its own session's epoch.
        request={
            "group_id": "g1",
            "member_id": "m-1",
            "share_session_epoch": 5,
            "topics": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {"partition_index": 2, "acknowledgement_batches": [ACK]},
                        {"partition_index": 0, "acknowledgement_batches": [ACK]},
                    ],
                }
            ],
        },
        subs={
            1: {
                "share_session_epoch": 4,
                "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": 0, "acknowledgement_batches": [ACK]}]}],
            },
            3: {
                "share_session_epoch": 2,
                "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": 2, "acknowledgement_batches": [ACK]}]}],
            },
        },
        answers={
            1: {"error_code": 0, "responses": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": 0, "error_code": 0}]}]},
            3: {"error_code": INVALID_SHARE_SESSION_EPOCH, "responses": []},
        },
        # Broker 3's session broke: its acknowledgement answers the error, and the next request reopens it there.
        merged={
            "error_code": 0,
            "responses": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {"partition_index": 0, "error_code": 0},
                        {"partition_index": 2, "error_code": INVALID_SHARE_SESSION_EPOCH},
                    ],
                }
            ],
        },
        effects=(ReopenShareSessions(SHARE_KEY, frozenset({3})),),
        share_sessions={SHARE_KEY: SHARE_SESSION},
    ),
    # --- share and streams groups: to the group's coordinator -------------------------------------
    one_whole(
        "ShareGroupHeartbeat",
        apis.SHARE_GROUP_HEARTBEAT,
        1,
        Coordinator(GROUP, "g1"),
        request={"group_id": "g1", "member_id": "m-1", "member_epoch": 0, "rack_id": None, "subscribed_topic_names": ["orders"]},
        answer={
            "error_code": 0,
            "member_id": "m-1",
            "member_epoch": 1,
            "heartbeat_interval": 5000,
            "assignment": {"topic_partitions": [{"topic_id": ORDERS_ID, "partitions": [0, 1, 2]}]},
        },
    ),
    Golden(
        "ShareGroupDescribe",
        apis.SHARE_GROUP_DESCRIBE,
        1,
        request={"group_ids": ["g2", "g1"], "include_authorized_operations": False},
        subs={3: {"group_ids": ["g2"]}, 2: {"group_ids": ["g1"]}},
        answers={
            3: {"groups": [{"error_code": 0, "group_id": "g2", "group_state": "Stable", "group_epoch": 4, "assignor_name": "simple"}]},
            2: {"groups": [{"error_code": errors.NOT_COORDINATOR, "group_id": "g1"}]},
        },
        merged={
            "groups": [
                {"error_code": 0, "group_id": "g2", "group_state": "Stable", "group_epoch": 4, "assignor_name": "simple"},
                {"error_code": errors.NOT_COORDINATOR, "group_id": "g1"},
            ]
        },
        effects=(ForgetCoordinators(frozenset({Coordinator(GROUP, "g1")})),),
    ),
    Golden(
        "DescribeShareGroupOffsets",
        apis.DESCRIBE_SHARE_GROUP_OFFSETS,
        1,
        request={
            "groups": [
                {"group_id": "g1", "topics": [{"topic_name": "orders", "partitions": [0, 1]}]},
                {"group_id": "g2", "topics": None},
            ]
        },
        subs={
            2: {"groups": [{"group_id": "g1", "topics": [{"topic_name": "orders", "partitions": [0, 1]}]}]},
            3: {"groups": [{"group_id": "g2", "topics": None}]},
        },
        answers={
            2: {
                "groups": [
                    {
                        "group_id": "g1",
                        "topics": [
                            {
                                "topic_name": "orders",
                                "topic_id": ORDERS_ID,
                                "partitions": [
                                    {"partition_index": 0, "start_offset": 10, "leader_epoch": 3, "lag": 5},
                                    {"partition_index": 1, "start_offset": -1, "leader_epoch": -1, "lag": -1},
                                ],
                            }
                        ],
                    }
                ]
            },
            3: {"groups": [{"group_id": "g2", "topics": [], "error_code": GROUP_ID_NOT_FOUND, "error_message": "no such group"}]},
        },
        merged={
            "groups": [
                {
                    "group_id": "g1",
                    "topics": [
                        {
                            "topic_name": "orders",
                            "topic_id": ORDERS_ID,
                            "partitions": [
                                {"partition_index": 0, "start_offset": 10, "leader_epoch": 3, "lag": 5},
                                {"partition_index": 1, "start_offset": -1, "leader_epoch": -1, "lag": -1},
                            ],
                        }
                    ],
                },
                {"group_id": "g2", "topics": [], "error_code": GROUP_ID_NOT_FOUND, "error_message": "no such group"},
            ]
        },
    ),
    one_whole(
        "AlterShareGroupOffsets",
        apis.ALTER_SHARE_GROUP_OFFSETS,
        0,
        Coordinator(GROUP, "g2"),
        request={"group_id": "g2", "topics": [{"topic_name": "orders", "partitions": [{"partition_index": 2, "start_offset": 0}]}]},
        answer={
            "error_code": 0,
            "responses": [{"topic_name": "orders", "topic_id": ORDERS_ID, "partitions": [{"partition_index": 2, "error_code": 0}]}],
        },
    ),
    one_whole(
        "DeleteShareGroupOffsets",
        apis.DELETE_SHARE_GROUP_OFFSETS,
        0,
        Coordinator(GROUP, "g1"),
        request={"group_id": "g1", "topics": [{"topic_name": "orders"}]},
        answer={"error_code": 0, "responses": [{"topic_name": "orders", "topic_id": ORDERS_ID, "error_code": 0}]},
    ),
    one_whole(
        "StreamsGroupHeartbeat",
        apis.STREAMS_GROUP_HEARTBEAT,
        0,
        Coordinator(GROUP, "g2"),
        request={"group_id": "g2", "member_id": "m-7", "member_epoch": 0, "rebalance_timeout": 30000, "process_id": "p-1"},
        answer={
            "error_code": 0,
            "member_id": "m-7",
            "member_epoch": 1,
            "heartbeat_interval": 5000,
            "active_tasks": [{"subtopology_id": "0", "partitions": [0, 1, 2]}],
            "standby_tasks": [],
            "warmup_tasks": [],
        },
    ),
    Golden(
        "StreamsGroupDescribe",
        apis.STREAMS_GROUP_DESCRIBE,
        0,
        request={"group_ids": ["g1", "unknown-group", "g2"], "include_authorized_operations": False},
        # "unknown-group" has no known coordinator: it goes whole, by itself, to be looked up as it is sent.
        subs={2: {"group_ids": ["g1"]}, 3: {"group_ids": ["g2"]}, Coordinator(GROUP, "unknown-group"): {"group_ids": ["unknown-group"]}},
        answers={
            2: {"groups": [{"error_code": 0, "group_id": "g1", "group_state": "Stable", "group_epoch": 2, "assignment_epoch": 2}]},
            3: {"groups": [{"error_code": GROUP_ID_NOT_FOUND, "group_id": "g2"}]},
            Coordinator(GROUP, "unknown-group"): {"groups": [{"error_code": GROUP_ID_NOT_FOUND, "group_id": "unknown-group"}]},
        },
        merged={
            "groups": [
                {"error_code": 0, "group_id": "g1", "group_state": "Stable", "group_epoch": 2, "assignment_epoch": 2},
                {"error_code": GROUP_ID_NOT_FOUND, "group_id": "unknown-group"},
                {"error_code": GROUP_ID_NOT_FOUND, "group_id": "g2"},
            ]
        },
    ),
    # --- any broker: the administration Kafka 4 serves to clients (delegation tokens: as the client itself) ---------------------------------
    one_whole(
        "AlterUserScramCredentials",
        apis.ALTER_USER_SCRAM_CREDENTIALS,
        0,
        ANY_BROKER,
        request={
            "deletions": [{"name": "bob", "mechanism": 1}],
            "upsertions": [{"name": "alice", "mechanism": 2, "iterations": 8192, "salt": b"salt", "salted_password": b"x" * 64}],
        },
        answer={"results": [{"user": "bob", "error_code": 0}, {"user": "alice", "error_code": 0}]},
    ),
    one_whole(
        "CreateDelegationToken",
        apis.CREATE_DELEGATION_TOKEN,
        3,
        ANY_BROKER,
        request={"owner_principal_type": "User", "owner_principal_name": "alice", "renewers": [], "max_lifetime": -1},
        answer={
            "error_code": 0,
            "principal_type": "User",
            "principal_name": "alice",
            "token_requester_principal_type": "User",
            "token_requester_principal_name": "kfan",
            "issue_timestamp": 1_700_000_000_000,
            "expiry_timestamp": 1_700_086_400_000,
            "max_timestamp": 1_700_604_800_000,
            "token_id": "token-1",
            "hmac": TOKEN_HMAC,
        },
        client_identity=True,
    ),
    one_whole(
        "RenewDelegationToken",
        apis.RENEW_DELEGATION_TOKEN,
        2,
        ANY_BROKER,
        request={"hmac": TOKEN_HMAC, "renew_period": 86_400_000},
        answer={"error_code": 0, "expiry_timestamp": 1_700_172_800_000},
        client_identity=True,
    ),
    one_whole(
        "ExpireDelegationToken",
        apis.EXPIRE_DELEGATION_TOKEN,
        2,
        ANY_BROKER,
        request={"hmac": TOKEN_HMAC, "expiry_time_period": -1},
        answer={"error_code": 0, "expiry_timestamp": 1_700_000_100_000},
        client_identity=True,
    ),
    one_whole(
        "DescribeDelegationToken",
        apis.DESCRIBE_DELEGATION_TOKEN,
        3,
        ANY_BROKER,
        request={"owners": [{"principal_type": "User", "principal_name": "alice"}]},
        answer={
            "error_code": 0,
            "tokens": [{"principal_type": "User", "principal_name": "alice", "token_id": "token-1", "hmac": TOKEN_HMAC}],
        },
        client_identity=True,
    ),
    one_whole(
        "DescribeQuorum",
        apis.DESCRIBE_QUORUM,
        2,
        ANY_BROKER,
        request={"topics": [{"topic_name": "__cluster_metadata", "partitions": [{"partition_index": 0}]}]},
        answer={
            "topics": [
                {
                    "topic_name": "__cluster_metadata",
                    "partitions": [{"partition_index": 0, "leader_id": 3000, "leader_epoch": 5, "high_watermark": 1234}],
                }
            ],
            "nodes": [{"node_id": 3000, "listeners": [{"name": "CONTROLLER", "host": "controller1", "port": 9093}]}],
        },
    ),
    one_whole(
        "UpdateFeatures",
        apis.UPDATE_FEATURES,
        2,
        ANY_BROKER,
        request={"timeout": 60000, "feature_updates": [{"feature": "share.version", "max_version_level": 1, "upgrade_type": 1}]},
        answer={"error_code": 0},
    ),
    one_whole(
        "AddRaftVoter",
        apis.ADD_RAFT_VOTER,
        1,
        ANY_BROKER,
        request={
            "cluster_id": "golden",
            "timeout": 30000,
            "voter_id": 3003,
            "voter_directory_id": uuid.UUID("00000000-0000-0000-0000-000000000c03"),
            "listeners": [{"name": "CONTROLLER", "host": "controller4", "port": 9093}],
        },
        answer={"error_code": 0},
    ),
    one_whole(
        "RemoveRaftVoter",
        apis.REMOVE_RAFT_VOTER,
        0,
        ANY_BROKER,
        request={"cluster_id": "golden", "voter_id": 3003, "voter_directory_id": uuid.UUID("00000000-0000-0000-0000-000000000c03")},
        answer={"error_code": 0},
    ),
    Golden(
        "ListConfigResources",
        apis.LIST_CONFIG_RESOURCES,
        1,
        request={"resource_types": []},
        subs={ANY_BROKER: "whole"},
        answers={
            ANY_BROKER: {
                "config_resources": [
                    {"resource_name": "orders", "resource_type": 2},
                    {"resource_name": "1", "resource_type": BROKER},
                    {"resource_name": "2", "resource_type": BROKER},
                    {"resource_name": "3", "resource_type": BROKER},
                    {"resource_name": "1", "resource_type": BROKER_LOGGER},
                    {"resource_name": "2", "resource_type": BROKER_LOGGER},
                    {"resource_name": "slow-clients", "resource_type": CLIENT_METRICS},
                ]
            }
        },
        # The three brokers are one to the client: kfan's node.
        merged={
            "config_resources": [
                {"resource_name": "orders", "resource_type": 2},
                {"resource_name": "42", "resource_type": BROKER},
                {"resource_name": "42", "resource_type": BROKER_LOGGER},
                {"resource_name": "slow-clients", "resource_type": CLIENT_METRICS},
            ]
        },
    ),
]
