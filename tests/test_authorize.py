"""kfan's authorization in the sans-IO core (``--authorizer acls``): every routed API judged on its golden case, by
ACLs that allow everything and by ACLs that allow nothing; then the places Kafka answers a denial, case by case.

That kfan and Kafka's own StandardAuthorizer answer alike, error code for error code, is the differential test's
(tests/test_authorization_differential.py, against the real cluster).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from proxy.core import Context, Forward, LocalReply, Response, plan_request
from proxy.core.acls import Access, AclBinding, Acls, Operation, PatternType, Permission, ResourceType
from proxy.core.answers import error_codes
from proxy.core.plan import ClosesConnection
from proxy.core.routes import AUTHORIZE
from proxy.kafka import apis, errors
from proxy.kafka.records import record_batch
from tests.support.golden import answer_payload, decode_reply, decode_sub, request_payload
from tests.support.golden_world import ADVERTISED, COORDINATORS, IDENTITY, ORDERS_ID, TOPOLOGY
from tests.test_routes import CASES

ALICE = "User:alice"
NOBODY = Acls()  # no binding: everything denied
AUTH_ERRORS = {
    errors.TOPIC_AUTHORIZATION_FAILED,
    errors.GROUP_AUTHORIZATION_FAILED,
    errors.CLUSTER_AUTHORIZATION_FAILED,
    errors.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
}
# APIs whose denial is silence (a listing filtered, an authorized-operations field recomputed), never an error code.
SILENT = {apis.LIST_GROUPS, apis.LIST_TRANSACTIONS, apis.DESCRIBE_CLUSTER}
# Judged only in their answers (what is listed), never on what they ask.
FILTERS_ONLY = {apis.LIST_TRANSACTIONS, apis.DESCRIBE_CLUSTER, apis.LIST_GROUPS}


def _ctx(acls: Acls | None, case: Any = None, **fields: Any) -> Context:
    return Context(
        IDENTITY,
        TOPOLOGY,
        (case.advertised if case is not None else None) or ADVERTISED,
        coordinator_of=COORDINATORS.get,
        share_sessions=(case.share_sessions if case is not None else None) or {},
        access=None if acls is None else Access(acls, ALICE, "10.0.0.1"),
        **fields,
    )


def _codes(value: Any) -> set[int]:
    return set(error_codes(value))


def _answered(case: Any, plan: Any) -> dict[str, Any]:
    """The client's answer: kfan's own, or the merge of the case's answers to the sub-requests made."""
    if isinstance(plan, LocalReply):
        return decode_reply(case.api, case.version, b"".join(plan.body))
    assert isinstance(plan, Forward)
    answers = {
        d: Response(answer_payload(case.api, case.version, a)) for d, a in case.answers.items() if isinstance(a, dict) and d in plan.subs
    }
    return decode_reply(case.api, case.version, b"".join(plan.merge(plan, answers).body))


JUDGED = [c for c in CASES if c.api in AUTHORIZE]


@pytest.mark.parametrize("case", JUDGED, ids=[c.name for c in JUDGED])
def test_a_super_user_is_planned_as_without_acls(case: Any) -> None:
    payload = request_payload(case.api, case.version, case.request)
    without = plan_request(_ctx(None, case), payload)
    with_acls = plan_request(_ctx(Acls(super_users=[ALICE]), case), payload)
    assert type(with_acls) is type(without)
    if isinstance(without, Forward):
        assert isinstance(with_acls, Forward)
        assert {d: b"".join(map(bytes, s.tail)) for d, s in with_acls.subs.items()} == {
            d: b"".join(map(bytes, s.tail)) for d, s in without.subs.items()
        }
    assert all(d.allowed for d in with_acls.decisions)
    assert with_acls.decisions or case.api in FILTERS_ONLY, "a judged API names what it was judged on"


