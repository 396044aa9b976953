"""One golden case per route: request -> sub-requests per destination -> broker answers -> merged answer.

Like h11's SIMPLE_CASES, ``CASES`` is a table written by hand: every case
names its API (Kafka's own name), the request it sends at one version, the
sub-requests kfan must make of whom (``WHOLE``: the client's bytes,
unchanged), what each broker answers, the answer the client gets (``SAME``:
the one broker's answer body, byte for byte) and what the I/O layer is told
to do about it (effects). Nothing expected is computed by the code under
test; the helpers in tests/support/golden.py only encode and decode.

The cluster behind kfan (node 42) is the same for every case: brokers 1, 2
and 3; topic "orders" with partitions 0, 1, 2 led by brokers 1, 2, 3; the
controller is broker 2; groups g1 and g2 are coordinated by brokers 2 and 3,
transactions tx1 and tx3 by brokers 3 and 1; everything else is unknown.
"""

from __future__ import annotations

import ast
import re
import uuid
from collections import Counter
from pathlib import Path

import pytest

from proxy.core import (
    ANY_BROKER,
    Context,
    Coordinator,
    Failed,
    FoldMetadata,
    ForgetCoordinators,
    Forward,
    LearnCoordinators,
    LearnReadReplicas,
    LocalReply,
    RefreshTopology,
    RememberWatermarks,
    Response,
    Unsupported,
    plan_request,
    routes,
)
from proxy.core.routes import ROUTES
from proxy.kafka import apis, errors, schema
from proxy.kafka.apis import api_name
from tests.support.golden import (
    CLIENT_ID,
    SAME,
    WHOLE,
    Golden,
    answer_body,
    answer_payload,
    decode_reply,
    decode_sub,
    filled,
    match,
    match_effects,
    request_payload,
)
from tests.support.golden_kafka4 import KAFKA4_CASES
from tests.support.golden_world import (
    ADVERTISED,
    BATCH_0,
    BATCH_2,
    BROKER,
    BROKER_LOGGER,
    CONTROLLER,
    COORDINATORS,
    ELECTION_NOT_NEEDED,
    GROUP,
    GROUP_ID_NOT_FOUND,
    IDENTITY,
    KFAN_BROKER,
    ORDERS_ID,
    PAYMENTS_ID,
    TOPIC,
    TOPOLOGY,
    TXN,
    one_whole,
)

