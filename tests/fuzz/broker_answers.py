"""Fuzz target (b): what brokers answer, through merges, Fetch's waiting policy and the control plane.

Each case plans a request (a valid one of some API key and version, now and
then a reshaped or mutated one that still plans), then answers each of its
sub-requests with one of: a valid answer, a mutated one, random bytes, a
truncated one, one carrying unknown tagged fields where Kafka allows them
(struct ends and the response header), a reshaped one (valid, but with
entries duplicated, dropped or foreign, extreme integers), one of another
version, nothing but a header, or an integer error code (a failed broker, or a sub-fetch not answered yet). The
answers go through ``plan.merge`` (Fetch's with a ``marks`` mapping) and, for
Fetch, :func:`proxy.core.fetch_satisfied` and :func:`proxy.core.answer_marks`.
A merged Metadata answer is folded into a :class:`Topology`, as the
connection does, and the topology must survive its JSON form (captures).

Contracts: merges raise only :class:`proxy.core.BrokerUnavailable` (the
client connection closes); ``fetch_satisfied``, ``answer_marks`` and
``Topology.with_metadata`` raise nothing. Answers that are valid (unknown
tags included) or failures merge into a response that decodes.

The control plane's decoders (``backends.cluster.read_api_versions``,
``read_metadata``, ``read_coordinator``) raise only :class:`Malformed`, and
``Topology().with_metadata(read_metadata(...))`` raises nothing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from kio.index import load_response_schema

from backends.topology import Topology
from proxy.core import (
    NO_ANSWER_YET,
    Answer,
    BrokerUnavailable,
    Context,
    Outcome,
    Plan,
    Target,
    Unsupported,
    answer_marks,
    fetch_satisfied,
)
from proxy.kafka import apis, errors, schema
from proxy.kafka.headers import response_header
from proxy.kafka.wire import Malformed

from .harness import HANG_SECONDS, Broken, Tally, api_label, check
from .mutate import (
    GROUPS,
    TOPOLOGY,
    Generator,
    answer_body,
    encode_answer,
    large_requests,
    mutate,
    reshape_answer,
    reshape_request,
    valid_answers,
    valid_requests,
    with_unknown_tags,
)
from .mutate import plan as plan_like_connection

MERGE = "merge"
SATISFIED = "fetch_satisfied"
MARKS = "answer_marks"
FOLD = "fold_metadata"
CONTROL = "control_plane"
MERGE_ALLOWED: tuple[type[BaseException], ...] = (BrokerUnavailable,)

KINDS = ("valid", "mutated", "random", "truncated", "tags", "tags_mutated", "reshaped", "other_version", "header_only", "empty", "code")
WEIGHTS = (1, 8, 1, 2, 2, 2, 3, 1, 1, 1, 2)
WELL_FORMED = {"valid", "tags", "reshaped", "code"}  # answers after which the merged response must decode
CODES = (
    NO_ANSWER_YET,
    errors.NOT_LEADER_OR_FOLLOWER,
    errors.REQUEST_TIMED_OUT,
    errors.NETWORK_EXCEPTION,
    errors.NOT_COORDINATOR,
    -1,
    0x7FFF,
)


def merge(plan: Plan, answers: Mapping[Target, Answer], marks: Mapping[Any, tuple[int, int, int]]) -> Outcome:
    """What the connection does with the answers: merge (Fetch's with its marks) and join the body."""
    assert plan.merge is not None
    outcome = plan.merge(answers, marks) if plan.fetch_min_bytes is not None else plan.merge(answers)
    b"".join(bytes(p) for p in outcome.body)
    return outcome


def fold(metadata: Mapping[str, Any]) -> None:
    """What the control plane and the connection do with a Metadata answer: fold it into the
    topology (a fresh one and the current one); captures record the result as JSON, which the
    replay job reads back."""
    for base in (Topology(), TOPOLOGY):
        topology = base.with_metadata(metadata)
        again = Topology.from_json(topology.to_json())
        if again != topology:
            raise Broken(f"topology does not survive its JSON form: {topology} != {again}")


def check_response(plan: Plan, outcome: Outcome) -> None:
    """The merged body decodes under the response schema (for answers that were well formed)."""
    body = b"".join(bytes(p) for p in outcome.body)
    try:
        schema.decode_body(schema.response_spec(plan.header.api_key, plan.header.api_version), body)
    except Malformed as e:
        raise Broken(f"merged response does not decode: {e}") from e


def answer_variant(kind: str, valid: bytes, api_key: int, version: int, rng: random.Random) -> Answer:
    if kind == "valid":
        return valid
    if kind == "mutated":
        return mutate(valid, rng)
    if kind == "random":
        return rng.randbytes(rng.choice((0, 1, 3, 4, 5, 9, 40, 300)))
    if kind == "truncated":
        return valid[: rng.randrange(len(valid))]
    if kind == "tags":
        return with_unknown_tags(api_key, version, valid, rng)
    if kind == "tags_mutated":
        return mutate(with_unknown_tags(api_key, version, valid, rng), rng)
    if kind == "reshaped":
        return reshape_answer(api_key, version, valid, rng)
    if kind == "other_version":
        versions = schema.known_versions(api_key)
        assert versions is not None
        other = rng.choice(versions)
        return encode_answer(api_key, other, Generator(rng, answer=True).message(load_response_schema(api_key, other)))
    if kind == "header_only":
        return response_header(api_key, version, 9)
    if kind == "empty":
        return b""
    return rng.choice(CODES)


def _hex(answer: Answer) -> str:
    return str(answer) if isinstance(answer, int) else bytes(answer).hex()


def _plan_for(rng: random.Random, corpus: list[bytes]) -> tuple[bytes, Plan]:
    """A request with sub-requests to answer, and its plan."""
    while True:
        payload = rng.choice(corpus)
        roll = rng.random()
        if roll < 0.15:
            for _ in range(5):
                candidate = mutate(payload, rng)
                try:
                    plan_like_connection(candidate)
                except (Malformed, Unsupported):
                    continue
                except Exception:
                    break  # the client target reports these
                payload = candidate
                break
        elif roll < 0.35:  # valid but odd: duplicated or dropped partitions and groups, unknown names
            candidate = reshape_request(payload, rng)
            try:
                plan_like_connection(candidate)
                payload = candidate
            except Exception:
                pass  # the client target reports these
        plan = plan_like_connection(payload)
        if plan.merge is not None and plan.subs:
            return payload, plan


def run_case(rng: random.Random, corpus: list[bytes], tally: Tally, index: int, hang_seconds: float = HANG_SECONDS) -> None:
    request, plan = _plan_for(rng, corpus)
    hdr = plan.header
    valid = valid_answers(plan, rng)
    baseline = rng.random() < 0.08
    kinds = {t: "valid" if baseline else rng.choices(KINDS, WEIGHTS)[0] for t in plan.subs}
    if not baseline and all(k == "valid" for k in kinds.values()):
        kinds[rng.choice(list(kinds))] = "mutated"
    answers: dict[Target, Answer] = {t: answer_variant(kinds[t], valid[t], hdr.api_key, hdr.api_version, rng) for t in plan.subs}
    marks = {tp: (rng.randint(-1, 100), rng.randint(-1, 100), rng.randint(-1, 10)) for ps in plan.fetch_partitions.values() for tp in ps}
    if marks and rng.random() < 0.3:
        marks = {}

    def reproducer() -> dict[str, str]:
        out = {"request": request.hex()}
        out.update({f"answer[{t!r}] ({kinds[t]})": _hex(a) for t, a in answers.items()})
        return out

    def label() -> str:
        return api_label(request)

    def merged() -> Outcome:
        outcome = merge(plan, answers, marks)
        if all(k in WELL_FORMED for k in kinds.values()):
            check_response(plan, outcome)
        return outcome

    tally.count(MERGE)
    limits = {"hang_seconds": hang_seconds, "label": label}
    ok, outcome = check(tally, MERGE, index, reproducer, MERGE_ALLOWED, merged, **limits)  # type: ignore[arg-type]
    if ok and outcome.metadata is not None:
        tally.count(FOLD)
        metadata = outcome.metadata
        check(tally, FOLD, index, reproducer, (), lambda: fold(metadata), **limits)  # type: ignore[arg-type]
    if hdr.api_key == apis.FETCH:
        min_bytes = plan.fetch_min_bytes or 0
        tally.count(SATISFIED, 1 + len(answers))
        check(tally, SATISFIED, index, reproducer, (), lambda: fetch_satisfied(hdr, answers, min_bytes), **limits)  # type: ignore[arg-type]
        for t, a in answers.items():
            check(tally, SATISFIED, index, reproducer, (), lambda t=t, a=a: fetch_satisfied(hdr, {t: a}, 1), **limits)  # type: ignore[misc, arg-type]
            tally.count(MARKS)
            check(tally, MARKS, index, reproducer, (), lambda a=a: answer_marks(hdr, a), **limits)  # type: ignore[misc, arg-type]


# --- the control plane's decoders ------------------------------------------------------------

DECODERS = ("read_api_versions", "read_metadata", "read_coordinator")
_API = {"read_api_versions": apis.API_VERSIONS, "read_metadata": apis.METADATA, "read_coordinator": apis.FIND_COORDINATOR}


def decoder(name: str) -> Callable[..., Any]:
    """``backends.cluster.<name>``; an AttributeError (a finding) while it does not exist."""
    import backends.cluster

    fn = getattr(backends.cluster, name, None)
    if fn is None:
        raise AttributeError(f"backends.cluster has no {name}() yet: the control plane's decoder is not fuzzed")
    return fn  # type: ignore[no-any-return]


def control_input(name: str, rng: random.Random) -> tuple[int, bytes, int, str]:
    """(version, answer payload, key_type, key) for one call of a control-plane decoder."""
    api_key = _API[name]
    versions = schema.known_versions(api_key)
    assert versions is not None
    version = rng.choice(versions)
    key_type, key = rng.choice((0, 1)), rng.choice((*GROUPS, "tx1"))
    request = {"coordinator_keys": [key]} if api_key == apis.FIND_COORDINATOR and version >= 4 else {}
    body = answer_body(api_key, version, request, rng)
    if api_key == apis.METADATA and rng.random() < 0.7:
        body["brokers"] = [{**b, "node_id": i} for i, b in enumerate(body["brokers"], 1)]
    valid = encode_answer(api_key, version, body)
    kind = rng.choices(KINDS[:-1], WEIGHTS[:-1])[0]
    answer = answer_variant(kind, valid, api_key, version, rng)
    assert not isinstance(answer, int)
    return version, bytes(answer), key_type, key


def run_control_case(rng: random.Random, tally: Tally, index: int, missing: set[str], hang_seconds: float = HANG_SECONDS) -> None:
    name = rng.choice(DECODERS)
    version, payload, key_type, key = control_input(name, rng)

    def reproducer() -> dict[str, str]:
        return {
            "decoder": f"{name}(payload, {version}" + (f", {key_type}, {key!r})" if name == "read_coordinator" else ")"),
            "payload": payload.hex(),
        }

    def call() -> Any:
        fn = decoder(name)
        if name == "read_coordinator":
            return fn(payload, version, key_type, key)
        return fn(payload, version)

    if name in missing:
        return
    tally.count(CONTROL)
    try:
        decoder(name)
    except AttributeError:
        missing.add(name)  # reported once, not once per input
    ok, result = check(tally, CONTROL, index, reproducer, (Malformed,), call, hang_seconds=hang_seconds, label=lambda: name)
    if ok and name == "read_metadata":
        tally.count(FOLD)
        check(
            tally,
            FOLD,
            index,
            reproducer,
            (),
            lambda: fold(result),
            hang_seconds=hang_seconds,
            label=lambda: name,
        )


# --- campaigns -------------------------------------------------------------------------------


def case_rng(seed: int | str, index: int) -> random.Random:
    return random.Random(f"answers {seed} {index}")


def campaign(seed: int | str, indexes: range, tally: Tally, hang_seconds: float = HANG_SECONDS, deadline: float | None = None) -> None:
    """Cases ``indexes`` of the campaign ``seed``: one in eight exercises the control plane, the rest merges."""
    corpus = valid_requests()
    missing: set[str] = set()
    for i in indexes:
        if deadline is not None and time.monotonic() > deadline:
            return
        rng = case_rng(seed, i)
        if rng.random() < 0.125:
            run_control_case(rng, tally, i, missing, hang_seconds)
        else:
            run_case(rng, corpus, tally, i, hang_seconds)


LARGE_PLAN = "plan_large"
LARGE_MERGE = "merge_large"


def large_campaign(tally: Tally, hang_seconds: float = HANG_SECONDS, only: Callable[[bytes], bool] | None = None) -> None:
    """Huge valid requests (16,000 groups, partitions, topics...) planned and merged once each: any slow one is quadratic work."""
    from .client_frames import ALLOWED, plan_frame

    for i, request in enumerate(large_requests()):
        if only is not None and not only(request):
            continue
        tally.count(LARGE_PLAN)
        ok, plan = check(
            tally,
            LARGE_PLAN,
            i,
            lambda r=request: {"request": r.hex()},  # type: ignore[misc]
            ALLOWED,
            lambda r=request: plan_frame(r),  # type: ignore[misc]
            hang_seconds=hang_seconds,
            label=lambda r=request: api_label(r),  # type: ignore[misc]
        )
        if not ok or plan.merge is None or not plan.subs:
            continue
        answers = valid_answers(plan, random.Random(f"large answers {i}"), lean=True)
        tally.count(LARGE_MERGE)
        check(
            tally,
            LARGE_MERGE,
            i,
            lambda r=request: {"request": r.hex()},  # type: ignore[misc]
            MERGE_ALLOWED,
            lambda p=plan, a=answers: merge(p, a, {}),  # type: ignore[misc]
            hang_seconds=hang_seconds,
            label=lambda r=request: api_label(r),  # type: ignore[misc]
        )


def replay(request_hex: str, answers_hex: Mapping[Target, str | int], marks: Mapping[Any, tuple[int, int, int]] | None = None) -> Outcome:
    """Merge hex answers (or int error codes) into the plan of a hex request; raises what the merge raises."""
    plan = plan_like_connection(bytes.fromhex(request_hex))
    answers = {t: a if isinstance(a, int) else bytes.fromhex(a) for t, a in answers_hex.items()}
    return merge(plan, answers, marks or {})


__all__ = ["Context", "campaign", "large_campaign", "replay", "run_case", "run_control_case"]