@pytest.mark.parametrize("case", JUDGED, ids=[c.name for c in JUDGED])
def test_nothing_allowed_is_answered_with_kafkas_codes(case: Any) -> None:
    payload = request_payload(case.api, case.version, case.request)
    try:
        plan = plan_request(_ctx(NOBODY, case), payload)
    except ClosesConnection:
        assert case.api == apis.PRODUCE and case.request.get("acks") == 0
        return
    assert (plan.decisions or case.api in FILTERS_ONLY) and not any(d.allowed for d in plan.decisions)
    answer = _answered(case, plan)
    if case.api in SILENT:
        return
    assert _codes(answer) & AUTH_ERRORS, answer


def _binding(
    op: Operation,
    name: str,
    t: ResourceType = ResourceType.TOPIC,
    pattern: PatternType = PatternType.LITERAL,
    permission: Permission = Permission.ALLOW,
) -> AclBinding:
    return AclBinding(ALICE, "*", t, name, pattern, op, permission)


def test_produce_refuses_the_partitions_of_topics_not_writable_and_sends_the_rest() -> None:
    records = record_batch([b"x"])
    body = {
        "acks": -1,
        "timeout": 1000,
        "topic_data": [
            {"name": "orders", "partition_data": [{"index": 0, "records": records}, {"index": 1, "records": records}]},
            {"name": "payments", "partition_data": [{"index": 0, "records": records}]},
        ],
    }
    acls = Acls([_binding(Operation.WRITE, "ord", pattern=PatternType.PREFIXED)])
    plan = plan_request(_ctx(acls), request_payload(apis.PRODUCE, 9, body))
    assert isinstance(plan, Forward)
    sent = {d: decode_sub(apis.PRODUCE, 9, b"".join(map(bytes, s.tail)))[1] for d, s in plan.subs.items()}
    assert {t["name"] for sub in sent.values() for t in sub["topic_data"]} == {"orders"}
    reply = decode_reply(apis.PRODUCE, 9, b"".join(plan.merge(plan, {}).body))
    codes = {(t["name"], p["index"]): p["error_code"] for t in reply["responses"] for p in t["partition_responses"]}
    assert codes[("payments", 0)] == errors.TOPIC_AUTHORIZATION_FAILED
    assert codes[("orders", 0)] != errors.TOPIC_AUTHORIZATION_FAILED
    # acks=0: no answer can say it, so the connection closes, as a broker closes it.
    with pytest.raises(ClosesConnection):
        plan_request(_ctx(acls), request_payload(apis.PRODUCE, 9, {**body, "acks": 0}))