CASES: list[Golden] = [
    # --- local --------------------------------------------------------------------------
    Golden(
        "ApiVersions",
        apis.API_VERSIONS,
        4,
        request={"client_software_name": "golden", "client_software_version": "1.0"},
        subs={},
        answers={},
        merged={
            "error_code": 0,
            "api_keys": [
                {"api_key": 0, "min_version": 3, "max_version": 13},
                {"api_key": 1, "min_version": 4, "max_version": 18},
                {"api_key": 18, "min_version": 0, "max_version": 4},
            ],
            "throttle_time": 0,
        },
        advertised={apis.PRODUCE: (3, 13), apis.FETCH: (4, 18), apis.API_VERSIONS: (0, 4)},
    ),
    # --- leader: split by partition leader, merged in the client's order ----------------
    Golden(
        "Produce",
        apis.PRODUCE,
        13,
        request={
            "acks": -1,
            "timeout": 1000,
            "topic_data": [{"topic_id": ORDERS_ID, "partition_data": [{"index": 2, "records": BATCH_2}, {"index": 0, "records": BATCH_0}]}],
        },
        subs={
            3: {"topic_data": [{"topic_id": ORDERS_ID, "partition_data": [{"index": 2, "records": BATCH_2}]}]},
            1: {"topic_data": [{"topic_id": ORDERS_ID, "partition_data": [{"index": 0, "records": BATCH_0}]}]},
        },
        answers={
            1: {
                "responses": [{"topic_id": ORDERS_ID, "partition_responses": [{"index": 0, "error_code": 0, "base_offset": 100}]}],
                "throttle_time": 5,
            },
            3: {"responses": [{"topic_id": ORDERS_ID, "partition_responses": [{"index": 2, "error_code": 0, "base_offset": 300}]}]},
        },
        merged={
            "responses": [
                {
                    "topic_id": ORDERS_ID,
                    "partition_responses": [
                        {"index": 2, "error_code": 0, "base_offset": 300},
                        {"index": 0, "error_code": 0, "base_offset": 100},
                    ],
                }
            ],
            "throttle_time": 5,
        },
    ),
    Golden(
        "Fetch",
        apis.FETCH,
        18,
        request={
            "max_wait": 500,
            "min_bytes": 1,
            "max_bytes": 1048576,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {"partition": 1, "fetch_offset": 20, "partition_max_bytes": 65536},
                        {"partition": 0, "fetch_offset": 10, "partition_max_bytes": 65536},
                    ],
                }
            ],
        },
        subs={
            2: {
                "session_id": 0,
                "session_epoch": -1,
                "forgotten_topics_data": [],
                "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition": 1, "fetch_offset": 20, "partition_max_bytes": 65536}]}],
            },
            1: {
                "session_id": 0,
                "session_epoch": -1,
                "forgotten_topics_data": [],
                "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition": 0, "fetch_offset": 10, "partition_max_bytes": 65536}]}],
            },
        },
        answers={
            1: {
                "error_code": 0,
                "responses": [
                    {
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "error_code": 0,
                                "high_watermark": 15,
                                "last_stable_offset": 15,
                                "log_start_offset": 0,
                                "records": b"records-0",
                                "current_leader": {"leader_id": 1, "leader_epoch": 4},
                            }
                        ],
                    }
                ],
            },
            2: {
                "error_code": 0,
                "responses": [
                    {
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "partition_index": 1,
                                "error_code": 0,
                                "high_watermark": 25,
                                "last_stable_offset": 25,
                                "log_start_offset": 0,
                                "preferred_read_replica": 3,
                                "records": b"",
                            }
                        ],
                    }
                ],
            },
        },
        merged={
            "error_code": 0,
            "session_id": 0,
            "responses": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {"partition_index": 1, "error_code": 0, "high_watermark": 25, "preferred_read_replica": -1, "records": b""},
                        {
                            "partition_index": 0,
                            "error_code": 0,
                            "high_watermark": 15,
                            "records": b"records-0",
                            "current_leader": {"leader_id": 42, "leader_epoch": 4},
                        },
                    ],
                }
            ],
            "node_endpoints": [KFAN_BROKER],
        },
        # Partition 1's leader named broker 3 its preferred read replica: kfan follows it from now on (KIP-392).
        effects=(LearnReadReplicas({("", "orders", 1): 3}), RememberWatermarks({(ORDERS_ID, 1): (25, 25, 0), (ORDERS_ID, 0): (15, 15, 0)})),
    ),
    Golden(
        "ListOffsets",
        apis.LIST_OFFSETS,
        11,
        request={
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {"name": "orders", "partitions": [{"partition_index": 1, "timestamp": -1}, {"partition_index": 2, "timestamp": -1}]},
                {"name": "nosuch", "partitions": [{"partition_index": 0, "timestamp": -1}]},
            ],
            "timeout": 1000,
        },
        subs={
            2: {"topics": [{"name": "orders", "partitions": [{"partition_index": 1, "timestamp": -1}]}]},
            3: {"topics": [{"name": "orders", "partitions": [{"partition_index": 2, "timestamp": -1}]}]},
        },
        answers={
            2: {"topics": [{"name": "orders", "partitions": [{"partition_index": 1, "error_code": 0, "offset": 111, "leader_epoch": 4}]}]},
            3: {"topics": [{"name": "orders", "partitions": [{"partition_index": 2, "error_code": 0, "offset": 222, "leader_epoch": 4}]}]},
        },
        merged={
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 1, "error_code": 0, "offset": 111},
                        {"partition_index": 2, "error_code": 0, "offset": 222},
                    ],
                },
                {"name": "nosuch", "partitions": [{"partition_index": 0, "error_code": errors.UNKNOWN_TOPIC_OR_PARTITION, "offset": -1}]},
            ]
        },
        effects=(RefreshTopology(),),
        unknown_topics=frozenset({"nosuch"}),
    ),
    Golden(
        "OffsetForLeaderEpoch",
        apis.OFFSET_FOR_LEADER_EPOCH,
        4,
        request={
            "replica_id": -2,
            "topics": [
                {
                    "topic": "orders",
                    "partitions": [
                        {"partition": 0, "current_leader_epoch": 5, "leader_epoch": 4},
                        {"partition": 1, "current_leader_epoch": 5, "leader_epoch": 4},
                    ],
                }
            ],
        },
        subs={
            1: {"topics": [{"topic": "orders", "partitions": [{"partition": 0, "current_leader_epoch": 5, "leader_epoch": 4}]}]},
            2: {"topics": [{"topic": "orders", "partitions": [{"partition": 1, "current_leader_epoch": 5, "leader_epoch": 4}]}]},
        },
        answers={
            1: {"topics": [{"topic": "orders", "partitions": [{"error_code": 0, "partition": 0, "leader_epoch": 4, "end_offset": 1000}]}]},
            2: {"topics": [{"topic": "orders", "partitions": [{"error_code": errors.FENCED_LEADER_EPOCH, "partition": 1}]}]},
        },
        merged={
            "topics": [
                {
                    "topic": "orders",
                    "partitions": [
                        {"error_code": 0, "partition": 0, "leader_epoch": 4, "end_offset": 1000},
                        {"error_code": errors.FENCED_LEADER_EPOCH, "partition": 1, "leader_epoch": -1, "end_offset": -1},
                    ],
                }
            ]
        },
        effects=(RefreshTopology(),),  # a leadership error: the topology is stale
    ),
    Golden(
        "DeleteRecords",
        apis.DELETE_RECORDS,
        2,
        request={
            "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "offset": 5}, {"partition_index": 2, "offset": 7}]}],
            "timeout": 1000,
        },
        subs={
            1: {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "offset": 5}]}]},
            3: {"topics": [{"name": "orders", "partitions": [{"partition_index": 2, "offset": 7}]}]},
        },
        answers={
            1: {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "low_watermark": 5, "error_code": 0}]}]},
            3: Failed(errors.NETWORK_EXCEPTION),
        },
        merged={
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 0, "low_watermark": 5, "error_code": 0},
                        {"partition_index": 2, "low_watermark": -1, "error_code": errors.NETWORK_EXCEPTION},
                    ],
                }
            ]
        },
        effects=(RefreshTopology(),),  # a broker failed
    ),
    Golden(
        "DescribeProducers",
        apis.DESCRIBE_PRODUCERS,
        0,
        request={"topics": [{"name": "orders", "partition_indexes": [2, 0]}]},
        subs={3: {"topics": [{"name": "orders", "partition_indexes": [2]}]}, 1: {"topics": [{"name": "orders", "partition_indexes": [0]}]}},
        answers={
            1: {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0, "active_producers": []}]}]},
            3: {
                "topics": [
                    {
                        "name": "orders",
                        "partitions": [
                            {
                                "partition_index": 2,
                                "error_code": 0,
                                "active_producers": [
                                    {"producer_id": 9002, "producer_epoch": 1, "last_sequence": 10, "coordinator_epoch": 0}
                                ],
                            }
                        ],
                    }
                ]
            },
        },
        merged={
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 2, "error_code": 0, "active_producers": [{"producer_id": 9002, "last_sequence": 10}]},
                        {"partition_index": 0, "error_code": 0, "active_producers": []},
                    ],
                }
            ]
        },
    ),
    # --- coordinator: one group or transaction, whole to its coordinator ----------------
    # A single key goes to a Coordinator destination (the I/O layer resolves it);
    # batched forms naming several are split by coordinating broker id.
    one_whole(
        "JoinGroup",
        apis.JOIN_GROUP,
        9,
        Coordinator(GROUP, "g1"),
        request={
            "group_id": "g1",
            "session_timeout": 10000,
            "rebalance_timeout": 30000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\x00\x01"}],
        },
        answer={
            "error_code": 0,
            "generation_id": 1,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "leader": "m-1",
            "member_id": "m-1",
            "members": [{"member_id": "m-1", "metadata": b"\x00\x01"}],
        },
    ),
    one_whole(
        "SyncGroup",
        apis.SYNC_GROUP,
        5,
        Coordinator(GROUP, "g1"),
        request={
            "group_id": "g1",
            "generation_id": 1,
            "member_id": "m-1",
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": "m-1", "assignment": b"\x00\x02"}],
        },
        answer={"error_code": 0, "protocol_type": "consumer", "protocol_name": "range", "assignment": b"\x00\x02"},
    ),
    one_whole(
        "Heartbeat",
        apis.HEARTBEAT,
        4,
        Coordinator(GROUP, "g1"),
        request={"group_id": "g1", "generation_id": 1, "member_id": "m-1"},
        answer={"error_code": errors.NOT_COORDINATOR},  # it moved: forget it, the client looks it up again
        effects=(ForgetCoordinators(frozenset({Coordinator(GROUP, "g1")})),),
    ),
    one_whole(
        "LeaveGroup",
        apis.LEAVE_GROUP,
        5,
        Coordinator(GROUP, "g2"),
        request={"group_id": "g2", "members": [{"member_id": "m-1", "reason": "shutdown"}]},
        answer={"error_code": 0, "members": [{"member_id": "m-1", "error_code": 0}]},
    ),
    one_whole(
        "OffsetCommit",
        apis.OFFSET_COMMIT,
        10,
        Coordinator(GROUP, "g1"),
        request={
            "group_id": "g1",
            "generation_id_or_member_epoch": 1,
            "member_id": "m-1",
            "topics": [
                {
                    "topic_id": ORDERS_ID,
                    "partitions": [{"partition_index": 0, "committed_offset": 42}, {"partition_index": 1, "committed_offset": 43}],
                }
            ],
        },
        answer={
            "topics": [
                {"topic_id": ORDERS_ID, "partitions": [{"partition_index": 0, "error_code": 0}, {"partition_index": 1, "error_code": 0}]}
            ]
        },
    ),
    Golden(
        "OffsetFetch",
        apis.OFFSET_FETCH,
        10,
        request={
            "groups": [
                {"group_id": "g2", "topics": [{"topic_id": ORDERS_ID, "partition_indexes": [0]}]},
                {"group_id": "g1", "topics": None},
            ],
            "require_stable": True,
        },
        subs={
            3: {"groups": [{"group_id": "g2", "topics": [{"topic_id": ORDERS_ID, "partition_indexes": [0]}]}]},
            2: {"groups": [{"group_id": "g1", "topics": None}]},
        },
        answers={
            2: {
                "throttle_time": 2,
                "groups": [
                    {
                        "group_id": "g1",
                        "topics": [
                            {"topic_id": ORDERS_ID, "partitions": [{"partition_index": 1, "committed_offset": 43, "error_code": 0}]}
                        ],
                        "error_code": 0,
                    }
                ],
            },
            3: {
                "groups": [
                    {
                        "group_id": "g2",
                        "topics": [
                            {"topic_id": ORDERS_ID, "partitions": [{"partition_index": 0, "committed_offset": 42, "error_code": 0}]}
                        ],
                        "error_code": 0,
                    }
                ]
            },
        },
        merged={
            "throttle_time": 2,
            "groups": [
                {
                    "group_id": "g2",
                    "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": 0, "committed_offset": 42}]}],
                    "error_code": 0,
                },
                {
                    "group_id": "g1",
                    "topics": [{"topic_id": ORDERS_ID, "partitions": [{"partition_index": 1, "committed_offset": 43}]}],
                    "error_code": 0,
                },
            ],
        },
    ),
    one_whole(
        "OffsetDelete",
        apis.OFFSET_DELETE,
        0,
        Coordinator(GROUP, "g1"),
        request={"group_id": "g1", "topics": [{"name": "orders", "partitions": [{"partition_index": 0}]}]},
        answer={"error_code": 0, "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0}]}]},
    ),
    one_whole(
        "TxnOffsetCommit",
        apis.TXN_OFFSET_COMMIT,
        5,
        Coordinator(GROUP, "g1"),  # the group's coordinator, not the transaction's
        request={
            "transactional_id": "tx1",
            "group_id": "g1",
            "producer_id": 5000,
            "producer_epoch": 0,
            "generation_id": 1,
            "member_id": "m-1",
            "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 42}]}],
        },
        answer={"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0}]}]},
    ),
    one_whole(
        "ConsumerGroupHeartbeat",
        apis.CONSUMER_GROUP_HEARTBEAT,
        1,
        Coordinator(GROUP, "g1"),
        request={
            "group_id": "g1",
            "member_id": "m-1",
            "member_epoch": 0,
            "rebalance_timeout": 30000,
            "subscribed_topic_names": ["orders"],
            "topic_partitions": [],
        },
        answer={
            "error_code": 0,
            "member_id": "m-1",
            "member_epoch": 1,
            "heartbeat_interval": 5000,
            "assignment": {"topic_partitions": [{"topic_id": ORDERS_ID, "partitions": [0, 1, 2]}]},
        },
    ),
    one_whole(
        "InitProducerId",
        apis.INIT_PRODUCER_ID,
        6,
        ANY_BROKER,  # idempotent, not transactional: any broker
        request={"transactional_id": None, "transaction_timeout": 60000},
        answer={"error_code": 0, "producer_id": 5000, "producer_epoch": 0},
    ),
    Golden(
        "AddPartitionsToTxn",
        apis.ADD_PARTITIONS_TO_TXN,
        5,
        request={
            "transactions": [
                {"transactional_id": "tx1", "producer_id": 5000, "producer_epoch": 0, "topics": [{"name": "orders", "partitions": [0]}]},
                {"transactional_id": "tx2", "producer_id": 5001, "producer_epoch": 0, "topics": [{"name": "orders", "partitions": [1]}]},
            ]
        },
        subs={
            3: {"transactions": [{"transactional_id": "tx1", "producer_id": 5000, "topics": [{"name": "orders", "partitions": [0]}]}]},
            # tx2's coordinator is unknown (and the only one): to be resolved by the I/O layer.
            Coordinator(TXN, "tx2"): {
                "transactions": [{"transactional_id": "tx2", "producer_id": 5001, "topics": [{"name": "orders", "partitions": [1]}]}]
            },
        },
        answers={
            3: {
                "error_code": 0,
                "results_by_transaction": [
                    {
                        "transactional_id": "tx1",
                        "topic_results": [{"name": "orders", "results_by_partition": [{"partition_index": 0, "partition_error_code": 0}]}],
                    }
                ],
            },
            Coordinator(TXN, "tx2"): {
                "error_code": 0,
                "results_by_transaction": [
                    {
                        "transactional_id": "tx2",
                        "topic_results": [{"name": "orders", "results_by_partition": [{"partition_index": 1, "partition_error_code": 0}]}],
                    }
                ],
            },
        },
        merged={
            "error_code": 0,
            "results_by_transaction": [
                {
                    "transactional_id": "tx1",
                    "topic_results": [{"name": "orders", "results_by_partition": [{"partition_index": 0, "partition_error_code": 0}]}],
                },
                {
                    "transactional_id": "tx2",
                    "topic_results": [{"name": "orders", "results_by_partition": [{"partition_index": 1, "partition_error_code": 0}]}],
                },
            ],
        },
    ),
    one_whole(
        "AddOffsetsToTxn",
        apis.ADD_OFFSETS_TO_TXN,
        4,
        Coordinator(TXN, "tx1"),
        request={"transactional_id": "tx1", "producer_id": 5000, "producer_epoch": 0, "group_id": "g1"},
        answer={"error_code": 0},
    ),
    Golden(
        "EndTxn",
        apis.END_TXN,
        5,
        request={"transactional_id": "tx1", "producer_id": 5000, "producer_epoch": 0, "committed": True},
        subs={Coordinator(TXN, "tx1"): WHOLE},
        answers={Coordinator(TXN, "tx1"): Failed(errors.NETWORK_EXCEPTION)},
        # The coordinator could not be reached: NOT_COORDINATOR makes the client look it up again.
        merged={"throttle_time": 0, "error_code": errors.NOT_COORDINATOR, "producer_id": -1, "producer_epoch": -1},
        effects=(ForgetCoordinators(frozenset({Coordinator(TXN, "tx1")})),),
    ),
    Golden(
        "DescribeGroups",
        apis.DESCRIBE_GROUPS,
        6,
        request={"groups": ["g2", "g1"], "include_authorized_operations": False},
        subs={3: {"groups": ["g2"]}, 2: {"groups": ["g1"]}},
        answers={
            2: {
                "groups": [
                    {"error_code": 0, "group_id": "g1", "group_state": "Stable", "protocol_type": "consumer", "protocol_data": "range"}
                ]
            },
            3: {"groups": [{"error_code": 0, "group_id": "g2", "group_state": "Empty", "protocol_type": "consumer", "protocol_data": ""}]},
        },
        merged={
            "groups": [
                {"error_code": 0, "group_id": "g2", "group_state": "Empty", "protocol_data": ""},
                {"error_code": 0, "group_id": "g1", "group_state": "Stable", "protocol_data": "range"},
            ]
        },
    ),
    Golden(
        "DeleteGroups",
        apis.DELETE_GROUPS,
        2,
        request={"groups_names": ["g1", "g2"]},
        subs={2: {"groups_names": ["g1"]}, 3: {"groups_names": ["g2"]}},
        answers={
            2: {"results": [{"group_id": "g1", "error_code": 0}]},
            3: {"results": [{"group_id": "g2", "error_code": GROUP_ID_NOT_FOUND}]},
        },
        merged={"results": [{"group_id": "g1", "error_code": 0}, {"group_id": "g2", "error_code": GROUP_ID_NOT_FOUND}]},
    ),
    Golden(
        "ConsumerGroupDescribe",
        apis.CONSUMER_GROUP_DESCRIBE,
        1,
        request={"group_ids": ["g1", "g2"], "include_authorized_operations": False},
        subs={2: {"group_ids": ["g1"]}, 3: {"group_ids": ["g2"]}},
        answers={
            2: {"groups": [{"error_code": errors.NOT_COORDINATOR, "group_id": "g1"}]},
            3: {
                "groups": [
                    {
                        "error_code": 0,
                        "group_id": "g2",
                        "group_state": "Stable",
                        "group_epoch": 3,
                        "assignment_epoch": 3,
                        "assignor_name": "uniform",
                    }
                ]
            },
        },
        merged={
            "groups": [
                {"error_code": errors.NOT_COORDINATOR, "group_id": "g1"},
                {"error_code": 0, "group_id": "g2", "group_state": "Stable", "group_epoch": 3, "assignor_name": "uniform"},
            ]
        },
        effects=(ForgetCoordinators(frozenset({Coordinator(GROUP, "g1")})),),  # g1 moved
    ),
    Golden(
        "DescribeTransactions",
        apis.DESCRIBE_TRANSACTIONS,
        0,
        request={"transactional_ids": ["tx3", "tx1"]},
        subs={1: {"transactional_ids": ["tx3"]}, 3: {"transactional_ids": ["tx1"]}},
        answers={
            1: {
                "transaction_states": [
                    {
                        "error_code": 0,
                        "transactional_id": "tx3",
                        "transaction_state": "Ongoing",
                        "transaction_timeout": 60000,
                        "transaction_start_time": 1700000000000,
                        "producer_id": 7003,
                        "producer_epoch": 0,
                        "topics": [{"topic": "orders", "partitions": [2]}],
                    }
                ]
            },
            3: {
                "transaction_states": [
                    {"error_code": 0, "transactional_id": "tx1", "transaction_state": "Empty", "producer_id": 5000, "producer_epoch": 0}
                ]
            },
        },
        merged={
            "transaction_states": [
                {
                    "transactional_id": "tx3",
                    "transaction_state": "Ongoing",
                    "producer_id": 7003,
                    "topics": [{"topic": "orders", "partitions": [2]}],
                },
                {"transactional_id": "tx1", "transaction_state": "Empty", "producer_id": 5000, "topics": []},
            ]
        },
    ),
    # --- every broker: asked of each, answers concatenated in broker order ---------------
    Golden(
        "ListGroups",
        apis.LIST_GROUPS,
        5,
        request={"states_filter": ["Stable"], "types_filter": []},
        subs={1: WHOLE, 2: WHOLE, 3: WHOLE},
        answers={
            3: {
                "throttle_time": 10,
                "error_code": 0,
                "groups": [
                    {"group_id": "gb", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"},
                    {"group_id": "gc", "protocol_type": "consumer", "group_state": "Stable", "group_type": "consumer"},
                ],
            },
            1: {
                "error_code": 0,
                "groups": [{"group_id": "ga", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"}],
            },
            2: {"error_code": 0, "groups": []},
        },
        merged={
            "throttle_time": 10,
            "error_code": 0,
            "groups": [
                {"group_id": "ga", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"},
                {"group_id": "gb", "protocol_type": "consumer", "group_state": "Stable", "group_type": "classic"},
                {"group_id": "gc", "protocol_type": "consumer", "group_state": "Stable", "group_type": "consumer"},
            ],
        },
    ),
    Golden(
        "ListTransactions",
        apis.LIST_TRANSACTIONS,
        2,
        request={"state_filters": ["Ongoing", "Bogus"], "producer_id_filters": [], "duration_filter": -1},
        subs={1: WHOLE, 2: WHOLE, 3: WHOLE},
        answers={
            1: {
                "error_code": 0,
                "unknown_state_filters": ["Bogus"],
                "transaction_states": [{"transactional_id": "tx3", "producer_id": 7003, "transaction_state": "Ongoing"}],
            },
            2: Failed(errors.NETWORK_EXCEPTION),
            3: {
                "error_code": 0,
                "unknown_state_filters": ["Bogus"],
                "transaction_states": [{"transactional_id": "tx1", "producer_id": 5000, "transaction_state": "Ongoing"}],
            },
        },
        # Broker 2's share is missing: a retriable error says the list is partial.
        merged={
            "error_code": errors.COORDINATOR_NOT_AVAILABLE,
            "unknown_state_filters": ["Bogus"],
            "transaction_states": [
                {"transactional_id": "tx3", "producer_id": 7003, "transaction_state": "Ongoing"},
                {"transactional_id": "tx1", "producer_id": 5000, "transaction_state": "Ongoing"},
            ],
        },
    ),
    Golden(
        "DescribeLogDirs",
        apis.DESCRIBE_LOG_DIRS,
        5,
        request={"topics": [{"topic": "orders", "partitions": [0, 1, 2]}]},
        subs={1: WHOLE, 2: WHOLE, 3: WHOLE},
        answers={
            b: {
                "error_code": 0,
                "results": [
                    {
                        "error_code": 0,
                        "log_dir": f"/data/b{b}",
                        "topics": [
                            {
                                "name": "orders",
                                "partitions": [
                                    {"partition_index": b - 1, "partition_size": 1024 * b, "offset_lag": 0, "is_future_key": False}
                                ],
                            }
                        ],
                        "total_bytes": 1000000,
                        "usable_bytes": 500000,
                    }
                ],
            }
            for b in (1, 2, 3)
        },
        merged={
            "error_code": 0,
            "results": [
                {"log_dir": "/data/b1", "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "partition_size": 1024}]}]},
                {"log_dir": "/data/b2", "topics": [{"name": "orders", "partitions": [{"partition_index": 1, "partition_size": 2048}]}]},
                {"log_dir": "/data/b3", "topics": [{"name": "orders", "partitions": [{"partition_index": 2, "partition_size": 3072}]}]},
            ],
        },
    ),
    # --- any broker: whole to one, broker identity rewritten to kfan's --------------------
    Golden(
        "Metadata",
        apis.METADATA,
        13,
        request={"topics": [{"topic_id": uuid.UUID(int=0), "name": "orders"}], "allow_auto_topic_creation": False},
        subs={ANY_BROKER: WHOLE},
        answers={
            ANY_BROKER: {
                # Broker 3 is down: it is not listed, though it still leads partition 2.
                "brokers": [{"node_id": 1, "host": "broker1", "port": 9091}, {"node_id": 2, "host": "broker2", "port": 9092}],
                "cluster_id": "golden",
                "controller_id": 2,
                "topics": [
                    {
                        "error_code": 0,
                        "name": "orders",
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "error_code": 0,
                                "partition_index": 0,
                                "leader_id": 1,
                                "leader_epoch": 4,
                                "replica_nodes": [1, 2],
                                "isr_nodes": [1, 2],
                            },
                            {
                                "error_code": 0,
                                "partition_index": 1,
                                "leader_id": 2,
                                "leader_epoch": 4,
                                "replica_nodes": [2, 3],
                                "isr_nodes": [2],
                            },
                            {
                                "error_code": 0,
                                "partition_index": 2,
                                "leader_id": 3,
                                "leader_epoch": 4,
                                "replica_nodes": [3, 1],
                                "isr_nodes": [3],
                            },
                        ],
                    }
                ],
                "error_code": 0,
            }
        },
        merged={
            "brokers": [KFAN_BROKER],
            "cluster_id": "golden",
            "controller_id": 42,
            "topics": [
                {
                    "error_code": 0,
                    "name": "orders",
                    "topic_id": ORDERS_ID,
                    "partitions": [
                        {"error_code": 0, "partition_index": 0, "leader_id": 42, "replica_nodes": [42, 42], "isr_nodes": [42, 42]},
                        {"error_code": 0, "partition_index": 1, "leader_id": 42, "replica_nodes": [42, 42], "isr_nodes": [42]},
                        {
                            "error_code": errors.LEADER_NOT_AVAILABLE,
                            "partition_index": 2,
                            "leader_id": -1,
                            "replica_nodes": [42, 42],
                            "isr_nodes": [42],
                        },
                    ],
                }
            ],
        },
        effects=(
            FoldMetadata(
                {
                    "brokers": [{"node_id": 1}, {"node_id": 2}],
                    "controller_id": 2,
                    "topics": [{"name": "orders", "partitions": [{"leader_id": 1}, {"leader_id": 2}, {"leader_id": 3}]}],
                }
            ),
        ),
    ),
    Golden(
        "FindCoordinator",
        apis.FIND_COORDINATOR,
        6,
        request={"key_type": 0, "coordinator_keys": ["g1", "g9"]},
        subs={ANY_BROKER: WHOLE},
        answers={
            ANY_BROKER: {
                "coordinators": [
                    {"key": "g1", "node_id": 2, "host": "broker2", "port": 9092, "error_code": 0, "error_message": None},
                    {
                        "key": "g9",
                        "node_id": -1,
                        "host": "",
                        "port": -1,
                        "error_code": errors.COORDINATOR_NOT_AVAILABLE,
                        "error_message": "loading",
                    },
                ]
            }
        },
        merged={
            "coordinators": [
                {"key": "g1", "node_id": 42, "host": "kfan.example", "port": 19092, "error_code": 0},
                {"key": "g9", "node_id": -1, "host": "", "port": -1, "error_code": errors.COORDINATOR_NOT_AVAILABLE},
            ]
        },
        effects=(LearnCoordinators({Coordinator(GROUP, "g1"): 2}),),
    ),
    Golden(
        "DescribeCluster",
        apis.DESCRIBE_CLUSTER,
        2,
        request={"include_cluster_authorized_operations": False, "endpoint_type": 1, "include_fenced_brokers": True},
        subs={ANY_BROKER: WHOLE},
        answers={
            ANY_BROKER: {
                "error_code": 0,
                "cluster_id": "golden",
                "controller_id": 2,
                "brokers": [
                    {"broker_id": 1, "host": "broker1", "port": 9091, "rack": "r1", "is_fenced": False},
                    {"broker_id": 2, "host": "broker2", "port": 9092, "rack": "r2", "is_fenced": True},
                ],
            }
        },
        merged={
            "error_code": 0,
            "cluster_id": "golden",
            "controller_id": 42,
            "brokers": [{"broker_id": 42, "host": "kfan.example", "port": 19092, "rack": None, "is_fenced": False}],
        },
    ),
    Golden(
        "DescribeTopicPartitions",
        apis.DESCRIBE_TOPIC_PARTITIONS,
        0,
        request={"topics": [{"name": "orders"}], "response_partition_limit": 2000},
        subs={ANY_BROKER: WHOLE},
        answers={
            ANY_BROKER: {
                "topics": [
                    {
                        "error_code": 0,
                        "name": "orders",
                        "topic_id": ORDERS_ID,
                        "partitions": [
                            {
                                "error_code": 0,
                                "partition_index": 0,
                                "leader_id": 1,
                                "leader_epoch": 4,
                                "replica_nodes": [1, 2, 3],
                                "isr_nodes": [1, 2],
                                "eligible_leader_replicas": [3],
                                "last_known_elr": None,
                                "offline_replicas": [],
                            }
                        ],
                    }
                ]
            }
        },
        merged={
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "leader_id": 42,
                            "leader_epoch": 4,
                            "replica_nodes": [42, 42, 42],
                            "isr_nodes": [42, 42],
                            "eligible_leader_replicas": [42],
                            "last_known_elr": None,
                            "offline_replicas": [],
                        }
                    ],
                }
            ]
        },
    ),
    # Topology-changing admin APIs: to the controller, answered unchanged, then the topology is refreshed.
    one_whole(
        "CreateTopics",
        apis.CREATE_TOPICS,
        7,
        CONTROLLER,
        request={"topics": [{"name": "payments", "num_partitions": 3, "replication_factor": 2}], "timeout": 30000},
        answer={
            "topics": [
                {"name": "payments", "topic_id": PAYMENTS_ID, "error_code": 0, "num_partitions": 3, "replication_factor": 2, "configs": []}
            ]
        },
        effects=(RefreshTopology(),),
    ),
    one_whole(
        "DeleteTopics",
        apis.DELETE_TOPICS,
        6,
        CONTROLLER,
        request={"topics": [{"name": "orders", "topic_id": uuid.UUID(int=0)}], "timeout": 30000},
        answer={"responses": [{"name": "orders", "topic_id": ORDERS_ID, "error_code": 0}]},
        effects=(RefreshTopology(),),
    ),
    one_whole(
        "CreatePartitions",
        apis.CREATE_PARTITIONS,
        3,
        CONTROLLER,
        request={"topics": [{"name": "orders", "count": 6, "assignments": None}], "timeout": 30000, "validate_only": False},
        answer={"results": [{"name": "orders", "error_code": 0}]},
        effects=(RefreshTopology(),),
    ),
    one_whole(
        "ElectLeaders",
        apis.ELECT_LEADERS,
        2,
        CONTROLLER,
        request={"election_type": 0, "topic_partitions": [{"topic": "orders", "partitions": [0, 1]}], "timeout": 30000},
        answer={
            "error_code": 0,
            "replica_election_results": [
                {
                    "topic": "orders",
                    "partition_result": [{"partition_id": 0, "error_code": 0}, {"partition_id": 1, "error_code": ELECTION_NOT_NEEDED}],
                }
            ],
        },
        effects=(RefreshTopology(),),
    ),
    one_whole(
        "AlterPartitionReassignments",
        apis.ALTER_PARTITION_REASSIGNMENTS,
        1,
        CONTROLLER,
        request={"timeout": 30000, "topics": [{"name": "orders", "partitions": [{"partition_index": 0, "replicas": [2, 3]}]}]},
        answer={"error_code": 0, "responses": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0}]}]},
        effects=(RefreshTopology(),),
    ),
    Golden(
        "ListPartitionReassignments",
        apis.LIST_PARTITION_REASSIGNMENTS,
        0,
        request={"timeout": 30000, "topics": [{"name": "orders", "partition_indexes": [0]}]},
        subs={CONTROLLER: WHOLE},
        answers={
            CONTROLLER: {
                "error_code": 0,
                "topics": [
                    {
                        "name": "orders",
                        "partitions": [{"partition_index": 0, "replicas": [1, 2, 3], "adding_replicas": [3], "removing_replicas": [1]}],
                    }
                ],
            }
        },
        merged={
            "error_code": 0,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [{"partition_index": 0, "replicas": [42, 42, 42], "adding_replicas": [42], "removing_replicas": [42]}],
                }
            ],
        },
    ),
    # Configs of kfan's own BROKER resource: asked of broker 1 standing in for it, and answered as kfan's.
    Golden(
        "DescribeConfigs",
        apis.DESCRIBE_CONFIGS,
        4,
        request={
            "resources": [
                {"resource_type": TOPIC, "resource_name": "orders", "configuration_keys": ["retention.ms"]},
                {"resource_type": BROKER, "resource_name": "42", "configuration_keys": ["num.io.threads"]},
            ]
        },
        subs={
            1: {
                "resources": [
                    {"resource_type": TOPIC, "resource_name": "orders", "configuration_keys": ["retention.ms"]},
                    {"resource_type": BROKER, "resource_name": "1", "configuration_keys": ["num.io.threads"]},
                ]
            }
        },
        answers={
            1: {
                "results": [
                    {
                        "error_code": 0,
                        "resource_type": TOPIC,
                        "resource_name": "orders",
                        "configs": [{"name": "retention.ms", "value": "604800000"}],
                    },
                    {"error_code": 0, "resource_type": BROKER, "resource_name": "1", "configs": [{"name": "num.io.threads", "value": "8"}]},
                ]
            }
        },
        merged={
            "results": [
                {
                    "error_code": 0,
                    "resource_type": TOPIC,
                    "resource_name": "orders",
                    "configs": [{"name": "retention.ms", "value": "604800000"}],
                },
                {"error_code": 0, "resource_type": BROKER, "resource_name": "42", "configs": [{"name": "num.io.threads", "value": "8"}]},
            ]
        },
    ),
    one_whole(
        "AlterConfigs",
        apis.ALTER_CONFIGS,
        2,
        ANY_BROKER,  # a topic's configs: any broker
        request={
            "resources": [{"resource_type": TOPIC, "resource_name": "orders", "configs": [{"name": "retention.ms", "value": "86400000"}]}]
        },
        answer={"responses": [{"error_code": 0, "error_message": None, "resource_type": TOPIC, "resource_name": "orders"}]},
    ),
    Golden(
        "IncrementalAlterConfigs",
        apis.INCREMENTAL_ALTER_CONFIGS,
        1,
        request={
            "resources": [
                {
                    "resource_type": BROKER_LOGGER,
                    "resource_name": "42",
                    "configs": [{"name": "kafka.server.KafkaApis", "config_operation": 0, "value": "DEBUG"}],
                }
            ]
        },
        subs={
            1: {
                "resources": [
                    {
                        "resource_type": BROKER_LOGGER,
                        "resource_name": "1",
                        "configs": [{"name": "kafka.server.KafkaApis", "config_operation": 0, "value": "DEBUG"}],
                    }
                ]
            }
        },
        answers={1: {"responses": [{"error_code": 0, "error_message": None, "resource_type": BROKER_LOGGER, "resource_name": "1"}]}},
        merged={"responses": [{"error_code": 0, "error_message": None, "resource_type": BROKER_LOGGER, "resource_name": "42"}]},
    ),
    one_whole(
        "DescribeAcls",
        apis.DESCRIBE_ACLS,
        3,
        ANY_BROKER,
        request={
            "resource_type_filter": TOPIC,
            "resource_name_filter": "orders",
            "pattern_type_filter": 3,
            "operation": 1,
            "permission_type": 1,
        },
        answer={
            "error_code": 0,
            "error_message": None,
            "resources": [
                {
                    "resource_type": TOPIC,
                    "resource_name": "orders",
                    "pattern_type": 3,
                    "acls": [{"principal": "User:alice", "host": "*", "operation": 3, "permission_type": 3}],
                }
            ],
        },
    ),
    one_whole(
        "CreateAcls",
        apis.CREATE_ACLS,
        3,
        ANY_BROKER,
        request={
            "creations": [
                {
                    "resource_type": TOPIC,
                    "resource_name": "orders",
                    "resource_pattern_type": 3,
                    "principal": "User:alice",
                    "host": "*",
                    "operation": 3,
                    "permission_type": 3,
                }
            ]
        },
        answer={"results": [{"error_code": 0, "error_message": None}]},
    ),
    one_whole(
        "DeleteAcls",
        apis.DELETE_ACLS,
        3,
        ANY_BROKER,
        request={
            "filters": [
                {
                    "resource_type_filter": TOPIC,
                    "resource_name_filter": "orders",
                    "pattern_type_filter": 3,
                    "principal_filter": "User:alice",
                    "operation": 3,
                    "permission_type": 3,
                }
            ]
        },
        answer={
            "filter_results": [
                {
                    "error_code": 0,
                    "error_message": None,
                    "matching_acls": [
                        {
                            "error_code": 0,
                            "error_message": None,
                            "resource_type": TOPIC,
                            "resource_name": "orders",
                            "pattern_type": 3,
                            "principal": "User:alice",
                            "host": "*",
                            "operation": 3,
                            "permission_type": 3,
                        }
                    ],
                }
            ]
        },
    ),
    one_whole(
        "DescribeClientQuotas",
        apis.DESCRIBE_CLIENT_QUOTAS,
        1,
        ANY_BROKER,
        request={"components": [{"entity_type": "user", "match_type": 0, "match": "alice"}], "strict": False},
        answer={
            "error_code": 0,
            "error_message": None,
            "entries": [
                {"entity": [{"entity_type": "user", "entity_name": "alice"}], "values": [{"key": "producer_byte_rate", "value": 1048576.0}]}
            ],
        },
    ),
    one_whole(
        "AlterClientQuotas",
        apis.ALTER_CLIENT_QUOTAS,
        1,
        ANY_BROKER,
        request={
            "entries": [
                {
                    "entity": [{"entity_type": "user", "entity_name": "alice"}],
                    "ops": [{"key": "producer_byte_rate", "value": 2097152.0, "remove": False}],
                }
            ],
            "validate_only": False,
        },
        answer={"entries": [{"error_code": 0, "error_message": None, "entity": [{"entity_type": "user", "entity_name": "alice"}]}]},
    ),
    one_whole(
        "DescribeUserScramCredentials",
        apis.DESCRIBE_USER_SCRAM_CREDENTIALS,
        0,
        ANY_BROKER,
        request={"users": [{"name": "alice"}]},
        answer={
            "error_code": 0,
            "error_message": None,
            "results": [
                {"user": "alice", "error_code": 0, "error_message": None, "credential_infos": [{"mechanism": 1, "iterations": 4096}]}
            ],
        },
    ),
]
CASES += KAFKA4_CASES  # tests/support/golden_kafka4.py


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_route(case: Golden) -> None:
    payload = request_payload(case.api, case.version, case.request)
    ctx = Context(
        IDENTITY,
        TOPOLOGY,
        case.advertised or ADVERTISED,
        coordinator_of=COORDINATORS.get,
        share_sessions=case.share_sessions or {},
        client_identity=case.client_identity,
    )
    plan = plan_request(ctx, payload)

    if not case.subs:  # answered by kfan itself
        assert isinstance(plan, LocalReply), plan
        assert not case.answers and not case.effects
        match(case.merged, decode_reply(case.api, case.version, b"".join(plan.body)))
        return

    assert isinstance(plan, Forward), plan
    assert plan.subs.keys() == case.subs.keys()
    request_spec = schema.request_spec(case.api, case.version)
    for destination, expected in case.subs.items():
        sub = plan.subs[destination]
        assert (sub.api_key, sub.api_version, sub.expect_response) == (case.api, case.version, True)
        tail = b"".join(sub.tail)
        if isinstance(expected, str):
            assert expected == WHOLE
            assert tail == payload[8:], f"{destination}: not the client's bytes"
        else:
            client_id, body = decode_sub(case.api, case.version, tail)
            assert client_id == CLIENT_ID
            # What the case does not state is the client's own.
            match({**filled(request_spec, case.request), **expected}, body, f"sub[{destination}]")
    assert plan.unknown_topics == set(case.unknown_topics)

    answers = {d: a if isinstance(a, Failed) else Response(answer_payload(case.api, case.version, a)) for d, a in case.answers.items()}
    reply = plan.merge(plan, answers)
    merged = b"".join(reply.body)
    if isinstance(case.merged, str):
        assert case.merged == SAME
        (answer,) = case.answers.values()
        assert isinstance(answer, dict)
        assert merged == answer_body(case.api, case.version, answer), "not the broker's answer, unchanged"
    else:
        match(case.merged, decode_reply(case.api, case.version, merged), "merged")
    match_effects(case.effects, reply.effects)


