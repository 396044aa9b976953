"""DescribeLogDirs on the sans-IO core: kfan's one node has every broker's log dirs, each under a name of its own.

Kafka's Admin client keys a node's log dirs by path and ignores the
top-level error whenever a log dir is listed (KafkaAdminClient.logDirDescriptions,
describeLogDirs). So, for every version: brokers configured alike, which all
report the same path, must still show every replica; a broker that failed
shows as an offline log dir (KAFKA_STORAGE_ERROR), not as a shorter list that
looks whole. kio decodes every merged answer. Against Apache Kafka, through
``kafka-log-dirs``: tests/test_kafka_tools_replicas.py.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core import Context, Failed, Forward, Response, plan_request
from proxy.core.log_dirs import UNREACHABLE
from proxy.core.topology import Topology
from proxy.kafka import errors, schema
from proxy.kafka.apis import DESCRIBE_LOG_DIRS
from proxy.kafka.headers import response_header
from tests.support import oracle
from tests.support.core_inputs import ALL_VERSIONS, BROKERS, IDENTITY

LO, HI = ALL_VERSIONS[DESCRIBE_LOG_DIRS]
VERSIONS = list(range(LO, HI + 1))
CLUSTER_AUTHORIZATION_FAILED = 31


def _plan(version: int) -> Forward:
    request = {"topics": None}
    if schema.request_spec(DESCRIBE_LOG_DIRS, version).has("tagged_fields"):
        request["tagged_fields"] = {}
    body = b"".join(bytes(p) for p in schema.encode_body(schema.request_spec(DESCRIBE_LOG_DIRS, version), request))
    plan = plan_request(Context(IDENTITY, Topology(brokers=BROKERS), ALL_VERSIONS), oracle.payload(DESCRIBE_LOG_DIRS, version, body))
    assert isinstance(plan, Forward)
    assert sorted(plan.subs) == sorted(BROKERS), "asked of every broker"
    return plan


def _log_dir(version: int, name: str, partitions: dict[str, list[int]], error: int = 0) -> dict[str, Any]:
    spec = schema.response_spec(DESCRIBE_LOG_DIRS, version).field("results").struct
    assert spec is not None
    topics = [
        {"name": t, "partitions": [{"partition_index": p, "partition_size": 100 * p, "offset_lag": 0, "is_future_key": False} for p in ps]}
        for t, ps in partitions.items()
    ]
    return {**spec.blank(), "error_code": error, "log_dir": name, "topics": topics}


def _answer(version: int, results: list[dict[str, Any]], error: int = 0) -> Response:
    spec = schema.response_spec(DESCRIBE_LOG_DIRS, version)
    body = {**spec.blank(), "results": results}
    if "error_code" in body:
        body["error_code"] = error
    return Response(response_header(DESCRIBE_LOG_DIRS, version, 9) + b"".join(bytes(p) for p in schema.encode_body(spec, body)))


def _merged(plan: Forward, answers: dict[Any, Any]) -> dict[str, Any]:
    """The client's answer, as kio reads it back."""
    version = plan.header.api_version
    body = b"".join(bytes(p) for p in plan.merge(plan, answers).body)
    return schema.decode_body(
        schema.response_spec(DESCRIBE_LOG_DIRS, version), oracle.read_back(DESCRIBE_LOG_DIRS, version, "response", body)
    )


def _as_admin_client_reads_it(merged: dict[str, Any]) -> dict[str, set[tuple[str, int]]]:
    """Kafka's Admin client: one node's log dirs keyed by path, a later entry replacing an earlier one."""
    return {r["log_dir"]: {(t["name"], p["partition_index"]) for t in r["topics"] for p in t["partitions"]} for r in merged["results"]}