def test_a_topic_kfan_does_not_know_is_still_unauthorized_not_unknown() -> None:
    body = {"replica_id": -1, "topics": [{"name": "secret-plans", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
    plan = plan_request(_ctx(NOBODY), request_payload(apis.LIST_OFFSETS, 7, body))
    assert isinstance(plan, LocalReply)
    reply = decode_reply(apis.LIST_OFFSETS, 7, b"".join(plan.body))
    assert reply["topics"][0]["partitions"][0]["error_code"] == errors.TOPIC_AUTHORIZATION_FAILED


def test_metadata_lists_what_the_client_may_describe_and_names_the_rest_unauthorized() -> None:
    acls = Acls(
        [
            _binding(Operation.DESCRIBE, "orders"),
            _binding(Operation.DESCRIBE, "new-", pattern=PatternType.PREFIXED),
            _binding(Operation.CREATE, "new-", pattern=PatternType.PREFIXED),
            _binding(Operation.DESCRIBE, "other-", pattern=PatternType.PREFIXED),  # but no CREATE
        ]
    )
    answer = {
        "brokers": [{"node_id": 1, "host": "b1", "port": 9092}],
        "topics": [
            {"name": "orders", "topic_id": ORDERS_ID, "error_code": 0, "partitions": [{"partition_index": 0, "leader_id": 1}]},
            {"name": "payments", "topic_id": uuid.uuid4(), "partitions": [{"partition_index": 0, "leader_id": 1}]},
        ],
    }
    listing = plan_request(_ctx(acls), request_payload(apis.METADATA, 12, {"topics": None, "allow_auto_topic_creation": False}))
    assert isinstance(listing, Forward)
    (d,) = listing.subs
    got = decode_reply(apis.METADATA, 12, b"".join(listing.merge(listing, {d: Response(answer_payload(apis.METADATA, 12, answer))}).body))
    assert [t["name"] for t in got["topics"]] == ["orders"]

    named = {
        "topics": [{"name": "payments"}, {"name": "orders"}, {"name": "new-topic"}, {"name": "other-new"}],
        "allow_auto_topic_creation": True,
    }
    # payments: not described (CREATE does not imply DESCRIBE); other-new: described, absent, not creatable.
    plan = plan_request(_ctx(acls), request_payload(apis.METADATA, 12, named))
    assert isinstance(plan, Forward)
    (d,) = plan.subs
    sent = decode_sub(apis.METADATA, 12, b"".join(map(bytes, plan.subs[d].tail)))[1]
    assert [t["name"] for t in sent["topics"]] == ["orders", "new-topic"]  # may describe; may create where absent
    got = decode_reply(
        apis.METADATA,
        12,
        b"".join(plan.merge(plan, {d: Response(answer_payload(apis.METADATA, 12, {"topics": answer["topics"][:1]}))}).body),
    )
    assert {t["name"]: t["error_code"] for t in got["topics"]} == {"orders": 0, "payments": 29, "other-new": 29}


def test_idempotent_producers_need_idempotent_write_or_write_on_some_topic() -> None:
    body = {"transactional_id": None, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}
    payload = request_payload(apis.INIT_PRODUCER_ID, 4, body)
    refused = plan_request(_ctx(NOBODY), payload)
    assert isinstance(refused, LocalReply)
    assert decode_reply(apis.INIT_PRODUCER_ID, 4, b"".join(refused.body))["error_code"] == errors.CLUSTER_AUTHORIZATION_FAILED
    for acls in (
        Acls([_binding(Operation.WRITE, "orders")]),
        Acls([_binding(Operation.IDEMPOTENT_WRITE, "kafka-cluster", ResourceType.CLUSTER)]),
    ):
        assert isinstance(plan_request(_ctx(acls), payload), Forward)


def test_a_transaction_adding_a_topic_it_may_not_write_adds_nothing() -> None:
    body = {
        "v3_and_below_transactional_id": "tx1",
        "v3_and_below_producer_id": 1,
        "v3_and_below_producer_epoch": 0,
        "v3_and_below_topics": [{"name": "orders", "partitions": [0, 1]}, {"name": "payments", "partitions": [0]}],
    }
    acls = Acls([_binding(Operation.WRITE, "tx1", ResourceType.TRANSACTIONAL_ID), _binding(Operation.WRITE, "orders")])
    plan = plan_request(_ctx(acls), request_payload(apis.ADD_PARTITIONS_TO_TXN, 3, body))
    assert isinstance(plan, LocalReply)
    reply = decode_reply(apis.ADD_PARTITIONS_TO_TXN, 3, b"".join(plan.body))
    codes = {
        (t["name"], p["partition_index"]): p["partition_error_code"]
        for t in reply["results_by_topic_v3_and_below"]
        for p in t["results_by_partition"]
    }
    assert codes == {
        ("orders", 0): errors.OPERATION_NOT_ATTEMPTED,
        ("orders", 1): errors.OPERATION_NOT_ATTEMPTED,
        ("payments", 0): errors.TOPIC_AUTHORIZATION_FAILED,
    }


def test_offset_commit_answers_the_topics_it_may_not_read_and_commits_the_rest() -> None:
    body = {
        "group_id": "g1",
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 5}]},
            {"name": "payments", "partitions": [{"partition_index": 0, "committed_offset": 5}]},
        ],
    }
    acls = Acls([_binding(Operation.READ, "g1", ResourceType.GROUP), _binding(Operation.READ, "orders")])
    plan = plan_request(_ctx(acls), request_payload(apis.OFFSET_COMMIT, 8, body))
    assert isinstance(plan, Forward)
    (d,) = plan.subs
    sent = decode_sub(apis.OFFSET_COMMIT, 8, b"".join(map(bytes, plan.subs[d].tail)))[1]
    assert [t["name"] for t in sent["topics"]] == ["orders"]
    ok = {"topics": [{"name": "orders", "partitions": [{"partition_index": 0, "error_code": 0}]}]}
    got = decode_reply(apis.OFFSET_COMMIT, 8, b"".join(plan.merge(plan, {d: Response(answer_payload(apis.OFFSET_COMMIT, 8, ok))}).body))
    assert {t["name"]: t["partitions"][0]["error_code"] for t in got["topics"]} == {
        "orders": 0,
        "payments": errors.TOPIC_AUTHORIZATION_FAILED,
    }
    # Nothing left to commit: answered without asking the coordinator, as a broker does.
    only_payments = {**body, "topics": body["topics"][1:]}
    assert isinstance(plan_request(_ctx(acls), request_payload(apis.OFFSET_COMMIT, 8, only_payments)), LocalReply)