def test_every_route_has_one_golden_case() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), Counter(names).most_common(3)
    planned = {k for k, route in ROUTES.items() if route.login is None and not route.telemetry}
    assert set(names) == {api_name(k) for k in planned}
    assert len(CASES) == len(planned) == 65
    assert len(ROUTES) == 65 + 2 + 2  # and the two login rows and the two telemetry rows, never planned (below)
    for c in CASES:
        assert c.name == api_name(c.api), c.name


LOGINS = sorted(k for k, route in ROUTES.items() if route.login is not None)


@pytest.mark.parametrize("api", LOGINS, ids=[api_name(k) for k in LOGINS])
def test_login_routes_are_never_planned(api: int) -> None:
    """SaslHandshake and SaslAuthenticate are answered by the client connection's login exchange before any
    planning (tests/test_sasl.py); one that reaches the core is refused, even where advertised."""
    lo, hi = ADVERTISED[api]
    for version in range(lo, hi + 1):
        with pytest.raises(Unsupported):
            plan_request(Context(IDENTITY, TOPOLOGY, ADVERTISED), request_payload(api, version, {}))


def _constant(name: str) -> str:
    """Kafka's API name as kfan's constant: "OffsetForLeaderEpoch" -> "OFFSET_FOR_LEADER_EPOCH"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()


def test_each_api_is_named_in_exactly_one_route_row() -> None:
    tree = ast.parse(Path(routes.__file__).read_text())
    first_args: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Route":
            assert node.args and isinstance(node.args[0], ast.Name), ast.dump(node)[:200]
            first_args.append(node.args[0].id)
    rows = Counter(first_args)
    assert rows == Counter(_constant(api_name(k)) for k in ROUTES)  # each API once, nothing else
    assert {getattr(apis, name) for name in rows} == set(ROUTES)


@pytest.mark.parametrize(
    "api", [apis.CREATE_DELEGATION_TOKEN, apis.RENEW_DELEGATION_TOKEN, apis.EXPIRE_DELEGATION_TOKEN, apis.DESCRIBE_DELEGATION_TOKEN]
)
def test_delegation_tokens_are_refused_unless_the_brokers_see_the_client_as_itself(api: int) -> None:
    """As kfan's principal a client would be given kfan's tokens (or read their HMACs): kfan answers as a broker
    answers token requests on a connection without a SASL login."""
    case = next(c for c in CASES if c.api == api)
    plan = plan_request(Context(IDENTITY, TOPOLOGY, ADVERTISED), request_payload(api, case.version, case.request))
    assert isinstance(plan, LocalReply)
    assert decode_reply(api, case.version, b"".join(plan.body))["error_code"] == errors.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
