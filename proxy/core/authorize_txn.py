"""What Kafka checks for transactions, idempotent producers and share groups, and how it answers a denial.

As :mod:`.authorize_data` (whose helpers these use), one function per API or
family, after Kafka 4's ``KafkaApis``.
"""

from __future__ import annotations

from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, response_spec
from .acls import Operation
from .authorize import Strip, Verdict, array_spec, blank_response, mirrored, response_body
from .authorize_data import DESCRIBE, GAF, GROUP, INTERNAL_TOPICS, READ, TAF, TOPIC, TXAF, TXN, WRITE, ZERO_ID, group_error_alone, top_level
from .plan import Context, Route


def init_producer_id(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    txn = request.get("transactional_id")
    if txn is not None:
        allowed = v.judge.allows(WRITE, TXN, txn) and (
            not request.get("enable2_pc") or v.judge.allows(Operation.TWO_PHASE_COMMIT, TXN, txn)
        )
        if not allowed:
            top_level(v, hdr, TXAF, producer_id=-1, producer_epoch=-1)
    elif not (v.judge.cluster_shortcut(Operation.IDEMPOTENT_WRITE) or v.judge.allows_any(WRITE, TOPIC)):
        # An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679).
        top_level(v, hdr, errors.CLUSTER_AUTHORIZATION_FAILED, producer_id=-1, producer_epoch=-1)


def add_partitions_to_txn(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    if hdr.api_version >= 4:  # the brokers' own verification form
        if not v.judge.cluster(Operation.CLUSTER_ACTION):
            top_level(v, hdr, errors.CLUSTER_AUTHORIZATION_FAILED)
        return
    topics = request["v3_and_below_topics"]
    if not v.judge.allows(WRITE, TXN, request["v3_and_below_transactional_id"]):
        v.reply = _txn_partitions(hdr, topics, lambda _: TXAF)
        return
    # Internal topics are never a transaction's to write (Kafka refuses them to super users too).
    denied = {t["name"] for t in topics if t["name"] in INTERNAL_TOPICS or not v.judge.allows(WRITE, TOPIC, t["name"])}
    if denied:
        # Nothing is added: the denied partitions say why, unknown ones too, and the rest were not attempted.
        def code(name: str) -> int:
            if name in denied:
                return TAF
            return errors.OPERATION_NOT_ATTEMPTED if ctx.topology.knows_topic(name) else errors.UNKNOWN_TOPIC_OR_PARTITION

        v.reply = _txn_partitions(hdr, topics, code)


def _txn_partitions(hdr: RequestHeader, topics: list[Struct], code_of: Any) -> Any:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "results_by_topic_v3_and_below")
    part_spec = spec.field("results_by_partition").struct
    assert part_spec is not None
    results = []
    for t in topics:
        code = code_of(t["name"])
        partitions = [{**part_spec.blank(), "partition_index": p, "partition_error_code": code} for p in t["partitions"]]
        results.append({**spec.blank(), "name": t["name"], "results_by_partition": partitions})
    return response_body(hdr, blank_response(hdr, results_by_topic_v3_and_below=results))


def transaction(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """EndTxn, AddOffsetsToTxn: WRITE on the transactional id (then READ on the group it adds)."""
    if not v.judge.allows(WRITE, TXN, request["transactional_id"]):
        top_level(v, hdr, TXAF)
    elif hdr.api_key == apis.ADD_OFFSETS_TO_TXN and not v.judge.allows(READ, GROUP, request["group_id"]):
        top_level(v, hdr, GAF)


def describe_transactions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "transaction_states")
    answers = {
        i: mirrored(spec, t, TXAF, key="transactional_id")
        for i, t in enumerate(request["transactional_ids"])
        if not judge.allows(DESCRIBE, TXN, t)
    }
    if answers:
        v.strips.append(Strip("transactional_ids", "transaction_states", answers))

    def described(body: Struct) -> Struct:
        for state in body["transaction_states"]:  # the topics in it the client may describe, silently
            state["topics"] = [t for t in state.get("topics") or [] if judge.quietly(DESCRIBE, TOPIC, t["topic"])]
        return body

    v.amend.append(described)


def list_transactions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge

    def listed(body: Struct) -> Struct:
        body["transaction_states"] = [t for t in body["transaction_states"] if judge.quietly(DESCRIBE, TXN, t["transactional_id"])]
        return body

    v.amend.append(listed)


# --- share groups ----------------------------------------------------------------------------------------


def share_partitions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """ShareFetch, ShareAcknowledge: READ on the group, then on the topic of each partition, fetched, acknowledged
    or held in the share session (answered in place by the share session's split)."""
    if not v.judge.allows(READ, GROUP, request["group_id"]):
        top_level(v, hdr, GAF)
        return
    named = [(t["topic_id"], p["partition_index"]) for t in request["topics"] for p in t["partitions"]]
    session = ctx.share_sessions.get((request["group_id"], request["member_id"]))
    for tp in [*named, *(session.partitions if session is not None else ())]:
        name = ctx.topology.topic_name(tp[0])
        if name is not None and not v.judge.allows(READ, TOPIC, name):
            v.refused[tp] = TAF


def describe_share_group_offsets(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    spec = response_spec(hdr.api_key, hdr.api_version)
    group_spec, topic_spec = array_spec(spec, "groups"), array_spec(spec, "groups", "topics")
    part_spec = topic_spec.field("partitions").struct
    assert part_spec is not None
    denied: dict[int, Any] = {}
    for gi, g in enumerate(request["groups"]):
        if not judge.allows(DESCRIBE, GROUP, g["group_id"]):
            denied[gi] = mirrored(group_spec, {}, GAF, group_id=g["group_id"], topics=[])
        elif g["topics"] is None:

            def described(body: Struct, group: str = g["group_id"]) -> Struct:
                for held in (x for x in body["groups"] if x["group_id"] == group):
                    held["topics"] = [t for t in held["topics"] if judge.quietly(DESCRIBE, TOPIC, t["topic_name"])]
                return body

            v.amend.append(described)
        else:
            answers = {}
            for i, t in enumerate(g["topics"]):
                if not judge.allows(DESCRIBE, TOPIC, t["topic_name"]):
                    partitions = [
                        {**part_spec.blank(), "partition_index": p, "start_offset": -1, "lag": -1, "error_code": TAF}
                        for p in t["partitions"]
                    ]
                    answers[i] = {**topic_spec.blank(), "topic_name": t["topic_name"], "topic_id": ZERO_ID, "partitions": partitions}
            if answers:
                within, response_within = (("groups", gi),), (("groups", "group_id", g["group_id"]),)
                v.strips.append(Strip("topics", "topics", answers, within=within, response_within=response_within, forward_empty=True))
    if denied:
        v.strips.append(Strip("groups", "groups", denied))


def alter_share_group_offsets(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """READ on the group, then READ on each topic (its partitions answered TOPIC_AUTHORIZATION_FAILED)."""
    _share_group_topics(v, ctx, hdr, request, READ, per_partition=True)


def delete_share_group_offsets(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    """DELETE on the group, then READ on each topic (answered TOPIC_AUTHORIZATION_FAILED per topic)."""
    _share_group_topics(v, ctx, hdr, request, Operation.DELETE, per_partition=False)


def _share_group_topics(v: Verdict, ctx: Context, hdr: RequestHeader, request: Struct, group_op: Operation, per_partition: bool) -> None:
    if not v.judge.allows(group_op, GROUP, request["group_id"]):
        top_level(v, hdr, GAF, error_message=errors_message(GAF))
        return
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "responses")
    answers = {}
    ids: dict[str, Any] | None = None  # topic name -> id, made once if a topic is denied
    for i, t in enumerate(request["topics"]):
        name = t["topic_name"]
        if v.judge.allows(READ, TOPIC, name):
            continue
        if ids is None:
            ids = {n: tid for tid, n in ctx.topology.topic_ids.items()}
        topic_id = ids.get(name, ZERO_ID)
        if per_partition:
            answers[i] = mirrored(spec, t, TAF, topic_id=topic_id)
            for p in answers[i]["partitions"]:
                p["error_message"] = errors_message(TAF)
        else:
            answers[i] = mirrored(spec, t, TAF, topic_id=topic_id, error_message=errors_message(TAF))
    if answers:
        v.strips.append(Strip("topics", "responses", answers, forward_empty=True))
    if not per_partition:
        v.amend.append(group_error_alone)  # DeleteShareGroupOffsets: a group's error is all a broker answers


_MESSAGES = {
    TAF: "Topic authorization failed.",
    GAF: "Group authorization failed.",
    errors.CLUSTER_AUTHORIZATION_FAILED: "Cluster authorization failed.",
}


def errors_message(code: int) -> str:
    """Kafka's default text for an authorization error (``Errors.X.message``)."""
    return _MESSAGES[code]


CHECKS: dict[int, Any] = {
    apis.INIT_PRODUCER_ID: init_producer_id,
    apis.ADD_PARTITIONS_TO_TXN: add_partitions_to_txn,
    apis.ADD_OFFSETS_TO_TXN: transaction,
    apis.END_TXN: transaction,
    apis.DESCRIBE_TRANSACTIONS: describe_transactions,
    apis.LIST_TRANSACTIONS: list_transactions,
    apis.SHARE_FETCH: share_partitions,
    apis.SHARE_ACKNOWLEDGE: share_partitions,
    apis.DESCRIBE_SHARE_GROUP_OFFSETS: describe_share_group_offsets,
    apis.ALTER_SHARE_GROUP_OFFSETS: alter_share_group_offsets,
    apis.DELETE_SHARE_GROUP_OFFSETS: delete_share_group_offsets,
}
