"""THE route table: one :class:`Route` row per API key kfan serves.

Where is API key K routed? In its one row below, which names the function
that plans it and the one that merges its answers, and states every other
fact kfan needs about it. An API absent from this table is never
advertised, and a request for it closes the connection, as a broker does.

:func:`plan_request` decodes one client request (bounds-checked) and
dispatches it through its row; the I/O layer then calls the plan's merge
once with the brokers' answers (:class:`~.plan.Forward`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..kafka import errors, schema
from ..kafka.apis import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    ADD_RAFT_VOTER,
    ALTER_CLIENT_QUOTAS,
    ALTER_CONFIGS,
    ALTER_PARTITION_REASSIGNMENTS,
    ALTER_SHARE_GROUP_OFFSETS,
    ALTER_USER_SCRAM_CREDENTIALS,
    API_VERSIONS,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_ACLS,
    CREATE_DELEGATION_TOKEN,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_ACLS,
    DELETE_GROUPS,
    DELETE_RECORDS,
    DELETE_SHARE_GROUP_OFFSETS,
    DELETE_TOPICS,
    DESCRIBE_ACLS,
    DESCRIBE_CLIENT_QUOTAS,
    DESCRIBE_CLUSTER,
    DESCRIBE_CONFIGS,
    DESCRIBE_DELEGATION_TOKEN,
    DESCRIBE_GROUPS,
    DESCRIBE_LOG_DIRS,
    DESCRIBE_PRODUCERS,
    DESCRIBE_QUORUM,
    DESCRIBE_SHARE_GROUP_OFFSETS,
    DESCRIBE_TOPIC_PARTITIONS,
    DESCRIBE_TRANSACTIONS,
    DESCRIBE_USER_SCRAM_CREDENTIALS,
    ELECT_LEADERS,
    END_TXN,
    EXPIRE_DELEGATION_TOKEN,
    FETCH,
    FIND_COORDINATOR,
    GET_TELEMETRY_SUBSCRIPTIONS,
    HEARTBEAT,
    INCREMENTAL_ALTER_CONFIGS,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_CONFIG_RESOURCES,
    LIST_GROUPS,
    LIST_OFFSETS,
    LIST_PARTITION_REASSIGNMENTS,
    LIST_TRANSACTIONS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    OFFSET_FOR_LEADER_EPOCH,
    PRODUCE,
    PUSH_TELEMETRY,
    REMOVE_RAFT_VOTER,
    RENEW_DELEGATION_TOKEN,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
    SHARE_GROUP_DESCRIBE,
    SHARE_GROUP_HEARTBEAT,
    STREAMS_GROUP_DESCRIBE,
    STREAMS_GROUP_HEARTBEAT,
    SYNC_GROUP,
    TXN_OFFSET_COMMIT,
    UPDATE_FEATURES,
)
from ..kafka.headers import parse_request_header
from ..kafka.schema import Struct, decode_body_costed, request_spec
from . import (
    any_broker,
    authorize_admin,
    authorize_data,
    authorize_txn,
    broadcast,
    coordinator,
    fetch,
    identity,
    leader,
    local,
    log_dirs,
    produce,
    share,
)
from .acls import EVERYONE, Access
from .answers import error_body
from .authorize import Judge, Verdict, planned
from .coordinator import group_id, transactional_id, transactional_id_if_any, v3_transactional_id
from .plan import (
    Batch,
    BrokerFailure,
    Context,
    FieldPath,
    Forward,
    KeyType,
    LocalReply,
    Login,
    NeedCoordinators,
    PartitionFields,
    Plan,
    Route,
    Unsupported,
)

GROUP, TXN = KeyType.GROUP, KeyType.TRANSACTION


def _fields(request: tuple[str, str, str | None], response: tuple[str, str, str | None]) -> PartitionFields:
    return PartitionFields(FieldPath(*request), FieldPath(*response))


# A ShareFetch partition whose broker failed: its client looks the leader up again, as after a failed Fetch.
_SHARE_FETCH_FAILURE = BrokerFailure(errors.NOT_LEADER_OR_FOLLOWER, errors.NOT_LEADER_OR_FOLLOWER)

# fmt: off
_ROWS: tuple[Route[Any], ...] = (
    # local: answered by kfan
    Route(API_VERSIONS, local.plan, None, read_only=True, before_login=True),
    # login: when kfan authenticates its clients (SaslHandshake v0: bare SASL tokens follow; v1: SaslAuthenticate)
    Route(SASL_HANDSHAKE, local.login, None, read_only=False, versions=(0, 1), before_login=True, login=Login.HANDSHAKE),
    Route(SASL_AUTHENTICATE, local.login, None, read_only=False, versions=(0, 2), before_login=True, login=Login.AUTHENTICATE),
    # telemetry: when kfan has telemetry subscriptions (KIP-714), answered by it (proxy.runtime.telemetry)
    Route(GET_TELEMETRY_SUBSCRIPTIONS, local.telemetry, None, read_only=True, telemetry=True),
    Route(PUSH_TELEMETRY, local.telemetry, None, read_only=False, telemetry=True),
    # leader: split by partition leader, merged in client order
    Route(PRODUCE, produce.plan, leader.merge, read_only=False, layout=_fields(("topic_data", "partition_data", "index"), ("responses", "partition_responses", "index")), failure=produce.FAILURE, records="request"),
    Route(FETCH, fetch.plan, fetch.merge, read_only=True, layout=_fields(("topics", "partitions", "partition"), ("responses", "partitions", "partition_index")), failure=fetch.FAILURE, records="response", watermarks=True, sent_ahead=True),
    Route(LIST_OFFSETS, leader.plan, leader.merge, read_only=True, layout=_fields(("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index"))),
    Route(OFFSET_FOR_LEADER_EPOCH, leader.plan, leader.merge, read_only=True, layout=_fields(("topics", "partitions", "partition"), ("topics", "partitions", "partition"))),
    Route(DELETE_RECORDS, leader.plan, leader.merge, read_only=False, layout=_fields(("topics", "partitions", "partition_index"), ("topics", "partitions", "partition_index"))),
    Route(DESCRIBE_PRODUCERS, leader.plan, leader.merge, read_only=True, layout=_fields(("topics", "partition_indexes", None), ("topics", "partitions", "partition_index"))),
    # share: split by partition leader, one share session per broker mapped onto the client's one
    Route(SHARE_FETCH, share.plan, share.merge, read_only=False, share_session=True, failure=_SHARE_FETCH_FAILURE),
    Route(SHARE_ACKNOWLEDGE, share.plan, share.merge, read_only=False, share_session=True),
    # coordinator: to the group or transaction coordinator (share and streams groups' too); batched forms split by coordinator
    Route(JOIN_GROUP, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(SYNC_GROUP, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(HEARTBEAT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(LEAVE_GROUP, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(OFFSET_COMMIT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(OFFSET_FETCH, coordinator.plan, coordinator.merge, read_only=True, coordinator_key=group_id, batch=Batch(GROUP, "groups", "group_id", "groups", "group_id")),  # v8+
    Route(OFFSET_DELETE, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(TXN_OFFSET_COMMIT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(CONSUMER_GROUP_HEARTBEAT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(SHARE_GROUP_HEARTBEAT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(STREAMS_GROUP_HEARTBEAT, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(ALTER_SHARE_GROUP_OFFSETS, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    Route(DELETE_SHARE_GROUP_OFFSETS, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=group_id),
    # Idempotent producers that are not transactional ask any broker.
    Route(INIT_PRODUCER_ID, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=transactional_id_if_any),
    Route(ADD_PARTITIONS_TO_TXN, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=v3_transactional_id, batch=Batch(TXN, "transactions", "transactional_id", "results_by_transaction", "transactional_id")),  # v4+
    Route(ADD_OFFSETS_TO_TXN, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=transactional_id),
    Route(END_TXN, coordinator.plan, coordinator.merge, read_only=False, coordinator_key=transactional_id),
    Route(DESCRIBE_GROUPS, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(GROUP, "groups", None, "groups", "group_id")),
    Route(DELETE_GROUPS, coordinator.plan, coordinator.merge, read_only=False, batch=Batch(GROUP, "groups_names", None, "results", "group_id")),
    Route(CONSUMER_GROUP_DESCRIBE, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(GROUP, "group_ids", None, "groups", "group_id")),
    Route(SHARE_GROUP_DESCRIBE, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(GROUP, "group_ids", None, "groups", "group_id")),
    Route(STREAMS_GROUP_DESCRIBE, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(GROUP, "group_ids", None, "groups", "group_id")),
    Route(DESCRIBE_SHARE_GROUP_OFFSETS, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(GROUP, "groups", "group_id", "groups", "group_id")),
    Route(DESCRIBE_TRANSACTIONS, coordinator.plan, coordinator.merge, read_only=True, batch=Batch(TXN, "transactional_ids", None, "transaction_states", "transactional_id")),
    # every broker: asked of each, answers concatenated
    Route(LIST_GROUPS, broadcast.plan, broadcast.merge, read_only=True, broadcast_array="groups"),
    Route(LIST_TRANSACTIONS, broadcast.plan, broadcast.merge, read_only=True, broadcast_array="transaction_states"),
    # kfan's node's log dirs: every broker's, told apart by name; a failed broker's shown offline.
    Route(DESCRIBE_LOG_DIRS, broadcast.plan, log_dirs.merge, read_only=True, broadcast_array="results"),
    # any: whole to a live broker, identity rewritten in the answer
    Route(METADATA, any_broker.plan, any_broker.merge, read_only=True, rewrite=identity.metadata, shares_answers=True),
    # Answered with kfan itself as the coordinator; the real one is learned on the way.
    Route(FIND_COORDINATOR, any_broker.plan, any_broker.merge, read_only=True, rewrite=identity.find_coordinator),
    Route(DESCRIBE_CLUSTER, any_broker.plan, any_broker.merge, read_only=True, rewrite=identity.describe_cluster),
    Route(DESCRIBE_TOPIC_PARTITIONS, any_broker.plan, any_broker.merge, read_only=True, rewrite=identity.describe_topic_partitions),
    Route(CREATE_TOPICS, any_broker.plan, any_broker.merge, read_only=False, changes_topology=True, prefers_controller=True),
    Route(DELETE_TOPICS, any_broker.plan, any_broker.merge, read_only=False, changes_topology=True, prefers_controller=True),
    Route(CREATE_PARTITIONS, any_broker.plan, any_broker.merge, read_only=False, changes_topology=True, prefers_controller=True),
    Route(ELECT_LEADERS, any_broker.plan, any_broker.merge, read_only=False, changes_topology=True, prefers_controller=True),
    Route(ALTER_PARTITION_REASSIGNMENTS, any_broker.plan, any_broker.merge, read_only=False, changes_topology=True, prefers_controller=True),
    Route(LIST_PARTITION_REASSIGNMENTS, any_broker.plan, any_broker.merge, read_only=True, prefers_controller=True, rewrite=identity.list_partition_reassignments),
    # A BROKER resource naming kfan goes to one real broker, standing in for it.
    Route(DESCRIBE_CONFIGS, any_broker.plan, any_broker.merge, read_only=True, broker_configs="results"),
    Route(ALTER_CONFIGS, any_broker.plan, any_broker.merge, read_only=False, broker_configs="responses"),
    Route(INCREMENTAL_ALTER_CONFIGS, any_broker.plan, any_broker.merge, read_only=False, broker_configs="responses"),
    Route(DESCRIBE_ACLS, any_broker.plan, any_broker.merge, read_only=True),
    Route(CREATE_ACLS, any_broker.plan, any_broker.merge, read_only=False),
    Route(DELETE_ACLS, any_broker.plan, any_broker.merge, read_only=False),
    Route(DESCRIBE_CLIENT_QUOTAS, any_broker.plan, any_broker.merge, read_only=True),
    Route(ALTER_CLIENT_QUOTAS, any_broker.plan, any_broker.merge, read_only=False),
    Route(DESCRIBE_USER_SCRAM_CREDENTIALS, any_broker.plan, any_broker.merge, read_only=True),
    Route(ALTER_USER_SCRAM_CREDENTIALS, any_broker.plan, any_broker.merge, read_only=False),
    # Tokens belong to the principal the broker sees: served only when that is the client's own.
    Route(CREATE_DELEGATION_TOKEN, any_broker.plan, any_broker.merge, read_only=False, own_identity=True),
    Route(RENEW_DELEGATION_TOKEN, any_broker.plan, any_broker.merge, read_only=False, own_identity=True),
    Route(EXPIRE_DELEGATION_TOKEN, any_broker.plan, any_broker.merge, read_only=False, own_identity=True),
    Route(DESCRIBE_DELEGATION_TOKEN, any_broker.plan, any_broker.merge, read_only=True, own_identity=True),
    # The metadata quorum's own: a broker forwards them to the controllers, whose ids and endpoints they keep.
    Route(DESCRIBE_QUORUM, any_broker.plan, any_broker.merge, read_only=True),
    Route(UPDATE_FEATURES, any_broker.plan, any_broker.merge, read_only=False),
    Route(ADD_RAFT_VOTER, any_broker.plan, any_broker.merge, read_only=False),
    Route(REMOVE_RAFT_VOTER, any_broker.plan, any_broker.merge, read_only=False),
    Route(LIST_CONFIG_RESOURCES, any_broker.plan, any_broker.merge, read_only=True, rewrite=identity.list_config_resources),
)
# fmt: on
ROUTES: dict[int, Route[Any]] = {r.api: r for r in _ROWS}
# What a broker checks of each API against its ACLs, and kfan with ``--authorizer acls`` (absent: nothing to check).
AUTHORIZE: dict[int, Any] = {**authorize_data.CHECKS, **authorize_txn.CHECKS, **authorize_admin.CHECKS}


def served_versions(route: Route[Any]) -> tuple[int, int] | None:
    """The versions kfan implements of a route's API: those its schemas know, within the row's ``versions``."""
    known = schema.known_versions(route.api)
    if known is None:
        return None
    lo, hi = known.start, known.stop - 1
    if route.versions is not None:
        lo, hi = max(lo, route.versions[0]), min(hi, route.versions[1])
    return (lo, hi) if lo <= hi else None


def advertised_versions(
    broker_versions: list[Mapping[int, tuple[int, int]]], *, logins: bool = False, telemetry: bool = False
) -> dict[int, tuple[int, int]]:
    """What kfan implements, intersected with what every backend broker supports.

    ``logins``: kfan authenticates its clients, so it serves the login APIs too (itself: no broker is asked);
    ``telemetry``: kfan has client telemetry subscriptions, so it serves the telemetry APIs (itself too).
    """
    out: dict[int, tuple[int, int]] = {}
    for api_key, route in ROUTES.items():
        served = served_versions(route)
        if served is None or (route.login is not None and not logins) or (route.telemetry and not telemetry):
            continue
        lo, hi = served
        if route.merge is not None:  # forwarded: every broker must serve it too
            for versions in broker_versions:
                if api_key not in versions:
                    lo, hi = 1, 0
                    break
                blo, bhi = versions[api_key]
                lo, hi = max(lo, blo), min(hi, bhi)
        if lo <= hi:
            out[api_key] = (lo, hi)
    return out


# A decoded request may take this many times its frame's bytes (or the floor):
# honest requests stay well under it (a Fetch partition is 33 bytes on the
# wire and ~400 decoded), while a frame of a million empty entries, which no
# client sends, is refused as malformed instead of costing 160 times its size.
DECODE_ALLOWANCE = 32
DECODE_FLOOR = 1 << 20


def decode_allowance(frame_bytes: int) -> int:
    return max(DECODE_FLOOR, DECODE_ALLOWANCE * frame_bytes)


# Request fields by which a client lets the broker take its time: Produce and
# admin "timeout", Fetch "max_wait", JoinGroup "rebalance_timeout" (a broker
# keeps a JoinGroup until every member rejoined, up to that long).
_WAIT_FIELDS = ("timeout", "max_wait", "rebalance_timeout")


def broker_wait_ms(request: Struct) -> int:
    """The longest time ``request`` allows a broker to take, by its own fields."""
    return max((v for k in _WAIT_FIELDS if isinstance(v := request.get(k), int) and not isinstance(v, bool)), default=0)


def plan_request(ctx: Context, payload: bytes | memoryview) -> Plan:
    """Decide what to do with one client request (a frame without its size prefix).

    Raises :class:`~proxy.kafka.wire.Malformed` for bytes that do not parse
    and :class:`~.plan.Unsupported` for APIs or versions kfan does not advertise.
    """
    payload = memoryview(payload)
    hdr = parse_request_header(payload)
    route = ROUTES.get(hdr.api_key)
    if route is not None and route.merge is None and not route.telemetry:
        # Answered from the header alone, undecoded: an ApiVersions kfan cannot decode still gets an answer.
        return route.plan(route, ctx, hdr, payload, {})
    served = ctx.api_versions.get(hdr.api_key)
    if route is None or not hdr.known or served is None or not served[0] <= hdr.api_version <= served[1]:
        raise Unsupported(f"api_key {hdr.api_key} version {hdr.api_version} is not served")
    spec = request_spec(hdr.api_key, hdr.api_version)
    # Brokers ignore bytes after a request body (librdkafka sends some with
    # Metadata v13); so do we. Whole-forwarded requests keep them.
    request, decoded_cost = decode_body_costed(spec, payload, hdr.body_offset, allow_trailing=True, max_cost=decode_allowance(len(payload)))
    verdict = None
    if route.own_identity and not ctx.client_identity:
        plan: Plan = LocalReply(hdr, True, error_body(hdr, errors.DELEGATION_TOKEN_REQUEST_NOT_ALLOWED))
    elif ctx.access is not None and (check := AUTHORIZE.get(hdr.api_key)) is not None:
        verdict = Verdict(Judge(ctx.access))
        check(verdict, route, ctx, hdr, request)
        plan = planned(verdict, route, ctx, hdr, payload, request)
    else:
        plan = route.plan(route, ctx, hdr, payload, request)
        if (
            hdr.api_key in ctx.record_resources
            and not isinstance(plan, NeedCoordinators)
            and (check := AUTHORIZE.get(hdr.api_key)) is not None
        ):
            # Only the resources it names, for the audit log: everyone is allowed everything, the plan stays.
            named = Verdict(Judge(Access(EVERYONE, "", "")))
            check(named, route, ctx, hdr, request)
            plan.decisions = named.decisions
    plan.cost = len(payload) + decoded_cost
    if verdict is not None and not isinstance(plan, NeedCoordinators):
        plan.decisions = verdict.decisions
        plan.unknown_topics |= verdict.unknown_topics
    if isinstance(plan, Forward):
        plan.broker_wait_ms = broker_wait_ms(request)
    return plan
