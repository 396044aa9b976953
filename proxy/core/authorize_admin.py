"""What Kafka checks for the admin APIs, and how it answers a denial.

As :mod:`.authorize_data`, one function per API or family, after Kafka 4's
``KafkaApis``, ``ControllerApis``, ``AclApis`` and ``ConfigHelper`` (admin
requests a broker forwards are checked by the controller, for the client's
principal, and answered as the controller answers).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..kafka import apis, errors
from ..kafka.headers import RequestHeader
from ..kafka.schema import Struct, response_spec
from .acls import Operation, ResourceType
from .authorize import Strip, Verdict, array_spec, blank_response, mirrored, mirrored_reply, response_body
from .authorize_data import DELETE, DESCRIBE, GAF, GROUP, TAF, TOPIC, ZERO_ID, top_level
from .authorize_txn import errors_message
from .plan import Context, Route

CAF = errors.CLUSTER_AUTHORIZATION_FAILED
ALTER, CREATE = Operation.ALTER, Operation.CREATE
DESCRIBE_CONFIGS, ALTER_CONFIGS = Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS
# Config resource types (DescribeConfigs and the alter APIs): what each is checked on.
CONFIG_TOPIC, CONFIG_BROKER, CONFIG_BROKER_LOGGER, CONFIG_CLIENT_METRICS, CONFIG_GROUP = 2, 4, 8, 16, 32


def cluster_operation(op: Operation, answer: Callable[[Verdict, RequestHeader, Struct], None] | None = None) -> Any:
    """An API whose every request needs ``op`` on the cluster; denied: top-level CLUSTER_AUTHORIZATION_FAILED (or
    ``answer``'s shape)."""

    def check(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
        if not v.judge.cluster(op):
            if answer is not None:
                answer(v, hdr, request)
            else:
                message = {"error_message": errors_message(CAF)} if response_spec(hdr.api_key, hdr.api_version).has("error_message") else {}
                top_level(v, hdr, CAF, **message)

    return check


def _each_entry(request_array: str, response_array: str, **fields: Any) -> Callable[[Verdict, RequestHeader, Struct], None]:
    """Denied: one response entry per request entry, each CLUSTER_AUTHORIZATION_FAILED (CreateAcls, DeleteAcls)."""

    def answer(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
        spec = array_spec(response_spec(hdr.api_key, hdr.api_version), response_array)
        entries = [mirrored(spec, {}, CAF, error_message=errors_message(CAF), **fields) for _ in request[request_array]]
        v.reply = response_body(hdr, blank_response(hdr, **{response_array: entries}))

    return answer


def _every_entry(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    v.reply = mirrored_reply(hdr, request, CAF)


def _log_dirs(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    # v3+ says why; before, an empty answer is all a denied client gets.
    v.reply = response_body(hdr, blank_response(hdr, results=[], **({"error_code": CAF} if hdr.api_version >= 3 else {})))


def _elect_leaders(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "replica_election_results")
    part_spec = spec.field("partition_result").struct
    assert part_spec is not None
    results = [
        {
            **spec.blank(),
            "topic": t["topic"],
            "partition_result": [
                {**part_spec.blank(), "partition_id": p, "error_code": CAF, "error_message": errors_message(CAF)} for p in t["partitions"]
            ],
        }
        for t in request["topic_partitions"] or []
    ]
    top = {"error_code": CAF} if hdr.api_version >= 1 else {}
    v.reply = response_body(hdr, blank_response(hdr, replica_election_results=results, **top))


def _reassignments(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "responses")
    responses = [mirrored(spec, t, CAF) for t in request["topics"]]
    for t in responses:
        for p in t["partitions"]:
            p["error_message"] = errors_message(CAF)
    v.reply = response_body(hdr, blank_response(hdr, error_code=CAF, error_message=errors_message(CAF), responses=responses))


def _listed_reassignments(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "topics")
    part_spec = spec.field("partitions").struct
    assert part_spec is not None
    topics = [
        {**spec.blank(), "name": t["name"], "partitions": [{**part_spec.blank(), "partition_index": i} for i in t["partition_indexes"]]}
        for t in request["topics"] or []
    ]
    v.reply = response_body(hdr, blank_response(hdr, error_code=CAF, error_message=errors_message(CAF), topics=topics))


def _scram_described(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "results")
    results = [mirrored(spec, {}, CAF, user="") for _ in request["users"] or []]  # Kafka leaves the user out
    v.reply = response_body(hdr, blank_response(hdr, error_code=CAF, results=results))


def _scram_altered(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "results")
    users = sorted({u["name"] for u in [*request["deletions"], *request["upsertions"]]})
    v.reply = response_body(
        hdr, blank_response(hdr, results=[mirrored(spec, {}, CAF, user=u, error_message=errors_message(CAF)) for u in users])
    )


def _quotas_described(v: Verdict, hdr: RequestHeader, request: Struct) -> None:
    top_level(v, hdr, CAF, entries=None)


# --- topics ----------------------------------------------------------------------------------------------


def create_topics(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    if hdr.api_version >= 5:
        v.amend.append(lambda body: _created_configs(judge, body))
    if judge.cluster_shortcut(CREATE):
        judge.covered(CREATE, TOPIC, (t["name"] for t in request["topics"]))
        return
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "topics")
    answers = {
        i: mirrored(spec, {}, TAF, name=t["name"], error_message="Authorization failed.")
        for i, t in enumerate(request["topics"])
        if not judge.allows(CREATE, TOPIC, t["name"])
    }
    if answers:
        v.strips.append(Strip("topics", "topics", answers))


def _created_configs(judge: Any, body: Struct) -> Struct:
    """A created topic's configs, partitions and replication are shown only with DESCRIBE_CONFIGS on it."""
    for t in body["topics"]:
        if t["error_code"] == 0 and not judge.quietly(DESCRIBE_CONFIGS, TOPIC, t["name"]):
            # topic_config_error_code, a tagged field (v5+): why they are left out.
            t.update(configs=[], num_partitions=-1, replication_factor=-1, topic_config_error_code=TAF)
    return body


def delete_topics(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    by_name = hdr.api_version < 6
    if judge.cluster_shortcut(DELETE):
        names = request["topic_names"] if by_name else [t.get("name") or ctx.topology.topic_name(t["topic_id"]) for t in request["topics"]]
        judge.covered(DELETE, TOPIC, names)
        return
    entries = request["topic_names"] if by_name else request["topics"]
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "responses")
    answers = {}
    for i, t in enumerate(entries):
        name = t if by_name else t.get("name")
        tid = None if by_name else t.get("topic_id")
        if name is None and tid is not None and tid.int:
            name = ctx.topology.topic_name(tid)
            if name is None:
                continue  # UNKNOWN_TOPIC_ID from the controller, before any check
            if not judge.allows(DELETE, TOPIC, name):
                answers[i] = mirrored(spec, {}, TAF, name=name if judge.allows(DESCRIBE, TOPIC, name) else None, topic_id=tid)
            continue
        if name is None:
            continue  # INVALID_REQUEST from the controller
        if not judge.allows(DESCRIBE, TOPIC, name):
            answers[i] = mirrored(spec, {}, TAF, name=name, **({} if by_name else {"topic_id": ZERO_ID}))
        elif not judge.allows(DELETE, TOPIC, name):
            if not ctx.topology.knows_topic(name):
                v.unknown_topics.add(name)  # absent: UNKNOWN_TOPIC_OR_PARTITION from the controller
                continue
            answers[i] = mirrored(spec, {}, TAF, name=name, **({} if by_name else {"topic_id": ZERO_ID}))
    if answers:
        v.strips.append(Strip("topic_names" if by_name else "topics", "responses", answers))


def create_partitions(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    spec = array_spec(response_spec(hdr.api_key, hdr.api_version), "results")
    answers = {
        i: mirrored(spec, {}, TAF, name=t["name"]) for i, t in enumerate(request["topics"]) if not v.judge.allows(ALTER, TOPIC, t["name"])
    }
    if answers:
        v.strips.append(Strip("topics", "results", answers))


# --- configs ---------------------------------------------------------------------------------------------


def configs(op: Operation) -> Any:
    """DescribeConfigs (DESCRIBE_CONFIGS), AlterConfigs and IncrementalAlterConfigs (ALTER_CONFIGS): per resource,
    on the topic, the group, or the cluster (brokers, broker loggers, client metrics)."""
    checked_on = {
        CONFIG_TOPIC: (TOPIC, TAF),
        CONFIG_GROUP: (GROUP, GAF),
        CONFIG_BROKER: (ResourceType.CLUSTER, CAF),
        CONFIG_BROKER_LOGGER: (ResourceType.CLUSTER, CAF),
        CONFIG_CLIENT_METRICS: (ResourceType.CLUSTER, CAF),
    }

    def check(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
        response_array = "results" if hdr.api_key == apis.DESCRIBE_CONFIGS else "responses"
        spec = array_spec(response_spec(hdr.api_key, hdr.api_version), response_array)
        answers = {}
        for i, r in enumerate(request["resources"]):
            found = checked_on.get(r["resource_type"])
            if found is None or (hdr.api_key == apis.ALTER_CONFIGS and r["resource_type"] == CONFIG_BROKER_LOGGER):
                continue  # INVALID_REQUEST from the broker
            resource_type, code = found
            if not (
                v.judge.cluster(op) if resource_type is ResourceType.CLUSTER else v.judge.allows(op, resource_type, r["resource_name"])
            ):
                answers[i] = mirrored(spec, r, code, error_message=errors_message(code), configs=[])
                if "configs" not in spec.blank():
                    answers[i].pop("configs")
        if answers:
            v.strips.append(Strip("resources", response_array, answers))

    return check


def describe_cluster(v: Verdict, route: Route[Any], ctx: Context, hdr: RequestHeader, request: Struct) -> None:
    judge = v.judge
    if request.get("include_cluster_authorized_operations"):

        def operations(body: Struct) -> Struct:
            body["cluster_authorized_operations"] = judge.operations(ResourceType.CLUSTER) if judge.cluster(DESCRIBE) else 0
            return body

        v.amend.append(operations)


CHECKS: dict[int, Any] = {
    apis.CREATE_TOPICS: create_topics,
    apis.DELETE_TOPICS: delete_topics,
    apis.CREATE_PARTITIONS: create_partitions,
    apis.DESCRIBE_CONFIGS: configs(DESCRIBE_CONFIGS),
    apis.ALTER_CONFIGS: configs(ALTER_CONFIGS),
    apis.INCREMENTAL_ALTER_CONFIGS: configs(ALTER_CONFIGS),
    apis.DESCRIBE_CLUSTER: describe_cluster,
    apis.DESCRIBE_ACLS: cluster_operation(DESCRIBE),
    apis.CREATE_ACLS: cluster_operation(ALTER, _each_entry("creations", "results")),
    apis.DELETE_ACLS: cluster_operation(ALTER, _each_entry("filters", "filter_results", matching_acls=[])),
    apis.DESCRIBE_LOG_DIRS: cluster_operation(DESCRIBE, _log_dirs),
    apis.ELECT_LEADERS: cluster_operation(ALTER, _elect_leaders),
    apis.ALTER_PARTITION_REASSIGNMENTS: cluster_operation(ALTER, _reassignments),
    apis.LIST_PARTITION_REASSIGNMENTS: cluster_operation(DESCRIBE, _listed_reassignments),
    apis.DESCRIBE_CLIENT_QUOTAS: cluster_operation(DESCRIBE_CONFIGS, _quotas_described),
    apis.ALTER_CLIENT_QUOTAS: cluster_operation(ALTER_CONFIGS, _every_entry),
    apis.DESCRIBE_USER_SCRAM_CREDENTIALS: cluster_operation(DESCRIBE, _scram_described),
    apis.ALTER_USER_SCRAM_CREDENTIALS: cluster_operation(ALTER, _scram_altered),
    apis.DESCRIBE_QUORUM: cluster_operation(DESCRIBE),
    apis.UPDATE_FEATURES: cluster_operation(ALTER),
    apis.ADD_RAFT_VOTER: cluster_operation(ALTER),
    apis.REMOVE_RAFT_VOTER: cluster_operation(ALTER),
    apis.LIST_CONFIG_RESOURCES: cluster_operation(DESCRIBE_CONFIGS),
}
