"""Invariant 6, fuzzed: nothing a client or a broker sends may stop kfan.

A bounded, seeded run of each fuzz target (``tests/fuzz``; ``python -m
tests.fuzz`` runs the long campaign), the inputs the fuzzers start from
checked against kio, and pinned regressions: inputs that once broke a
contract (an exception other than the allowed ones, or quadratic work).
The harness itself is checked to fail when the code breaks a contract.
"""

from __future__ import annotations

import gc
import math
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from proxy.core import BrokerUnavailable, ClosesConnection, Failed, FetchForward, Forward, Response, Unsupported
from proxy.core.fetch import answer_watermarks
from proxy.core.topology import Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.frames import FrameReader
from proxy.kafka.headers import parse_request_header, response_body_offset
from proxy.kafka.wire import Malformed
from tests.fuzz import broker_answers, client_frames, held_state, mutate, sasl
from tests.fuzz.harness import Broken, Tally, check
from tests.support import oracle
from tests.support.core_inputs import satisfied

SEED = "pytest"


def _assert_clean(tally: Tally) -> None:
    assert tally.unexpected() == 0, "\n" + tally.report(examples=2)


# --- the fuzzers' starting points are valid ----------------------------------------------------


def test_valid_requests_cover_every_advertised_version_and_the_oracle_decodes_them() -> None:
    seen = set()
    for payload in mutate.valid_requests():
        hdr = parse_request_header(payload)
        seen.add((hdr.api_key, hdr.api_version))
        oracle.read_back(hdr.api_key, hdr.api_version, "request", payload, hdr.body_offset)
    assert seen == {(k, v) for k, (lo, hi) in mutate.API_VERSIONS.items() for v in range(lo, hi + 1)}
    assert mutate.valid_requests() == mutate.valid_requests(), "deterministic"


def test_valid_requests_plan_and_valid_answers_merge_into_responses_the_oracle_decodes() -> None:
    merged = 0
    for payload in mutate.valid_requests():
        try:
            plan = client_frames.plan_frame(payload)
        except ClosesConnection:  # an acks=0 Produce the ACLs refuse
            continue
        if not isinstance(plan, Forward):
            continue
        answers = mutate.valid_answers(plan)
        for answer in answers.values():
            offset = response_body_offset(answer.payload, plan.header.api_key, plan.header.api_version)
            oracle.read_back(plan.header.api_key, plan.header.api_version, "response", answer.payload, offset)
        try:
            reply = broker_answers.merge(plan, answers, {})
        except BrokerUnavailable:
            continue
        body = b"".join(bytes(p) for p in reply.body)
        oracle.read_back(plan.header.api_key, plan.header.api_version, "response", body)
        merged += 1
    assert merged > 300


# --- bounded campaigns -------------------------------------------------------------------------
# A call is slow (quadratic work on hostile input) by the CPU time it takes, not by the wall clock
# (the harness's check): on a loaded machine a call of a few milliseconds can wait seconds for a
# core (seen: 3.7 s of wall clock for a SASL exchange). The watchdog (HANG_SECONDS, 20 s, wall
# clock) stops a call that never ends. (The slowest input of these runs takes about 0.1 s of CPU.)


@pytest.mark.parametrize("part", range(2))
def test_client_frames_raise_only_malformed_or_unsupported(part: int) -> None:
    tally = Tally()
    client_frames.campaign(SEED, range(part, 16000, 2), tally)
    assert tally.inputs[client_frames.PLANNER] > 8000
    _assert_clean(tally)


def test_sasl_logins_raise_only_what_closes_a_connection() -> None:
    """A peer's SASL messages, mutated: kfan's server never raises, its client raises only SaslError,
    a client connection's login state only refuses (closing the connection)."""
    tally = Tally()
    sasl.campaign(SEED, range(4000), tally)
    assert min(tally.inputs[t] for t in (sasl.SERVER, sasl.CLIENT, sasl.SESSION)) > 800
    _assert_clean(tally)