@pytest.mark.parametrize("version", VERSIONS)
def test_brokers_reporting_the_same_path_keep_every_replica(version: int) -> None:
    plan = _plan(version)
    data = "/var/lib/kafka/data"
    answers = {
        1: _answer(version, [_log_dir(version, data, {"orders": [0, 1]})]),
        2: _answer(version, [_log_dir(version, data, {"orders": [1, 2]}), _log_dir(version, "/mnt/extra", {"orders": [0]})]),
        3: _answer(version, [_log_dir(version, data, {"orders": [2, 0]})]),
    }
    merged = _merged(plan, answers)
    assert [r["log_dir"] for r in merged["results"]] == [f"{data}#1", f"{data}#2", "/mnt/extra", f"{data}#3"]
    seen = _as_admin_client_reads_it(merged)
    assert sorted(r for replicas in seen.values() for r in replicas) == sorted(("orders", p) for p in (0, 1, 1, 2, 0, 2, 0)), seen
    sizes = [p["partition_size"] for r in merged["results"] for t in r["topics"] for p in t["partitions"]]
    assert sizes == [0, 100, 100, 200, 0, 200, 0], "each replica's facts are its broker's"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_failed_broker_shows_as_an_offline_log_dir(version: int) -> None:
    plan = _plan(version)
    answers = {
        1: _answer(version, [_log_dir(version, "/data/1", {"orders": [0]})]),
        2: Failed(errors.NETWORK_EXCEPTION),
        3: Response(response_header(DESCRIBE_LOG_DIRS, version, 9) + b"\xff\xff\xff"),  # does not decode
    }
    merged = _merged(plan, answers)
    assert [(r["log_dir"], r["error_code"], r["topics"]) for r in merged["results"]] == [
        (
            "/data/1",
            0,
            [{"name": "orders", "partitions": [{"partition_index": 0, "partition_size": 0, "offset_lag": 0, "is_future_key": False}]}],
        ),
        (f"{UNREACHABLE}#1", errors.KAFKA_STORAGE_ERROR, []),
        (f"{UNREACHABLE}#2", errors.KAFKA_STORAGE_ERROR, []),
    ]
    if "error_code" in merged:
        # The Admin client would not look at it (log dirs are listed); the list itself says what is missing.
        assert merged["error_code"] == 0


@pytest.mark.parametrize("version", [v for v in VERSIONS if schema.response_spec(DESCRIBE_LOG_DIRS, v).has("error_code")])
def test_a_brokers_own_top_level_error_reaches_the_client(version: int) -> None:
    plan = _plan(version)
    refused = _answer(version, [], CLUSTER_AUTHORIZATION_FAILED)
    merged = _merged(plan, {1: refused, 2: refused, 3: refused})
    assert (merged["error_code"], merged["results"]) == (CLUSTER_AUTHORIZATION_FAILED, [])


_NAMES = st.sampled_from(["/data", "/data#1", "/d2", "(unreachable broker)", "x"])


@settings(max_examples=60, suppress_health_check=list(HealthCheck), deadline=None)
@given(
    version=st.sampled_from(VERSIONS),
    dirs=st.fixed_dictionaries({b: st.lists(_NAMES, max_size=3, unique=True) for b in BROKERS}),
    failed=st.sets(st.sampled_from(sorted(BROKERS))),
)
def test_every_log_dir_once_in_broker_order_each_under_a_name_of_its_own(
    version: int, dirs: dict[int, list[str]], failed: set[int]
) -> None:
    plan = _plan(version)
    answers: dict[Any, Any] = {}
    expected: list[tuple[str, int, int]] = []  # (name as the broker reported it, error, marker partition)
    for b in sorted(BROKERS):
        if b in failed:
            answers[b] = Failed(errors.NETWORK_EXCEPTION)
            expected.append((UNREACHABLE, errors.KAFKA_STORAGE_ERROR, -1))
            continue
        results = [_log_dir(version, name, {"t": [10 * b + i]}) for i, name in enumerate(dirs[b])]
        answers[b] = _answer(version, results)
        expected.extend((name, 0, 10 * b + i) for i, name in enumerate(dirs[b]))
    merged = _merged(plan, answers)["results"]
    names = [r["log_dir"] for r in merged]
    assert len(set(names)) == len(names), f"two log dirs share a name: {names}"
    got = [(r["log_dir"], r["error_code"], r["topics"][0]["partitions"][0]["partition_index"] if r["topics"] else -1) for r in merged]
    assert len(got) == len(expected)
    reported = [n for n, _, _ in expected]
    for (name, error, marker), (was, want_error, want_marker) in zip(got, expected, strict=True):
        assert (error, marker) == (want_error, want_marker)
        if reported.count(was) == 1:
            assert name == was, "a name only one entry has is kept"
        else:
            assert re.fullmatch(re.escape(was) + r"#\d+", name), (was, name)
