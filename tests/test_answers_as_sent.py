"""A leader-split answer one broker gave cleanly goes to the client as it came, read for its keys only.

A Fetch answer is decoded (kfan keeps its watermarks and reads where the next
Fetch starts) but, when nothing in it changes, not encoded again: the last
tests check that against the merge that encodes every Fetch.

:func:`proxy.kafka.skim.partition_keys` reads an answer's partition keys and
declines (None) any answer with a non-zero error code or a tagged field at
its top, topic or partition level; :func:`proxy.core.leader.merge` passes on
the broker's bytes when those keys are the request's. Both are checked
against the full decoder and the full merge: for every version of every API
split by leader, the reply, its effects and its error counts are those of the
merge that decodes everything, on valid answers and on broken ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from proxy.core import ROUTES, Forward, Plan, Response, fetch, leader, plan_request
from proxy.core.answers import error_codes
from proxy.core.leader import layouts_of
from proxy.kafka import schema, skim
from proxy.kafka.headers import response_body_offset
from proxy.kafka.wire import Malformed, Reader
from tests.fuzz import mutate as fz

CASES = [
    (k, v)
    for k, route in sorted(ROUTES.items())
    if route.merge is leader.merge
    for v in range(fz.API_VERSIONS[k][0], fz.API_VERSIONS[k][1] + 1)
    if k in fz.API_VERSIONS
]
FETCH = 1
FETCH_VERSIONS = range(fz.API_VERSIONS[FETCH][0], fz.API_VERSIONS[FETCH][1] + 1)


def _plan_fetch(payload: bytes) -> Plan:
    """Planned as by a kfan that knows no preferred read replica: every partition goes to its leader."""
    return plan_request(replace(fz.CONTEXT, read_replica=lambda key: None), payload)


SEEDS = range(12)


def _tagged(spec: schema.StructSpec, value: dict[str, Any]) -> bool:
    """Whether the decoded struct had tagged fields on the wire (the decoder keeps only those present)."""
    return schema.TAGS in value or any(f.name in value for f in spec.tagged.values())


def _expected_keys(api_key: int, version: int, decoded: dict[str, Any]) -> list[Any] | None:
    """What the skim must say, from the decoded answer."""
    at = layouts_of(ROUTES[api_key], version)[1]
    spec = schema.response_spec(api_key, version)
    if any(error_codes(decoded)) or decoded[at.topics] is None or _tagged(spec, decoded):
        return None
    for t in decoded[at.topics]:
        if _tagged(at.topic_spec, t) or t[at.partitions] is None:
            return None
        if at.partition_spec is not None and any(_tagged(at.partition_spec, p) for p in t[at.partitions]):
            return None
    return at.keys(decoded)


def _cleaned(spec: schema.StructSpec, value: dict[str, Any]) -> dict[str, Any]:
    """``value`` with every error code zero and no tagged field: an answer with nothing to act on."""
    out: dict[str, Any] = {}
    for f in spec.fields:
        v = value[f.name]
        if f.name.endswith("error_code"):
            v = 0
        elif f.struct is not None and v is not None:
            v = [_cleaned(f.struct, e) for e in v] if f.array else _cleaned(f.struct, v)
        out[f.name] = v
    return out


def _single_broker_plan(api_key: int, version: int, rng: random.Random, planner: Callable[[bytes], Plan] = fz.plan) -> Forward:
    """A request whose partitions all lead to broker 1 ("orders" 0 and 3), in a random order, a topic maybe twice."""
    body = fz.request_body(api_key, version, rng)
    at = layouts_of(ROUTES[api_key], version)[0]
    topics = []
    for _ in range(rng.choice((1, 1, 2))):
        topic = fz.Generator(rng).message(at.topic_spec)
        topic[at.topic_key] = fz.ORDERS_ID if at.topic_key == "topic_id" else "orders"
        partitions = []
        for index in rng.sample((0, 3), rng.choice((1, 2))):
            if at.partition_spec is None:
                partitions.append(index)
                continue
            entry = fz.Generator(rng).message(at.partition_spec)
            entry[at.index] = index
            if "records" in entry:
                entry["records"] = fz.record_batch(rng.randbytes(rng.randrange(64)))
            partitions.append(entry)
        topic[at.partitions] = partitions
        topics.append(topic)
    body[at.topics] = topics
    plan = planner(fz.encode_request(api_key, version, body))
    assert isinstance(plan, Forward) and list(plan.subs) == [1], plan
    return plan


def _answer(plan: Forward, rng: random.Random, clean: bool) -> bytes:
    (sub,) = plan.subs.values()
    body = fz.answer_body(sub.api_key, sub.api_version, fz.sub_request_body(sub), rng)
    if clean:
        body = _cleaned(schema.response_spec(sub.api_key, sub.api_version), body)
    return fz.encode_answer(sub.api_key, sub.api_version, body)


def _merged_in_full(plan: Forward, answer: bytes, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        m.setattr(leader, "_answered_cleanly", lambda *args: None)
        return plan.merge(plan, {1: Response(answer)})


def _same_reply(plan: Forward, answer: bytes, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The reply equals the full merge's; whether it was the broker's bytes as they came."""
    reply = plan.merge(plan, {1: Response(answer)})
    full = _merged_in_full(plan, answer, monkeypatch)
    assert b"".join(bytes(p) for p in reply.body) == b"".join(bytes(p) for p in full.body)
    assert (reply.effects, reply.errors, reply.broker_failed) == (full.effects, full.errors, full.broker_failed)
    return leader._answered_cleanly(plan, plan.state, {1: Response(answer)}) is not None


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_keys_are_the_decoded_keys_or_none(api_key: int, version: int) -> None:
    at = layouts_of(ROUTES[api_key], version)[1]
    spec = schema.response_spec(api_key, version)
    read_keys = skim.partition_keys(spec, at.topics, at.topic_key, at.partitions, at.index)
    said = []
    for seed in SEEDS:
        rng = random.Random(f"keys {api_key} {version} {seed}")
        body = fz.Generator(rng, answer=True).message(spec)
        if seed % 2:
            body = _cleaned(spec, body)
        elif spec.flexible:
            fz._add_tags(spec, body, rng)
        wire = b"".join(bytes(p) for p in schema.encode_body(spec, body))
        keys = read_keys(Reader(wire))
        assert keys == _expected_keys(api_key, version, schema.decode_body(spec, wire))
        said.append(keys is not None)
    assert any(said), "every answer declined: the test would not see a wrong key"
    assert not all(said), "no answer declined: the test would not see a missed error code"


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_reply_is_the_full_merges(api_key: int, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    as_sent = []
    for seed in SEEDS:
        rng = random.Random(f"merge {api_key} {version} {seed}")
        plan = _single_broker_plan(api_key, version, rng)
        as_sent.append(_same_reply(plan, _answer(plan, rng, clean=seed % 3 != 0), monkeypatch))
    names_brokers = any(
        f.name in leader.identity.PARTITION_BROKER_FIELDS for f in layouts_of(ROUTES[api_key], version)[1].partition_spec.fields
    )  # type: ignore[union-attr]
    assert any(as_sent) != names_brokers, "clean answers passed on as they came, unless the message names brokers"
    assert not all(as_sent)


@pytest.mark.parametrize(("api_key", "version"), CASES)
def test_broken_answers_get_the_full_merges_reply(api_key: int, version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    for seed in SEEDS:
        rng = random.Random(f"broken {api_key} {version} {seed}")
        plan = _single_broker_plan(api_key, version, rng)
        answer = fz.mutate(_answer(plan, rng, clean=True), rng)
        try:
            spec = schema.response_spec(api_key, version)
            schema.decode_body(spec, answer, response_body_offset(answer, api_key, version), allow_trailing=True)
        except Malformed as e:
            if "UTF-8" in str(e):
                continue  # text is not read on the way through: the client gets the broker's bytes, as directly
        _same_reply(plan, answer, monkeypatch)


def test_a_partition_missing_from_the_answer_is_merged() -> None:
    rng = random.Random("missing")
    api_key, version = 0, 9  # Produce
    plan = _single_broker_plan(api_key, version, rng)
    (sub,) = plan.subs.values()
    body = _cleaned(schema.response_spec(api_key, version), fz.answer_body(api_key, version, fz.sub_request_body(sub), rng))
    at = layouts_of(ROUTES[api_key], version)[1]
    body[at.topics] = body[at.topics][:-1] + [{**body[at.topics][-1], at.partitions: body[at.topics][-1][at.partitions][1:]}]
    answer = fz.encode_answer(api_key, version, body)
    assert leader._answered_cleanly(plan, plan.state, {1: Response(answer)}) is None
    reply = plan.merge(plan, {1: Response(answer)})
    merged = schema.decode_body(schema.response_spec(api_key, version), b"".join(bytes(p) for p in reply.body))
    assert layouts_of(ROUTES[api_key], version)[1].keys(merged) == layouts_of(ROUTES[api_key], version)[0].keys(plan.state.request)


def _quiet_fetch_answer(plan: Forward, rng: random.Random) -> bytes:
    """A clean answer to the sub-fetch that names no broker and keeps no session: nothing for kfan to change."""
    (sub,) = plan.subs.values()
    spec = schema.response_spec(sub.api_key, sub.api_version)
    body = _cleaned(spec, fz.answer_body(sub.api_key, sub.api_version, fz.sub_request_body(sub), rng))
    body["session_id"] = 0
    body.pop("node_endpoints", None)
    for _, p in layouts_of(ROUTES[FETCH], sub.api_version)[1].entries(body):
        p["preferred_read_replica"] = -1
        if p.get("current_leader") is not None:
            p["current_leader"] = {"leader_id": -1, "leader_epoch": -1}
    return fz.encode_answer(sub.api_key, sub.api_version, body)


def _fetch_reply(plan: Forward, answer: bytes, monkeypatch: pytest.MonkeyPatch) -> bool:
    """The reply equals the merge's that encodes every Fetch; whether it was the broker's bytes as they came."""
    reply = plan.merge(plan, {1: Response(answer)})
    with monkeypatch.context() as m:
        m.setattr(fetch, "_as_answered", lambda *args: False)
        full = plan.merge(plan, {1: Response(answer)})
    assert b"".join(bytes(p) for p in reply.body) == b"".join(bytes(p) for p in full.body)
    assert (reply.effects, reply.errors, reply.broker_failed) == (full.effects, full.errors, full.broker_failed)
    return len(reply.body) == 1 and getattr(reply.body[0], "obj", None) is answer


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_a_fetch_one_broker_answered_goes_as_it_came_when_nothing_changes(version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    as_sent, cut = [], []
    for seed in SEEDS:
        rng = random.Random(f"fetch {version} {seed}")
        plan = _single_broker_plan(FETCH, version, rng, _plan_fetch)
        keys = layouts_of(ROUTES[FETCH], version)[0].keys(plan.state.request)
        if len(set(keys)) < len(keys):
            continue  # a partition asked twice: the merge answers both from the first, the broker as it likes
        answer = _quiet_fetch_answer(plan, rng) if seed % 3 else _answer(plan, rng, clean=False)
        as_sent.append(_fetch_reply(plan, answer, monkeypatch))
        if seed % 3 and not as_sent[-1]:
            cut.append(seed)  # only the client's budget may change a quiet answer
            assert "max_bytes" in plan.state.request, (version, seed)
    assert any(as_sent), "no quiet answer passed on as it came"


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_a_fetch_answer_kfan_changes_is_encoded_again(version: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(f"changed {version}")
    plan = _single_broker_plan(FETCH, version, rng, _plan_fetch)
    answer = _quiet_fetch_answer(plan, rng)
    spec = schema.response_spec(FETCH, version)
    body = schema.decode_body(spec, answer, response_body_offset(answer, FETCH, version))
    at = layouts_of(ROUTES[FETCH], version)[1]
    last = body[at.topics][-1]
    changes = [{**body, at.topics: [*body[at.topics][:-1], {**last, at.partitions: last[at.partitions][:-1]}]}]  # one left out
    if "session_id" in body:
        changes.append({**body, "session_id": 7})  # the client gets session 0: kfan hands out none
    (_, first), *_ = at.entries(body)
    if "preferred_read_replica" in first:
        for replica in (2, -(2**31)):  # hidden from the client (and followed); any other than -1 told as -1
            named = schema.decode_body(spec, answer, response_body_offset(answer, FETCH, version))
            (_, entry), *_ = at.entries(named)
            entry["preferred_read_replica"] = replica
            changes.append(named)
    if spec.tagged and any(f.name == "node_endpoints" for f in spec.tagged.values()):
        changes.append({**body, "node_endpoints": []})  # naming no broker: dropped all the same
    for changed in changes:
        wire = fz.encode_answer(FETCH, version, changed)
        assert not _fetch_reply(plan, wire, monkeypatch)