def test_state_clients_grow_stays_bounded_and_loses_nothing() -> None:
    """Client-chosen cache keys (up to megabytes) and unread, pipelined, late-answered Fetches, in random
    orders: the coordinator cache stays within its bounds and counts its bytes exactly, and no sub-fetch
    kept for a client's next Fetch is dropped without being handed back or reported evicted."""
    tally = Tally()
    held_state.campaign(SEED, range(1000), tally)
    assert min(tally.inputs[t] for t in (held_state.CACHE, held_state.INFLIGHT, held_state.SHARE, held_state.QUOTAS)) == 1000
    _assert_clean(tally)


@pytest.mark.parametrize("part", range(2))
def test_broker_answers_raise_only_broker_unavailable(part: int) -> None:
    tally = Tally()
    broker_answers.campaign(SEED, range(part, 10000, 2), tally)
    assert tally.inputs[broker_answers.MERGE] > 4000
    assert tally.inputs[broker_answers.SATISFIED] > 200 and tally.inputs[broker_answers.MARKS] > 200
    assert tally.inputs[broker_answers.AS_SENT] > 20
    assert tally.inputs[broker_answers.CONTROL] > 500, "the control plane's decoders were fuzzed"
    _assert_clean(tally)


# --- pinned regressions: clients --------------------------------------------------------------

CLIENT_REGRESSIONS = {
    "unknown api key": struct.pack(">hhi", 9999, 0, 1) + b"\x00\x00",
    "unsupported version": struct.pack(">hhi", 3, 999, 1) + b"\xff\xff",
    "array count beyond the bytes": struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">i", 0x7FFFFFFF) + b"\x00\x01a",
    "compact count beyond the bytes": struct.pack(">hhih", 3, 12, 1, -1) + b"\x00" + b"\xff\xff\xff\xff\x7f",
    "truncated client id": struct.pack(">hhih", 3, 9, 1, 50) + b"abc",
    "over-long varint in the header's tag count": struct.pack(">hhih", 3, 12, 1, -1) + b"\xff" * 12 + b"\x01",
    "header tag size beyond the frame": struct.pack(">hhih", 3, 12, 1, -1) + b"\x01\x05\x7fab",
    "body tag count beyond the frame": struct.pack(">hhih", 12, 4, 7, 1) + b"x\x00\x02g\x00\x00\x00\x01\x02m\x00\x7f",
    "invalid utf-8 in a topic name": struct.pack(">hhih", 3, 1, 1, -1) + struct.pack(">ih", 1, 2) + b"\xff\xfe",
    "frame shorter than a header": b"\x00\x03\x00",
}


@pytest.mark.parametrize("name", list(CLIENT_REGRESSIONS))
def test_malformed_client_frames(name: str) -> None:
    tally = Tally()
    payload = CLIENT_REGRESSIONS[name]
    ok, _ = check(
        tally, "plan_request", 0, lambda: {"request": payload.hex()}, client_frames.ALLOWED, lambda: client_frames.plan_frame(payload)
    )
    _assert_clean(tally)
    assert not ok, "malformed input must not plan"


@pytest.mark.parametrize("size", [-1, -0x80000000, 0, 7, 0x7FFFFFFF, 100 * 1024 * 1024 + 1])
def test_frame_reader_refuses_sizes_out_of_bounds_before_buffering(size: int) -> None:
    reader = FrameReader()
    reader.feed(struct.pack(">i", size) + b"\x00" * 16)
    with pytest.raises(Malformed):
        reader.next_frame()


# Huge valid requests, at their newest version: planning and merging must stay
# linear (the planner once rescanned every entry per group: 16,000 groups in a
# DescribeGroups took ~15 s of CPU). Judged by how the CPU time grows from a
# quarter of the entries to all of them (x4 when linear, x16 when quadratic), not
# by a wall-clock limit, which a loaded machine breaks.
HUGE = [
    apis.DESCRIBE_GROUPS,
    apis.DELETE_GROUPS,
    apis.OFFSET_FETCH,
    apis.CONSUMER_GROUP_DESCRIBE,
    apis.DESCRIBE_TRANSACTIONS,
    apis.ADD_PARTITIONS_TO_TXN,
    apis.FETCH,
    apis.PRODUCE,
    apis.METADATA,
]
HUGE_GROWTH = 8  # allowed CPU time growth for 4x the entries: twice linear, half quadratic
HUGE_NOISE_S = 0.2  # CPU time a measurement may be off by (allocation, caches), whatever the size
HUGE_HANG_S = 120.0  # the watchdog (wall clock): only a call that never ends