def test_configs_are_judged_per_resource_on_the_topic_or_the_cluster() -> None:
    body = {
        "resources": [
            {"resource_type": 2, "resource_name": "orders", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "1", "configuration_keys": None},
            {"resource_type": 2, "resource_name": "payments", "configuration_keys": None},
        ]
    }
    acls = Acls([_binding(Operation.ALTER_CONFIGS, "orders")])  # implies DESCRIBE_CONFIGS
    plan = plan_request(_ctx(acls), request_payload(apis.DESCRIBE_CONFIGS, 4, body))
    assert isinstance(plan, Forward)
    (d,) = plan.subs
    sent = decode_sub(apis.DESCRIBE_CONFIGS, 4, b"".join(map(bytes, plan.subs[d].tail)))[1]
    assert [r["resource_name"] for r in sent["resources"]] == ["orders"]
    answer = {"results": [{"resource_type": 2, "resource_name": "orders", "error_code": 0, "configs": []}]}
    got = decode_reply(
        apis.DESCRIBE_CONFIGS, 4, b"".join(plan.merge(plan, {d: Response(answer_payload(apis.DESCRIBE_CONFIGS, 4, answer))}).body)
    )
    assert {r["resource_name"]: r["error_code"] for r in got["results"]} == {
        "orders": 0,
        "1": errors.CLUSTER_AUTHORIZATION_FAILED,
        "payments": errors.TOPIC_AUTHORIZATION_FAILED,
    }


def test_find_coordinator_answers_the_keys_it_may_not_describe() -> None:
    body = {"key_type": 0, "coordinator_keys": ["g1", "secret"]}
    acls = Acls([_binding(Operation.DESCRIBE, "g", ResourceType.GROUP, PatternType.PREFIXED)])
    plan = plan_request(_ctx(acls), request_payload(apis.FIND_COORDINATOR, 4, body))
    got = _answered_any(
        apis.FIND_COORDINATOR, 4, plan, {"coordinators": [{"key": "g1", "node_id": 2, "host": "b2", "port": 9092, "error_code": 0}]}
    )
    assert {c["key"]: c["error_code"] for c in got["coordinators"]} == {"g1": 0, "secret": errors.GROUP_AUTHORIZATION_FAILED}


@pytest.mark.parametrize("version", [2, 3, 5])
def test_a_share_coordinator_asked_in_a_version_before_6_is_left_to_the_broker(version: int) -> None:
    """Kafka answers INVALID_REQUEST before it authorizes anything (the long fuzz campaign found kfan failing on v0-3,
    which have no coordinators array to refuse keys in)."""
    body: dict[str, Any] = {"key_type": 2, **({"key": "s"} if version < 4 else {"coordinator_keys": ["s"]})}
    plan = plan_request(_ctx(Acls()), request_payload(apis.FIND_COORDINATOR, version, body))
    assert isinstance(plan, Forward) and plan.subs


def _answered_any(api: int, version: int, plan: Any, answer: dict[str, Any]) -> dict[str, Any]:
    if isinstance(plan, LocalReply):
        return decode_reply(api, version, b"".join(plan.body))
    return decode_reply(
        api, version, b"".join(plan.merge(plan, {d: Response(answer_payload(api, version, answer)) for d in plan.subs}).body)
    )