def _plan_and_merge_cpu(api_key: int, entries: int, tally: Tally, judged: bool = False) -> dict[str, float]:
    """CPU seconds (this thread's, collector paused) to plan a valid request of ``entries`` entries
    and to merge valid answers to it; what breaks a contract goes to ``tally``."""
    version = mutate.API_VERSIONS[api_key][1]
    request = mutate.large_request(api_key, version, entries)
    cpu: dict[str, float] = {}

    def timed(step: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            gc.collect()
            gc.disable()
            start = time.thread_time()
            try:
                return fn()
            finally:
                cpu[step] = time.thread_time() - start
                gc.enable()

        return run

    def reproducer() -> dict[str, str]:
        return {"request": request.hex()[:200]}

    never_slow = {"hang_seconds": HUGE_HANG_S, "slow_seconds": math.inf}
    ok, plan = check(
        tally,
        "plan_large",
        0,
        reproducer,
        client_frames.ALLOWED,
        timed("plan", lambda: client_frames.plan_frame(request, judged)),
        **never_slow,
    )
    if ok and isinstance(plan, Forward) and plan.subs:
        answers = mutate.valid_answers(plan, random.Random(1), lean=True)
        merge = timed("merge", lambda: broker_answers.merge(plan, answers, {}))
        check(tally, "merge_large", 0, reproducer, broker_answers.MERGE_ALLOWED, merge, **never_slow)
    assert ok, "a valid request must plan"
    return cpu


@pytest.mark.parametrize("api_key", HUGE, ids=[apis.api_name(k) for k in HUGE])
def test_huge_requests_plan_and_merge_in_linear_time(api_key: int) -> None:
    tally = Tally()
    judged = api_key % 2 == 1  # half the APIs judged by ACLs too (--authorizer acls), both sizes alike
    quarter = _plan_and_merge_cpu(api_key, mutate.LARGE // 4, tally, judged)
    whole = _plan_and_merge_cpu(api_key, mutate.LARGE, tally, judged)
    _assert_clean(tally)
    # Judged by ACLs, a small request may be answered by kfan alone (nothing allowed): only what both did is compared.
    assert "plan" in whole and "plan" in quarter and (whole.keys() == quarter.keys() or judged)
    for step, seconds in ((k, v) for k, v in whole.items() if k in quarter):
        print(
            f"{apis.api_name(api_key)} {step}: {quarter[step]:.3f} s of CPU for {mutate.LARGE // 4:,} entries, {seconds:.3f} s for {mutate.LARGE:,}"
        )
        assert seconds <= HUGE_GROWTH * quarter[step] + HUGE_NOISE_S, (
            f"{step} is not linear: {quarter[step]:.3f} s of CPU for {mutate.LARGE // 4:,} entries, {seconds:.3f} s for {mutate.LARGE:,}"
        )


# --- pinned regressions: brokers --------------------------------------------------------------

FETCH_V6 = (
    "00010006000003ea0000ffffffff0000000a001000007fffffff000000000100066f7264657273000000030010000000000000000000000000000000000000000000"
    "0200000005000001000000000000000100000000000000000000000003ffffffffffffffff000000000000000000000005"
)
# name -> (request, what every broker answers: hex payload or a failure,
#          whether the merged response must decode: not when a coordinator's answer passes through as it came)
BROKER_REGRESSIONS: dict[str, tuple[str, str | Failed, bool]] = {
    # _error_codes called .endswith on the int key of an unknown tagged field.
    "Heartbeat v4: unknown tag in the coordinator's answer": (
        "000c00040000000700017800026700000001026d0000",
        "000000000000000000000001630101",
        True,
    ),
    "DeleteGroups v2: unknown tags in batch answer entries": (
        "002a0002000003e9000466757a7a00030367320a636f6e73756d65727300",
        "00000009010702365f0000000a020a636f6e73756d65727300000100024af500",
        True,
    ),
    "OffsetCommit v9: answer with an unknown tag": (
        "00080009000003e9000466757a7a0007c3a9c3a9c3a97fffffff02610367320100",
        "00000009001080000001010903b832f8",
        False,
    ),
    # Undecodable answers raised Malformed out of the merges.
    "Metadata v2: empty answer": ("00030002000003e8ffffffffffff", "", True),
    "FindCoordinator v0: empty answer": ("000a0000000003e8ffff0000", "", True),
    "DescribeCluster v0: empty answer": ("003c0000000003e8ffff000100", "", True),
    "ListPartitionReassignments v0: empty answer": ("002e0000000003e8ffff000000000a02076f726465727302000000010000", "", True),
    "DescribeTopicPartitions v0: empty answer": (
        "004b0000000003e8ffff0002076576656e7473000000000001086d697373696e67000000030000",
        "",
        True,
    ),
    "DescribeGroups v5: empty answer": ("000f0005000003ea000000010100", "", True),
    "DescribeProducers v0: empty answer": ("003d0000000003e8ffff0002076f726465727302000000000000", "", True),
    "ListGroups v0: header-only answers": ("00100000000003e8ffff", "00000009", True),
    "ConsumerGroupDescribe v0: empty answers": ("00450000000003e8ffff00030367310367330100", "", True),
    "ConsumerGroupDescribe v0 to one coordinator: empty answer": ("00450000000003ea00000002010100", "", True),
    "Fetch v6: empty answer": (FETCH_V6, "", True),
    "Fetch v6: random bytes": (FETCH_V6, "068fe8e0c35ba90a86bcab29c6f888eb2a443aca3eaf149b56f9725b4127a7e790e0", True),
    "Fetch v6: truncated count": (FETCH_V6, "000000090000000a00000002000000", True),
    "Fetch v6: failed broker": (FETCH_V6, Failed(errors.NOT_LEADER_OR_FOLLOWER), True),
}


@pytest.mark.parametrize("name", list(BROKER_REGRESSIONS))
def test_broker_answers_regressions(name: str) -> None:
    request_hex, answer, must_decode = BROKER_REGRESSIONS[name]
    plan = mutate.plan(bytes.fromhex(request_hex))
    assert isinstance(plan, Forward) and plan.subs, "the request still fans out to brokers"
    answers: dict[Any, Any] = {t: answer if isinstance(answer, Failed) else Response(bytes.fromhex(answer)) for t in plan.subs}
    tally = Tally()
    ok, reply = check(
        tally, "merge", 0, lambda: {"request": request_hex}, broker_answers.MERGE_ALLOWED, lambda: broker_answers.merge(plan, answers, {})
    )
    if plan.header.api_key == apis.FETCH:
        assert isinstance(plan, FetchForward)
        check(tally, "fetch_satisfied", 0, dict, (), lambda: satisfied(plan.header, answers, 1))
        for a in answers.values():
            check(tally, "answer_watermarks", 0, dict, (), lambda a=a: answer_watermarks(plan, a))  # type: ignore[misc]
    _assert_clean(tally)
    if ok and must_decode:
        # The client gets a response it can read (a failed part as an error code).
        schema.decode_body(schema.response_spec(plan.header.api_key, plan.header.api_version), b"".join(bytes(p) for p in reply.body))


def test_a_fetch_answer_without_a_topic_asked_with_no_partitions_is_merged_not_passed_on() -> None:
    """Found by the campaign (seed 44): a Fetch v17 naming a second topic with no partitions, answered by its one
    broker without that topic, as Kafka answers. The partitions matched, so the answer went on as it came, while
    the merge gives the empty topic an entry: the client's answer must be the merge's whichever path it takes."""
    request = (
        "00010011000003e8ffff0000000000800000007fffffff030000000000100000035a1f3c2e0000400080000000000000010200000002"
        "000000000000000000000001000000057fffffffffffffff0000000100005a1f3c2e00004000800000000000000201000107c3a9c3a9c3a900"
    )
    answer = (
        "000000090000000000004a00000000025a1f3c2e00004000800000000000000102000000020006ffffffffffffffff7fffffffffffffff"
        "000001000000000000ffffffffc9013c2b0aeb12cafbd9570133b2cb4b335f3d79bb2226375c719263778aa7846e81b813d9a75cd56448"
        "ad4dd82d14d8c49ff33415ac8519d929206cd321c132e6a276d4ae52442ff6dff7a3c75e430fbc5e64c1e34dd6be37477bfc550007f25f"
        "4999629230b8cfe2dc2db8306b888c71e278cf72404ae99f682b057cd96b6f00d657206ce7dbdf2dd14f6d58dfe6c55c1b70a8b1907168"
        "14ccf300d5c23c71bd176b3859da447191f042f79ba07c0d302b1345a5a50f3fa1787b21e9d482bef5b2cd13dcdb881609a701000d8000"
        "00007fffffffffffffff000000"
    )
    plan = mutate.plan(bytes.fromhex(request))
    assert isinstance(plan, FetchForward) and len(plan.subs) == 1
    answers: dict[Any, Any] = {t: Response(bytes.fromhex(answer)) for t in plan.subs}
    reply = broker_answers.merge(plan, answers, {})
    broker_answers.fetch_as_sent(plan, answers, {}, reply)  # raises Broken when the two differ
    spec = schema.response_spec(apis.FETCH, 17)
    topics = schema.decode_body(spec, b"".join(bytes(p) for p in reply.body))["responses"]
    assert [len(t["partitions"]) for t in topics] == [1, 0]


def test_fetch_with_an_undecodable_answer_reports_that_brokers_partitions_retriable() -> None:
    plan = mutate.plan(bytes.fromhex(FETCH_V6))
    assert isinstance(plan, FetchForward)
    answers = {t: Response(b"") for t in plan.subs}
    assert satisfied(plan.header, answers, 1), "an undecodable answer is an error to report at once"
    assert answer_watermarks(plan, Response(b"")) == {}
    reply = broker_answers.merge(plan, answers, {})
    body = schema.decode_body(schema.response_spec(1, 6), b"".join(bytes(p) for p in reply.body))
    codes = {p["error_code"] for t in body["responses"] for p in t["partitions"]}
    assert codes and 0 not in codes


# --- the control plane's decoders -------------------------------------------------------------


CONTROL_REGRESSIONS = [
    ("read_api_versions", 3, b""),
    ("read_api_versions", 3, bytes.fromhex("0000000900000003ffffffff")),
    ("read_metadata", 12, bytes.fromhex("00000009")),
    ("read_metadata", 1, bytes.fromhex("00000009") + b"\x7f\xff\xff\xff"),
    ("read_coordinator", 4, bytes.fromhex("000000090000000000000200")),  # names no coordinator for the key
    ("read_coordinator", 0, bytes.fromhex("0000000900")),
]


@pytest.mark.parametrize(
    ("name", "version", "payload"), CONTROL_REGRESSIONS, ids=[f"{n} v{v} {p.hex() or 'empty'}" for n, v, p in CONTROL_REGRESSIONS]
)
def test_control_plane_decoders_raise_only_malformed(name: str, version: int, payload: bytes) -> None:
    fn = broker_answers.decoder(name)
    args = (0, "g1") if name == "read_coordinator" else ()
    with pytest.raises(Malformed):
        fn(payload, version, *args)


def test_metadata_the_control_plane_reads_folds_into_a_topology() -> None:
    for i in range(200):
        rng = random.Random(f"fold {i}")
        version, payload, _, _ = broker_answers.control_input("read_metadata", rng)
        try:
            metadata = broker_answers.decoder("read_metadata")(payload, version)
        except Malformed:
            continue
        Topology().with_metadata(metadata)
        mutate.TOPOLOGY.with_metadata(metadata)


# --- the harness can fail ---------------------------------------------------------------------


def test_campaign_reports_an_exception_plan_request_must_not_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    real = mutate.plan_request

    def broken(ctx: Any, payload: Any) -> Any:
        if bytes(payload[:2]) == b"\x00\x03":
            raise KeyError("topics")
        return real(ctx, payload)

    monkeypatch.setattr(mutate, "plan_request", broken)
    tally = Tally()
    client_frames.campaign(SEED, range(300), tally)
    assert any(sig[2] == "KeyError" for sig in tally.counts), tally.report()


def test_campaign_reports_malformed_escaping_a_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    real = broker_answers.merge

    def broken(plan: Any, answers: Any, watermarks: Any) -> Any:
        if any(isinstance(a, Response) and len(a.payload) < 8 for a in answers.values()):
            raise Malformed("undecodable answer escaped")
        return real(plan, answers, watermarks)

    monkeypatch.setattr(broker_answers, "merge", broken)
    tally = Tally()
    broker_answers.campaign(SEED, range(300), tally)
    assert any(sig[:3] == ("merge", "exception", "Malformed") for sig in tally.counts), tally.report()


def test_harness_reports_slow_calls_hangs_and_broken_outputs() -> None:
    tally = Tally()

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    def spin_then_fail() -> None:
        spin(0.05)
        raise KeyError("x")

    check(tally, "t", 1, dict, (), lambda: time.sleep(0.05), slow_seconds=0.01, label=lambda: "Sleep v0")
    check(tally, "t", 2, dict, (), lambda: spin(0.05), slow_seconds=0.01, label=lambda: "Spin v0")
    check(tally, "t", 3, dict, (), lambda: spin(5), hang_seconds=0.1, label=lambda: "Endless v0")
    check(tally, "t", 4, dict, (Malformed,), lambda: (_ for _ in ()).throw(Broken("bad output")))
    check(tally, "t", 5, dict, (Malformed, Unsupported), lambda: (_ for _ in ()).throw(Unsupported("fine")))
    check(tally, "t", 6, dict, (Malformed,), spin_then_fail, slow_seconds=0.01)
    # Slow by CPU time (the spin, not the sleep); an exception is a finding of its own, never also slow.
    assert sorted(sig[1:3] for sig in tally.counts) == [("broken", "Broken"), ("exception", "KeyError"), ("hang", "Hang"), ("slow", "Slow")]
    assert [sig[3] for sig in tally.counts if sig[1] == "slow"] == ["Spin"]  # the signature keeps the API name


def test_harness_allows_a_huge_input_time_in_proportion_to_its_size() -> None:
    """Linear work on megabytes is not the quadratic work the slow bound is for; the same spin on a small input is."""
    tally = Tally()

    def spin() -> None:
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass

    check(tally, "t", 1, dict, (), spin, slow_seconds=0.01, input_bytes=100_000, label=lambda: "Huge v0")
    assert not tally.counts, tally.report()
    check(tally, "t", 2, dict, (), spin, slow_seconds=0.01, input_bytes=1_000, label=lambda: "Small v0")
    assert [sig[1:4:2] for sig in tally.counts] == [("slow", "Small")]


def test_mutators_are_deterministic_and_reach_what_they_claim() -> None:
    base = mutate.valid_requests()[100]
    assert mutate.mutate(base, random.Random(5)) == mutate.mutate(base, random.Random(5))
    outputs = {mutate.mutate(base, random.Random(i)) for i in range(50)}
    assert len(outputs) > 40 and base not in outputs
    data = bytearray(base)
    mutate.overlong_varint(data, random.Random(1))
    assert b"\xff" * 10 in data or b"\xff\xff\xff\xff" in data or b"\x80\x80\x80\x80" in data
    flexible = next(p for p in mutate.valid_requests() if schema.is_flexible(*struct.unpack(">hh", p[:4])))
    api_key, version = 3, mutate.API_VERSIONS[3][1]
    plan = mutate.plan(next(p for p in mutate.valid_requests() if struct.unpack(">hh", p[:4]) == (api_key, version)))
    assert isinstance(plan, Forward)
    (response,) = mutate.valid_answers(plan).values()
    answer = bytes(response.payload)
    tagged = mutate.with_unknown_tags(api_key, version, answer, random.Random(3))
    assert tagged != answer
    body = schema.decode_body(schema.response_spec(api_key, version), tagged, response_body_offset(tagged, api_key, version))
    assert body.get(schema.TAGS) or any(t.get(schema.TAGS) for t in body["topics"]) or any(b.get(schema.TAGS) for b in body["brokers"])
    reshaped = {mutate.reshape_request(flexible, random.Random(i)) for i in range(20)}
    assert len(reshaped) > 1
    for payload in reshaped:
        parse_request_header(payload)  # reshaped requests keep a valid header and body
