"""Fuzz target (b): what brokers answer, through merges, Fetch's waiting policy and the control plane.

Each case plans a request (a valid one of some API key and version, now and
then a reshaped or mutated one that still plans), then answers each of its
sub-requests with one of: a valid answer, a mutated one, random bytes, a
truncated one, one carrying unknown tagged fields where Kafka allows them
(struct ends and the response header), a reshaped one (valid, but with
entries duplicated, dropped or foreign, extreme integers), one of another
version, nothing but a header, a failure (:class:`proxy.core.Failed` with an
error code) or, for a Fetch, :data:`proxy.core.NOT_YET` (a sub-fetch not
answered yet). A Produce's answers are also read for what kfan
keeps of its producers' order (:func:`proxy.core.produce.sequenced`,
:func:`proxy.core.produce.sent_again`). The answers go through ``plan.merge`` (a Fetch's with the
watermarks its connection remembers in its context) and, for Fetch,
:func:`tests.support.core_inputs.satisfied` (Fetch's waiting policy) and
:func:`proxy.core.fetch.answer_watermarks`. A Fetch answer one broker gave
that kfan passes on as it came must say what the merge that encodes every
Fetch says. A leader-split answer that one
broker gave cleanly is read for its keys only and passed on as it came
(:func:`proxy.kafka.skim.partition_keys`): the mutated ones reach that reader.
The Metadata answer a merge asks to fold (:class:`proxy.core.FoldMetadata`)
is folded into a :class:`Topology`, as the connection does, and the topology
must survive its JSON form (captures).

Contracts: merges raise only :class:`proxy.core.BrokerUnavailable` (the
client connection closes); ``satisfied``, ``answer_watermarks`` and
``Topology.with_metadata``, ``sequenced`` and ``sent_again`` raise nothing; a Fetch passed on as it came
decodes as the re-encoded merge does. Answers that are valid (unknown
tags included) or failures merge into a response that decodes.

The control plane's decoders (``backends.control.read_api_versions`` and
``read_metadata``, ``backends.coordinators.read_coordinator``) raise only :class:`Malformed`, and
``Topology().with_metadata(read_metadata(...))`` raises nothing.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from proxy.core import (
    NOT_YET,
    BrokerAnswer,
    BrokerUnavailable,
    Context,
    Destination,
    Failed,
    FetchForward,
    FoldMetadata,
    Forward,
    Reply,
    Response,
    Unsupported,
    Watermarks,
    fetch,
    produce,
)
from proxy.core.fetch import answer_watermarks
from proxy.core.layout import TopicPartition
from proxy.core.topology import Topology
from proxy.kafka import apis, errors, schema
from proxy.kafka.headers import response_header
from proxy.kafka.wire import Malformed
from tests.support.core_inputs import satisfied

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
MARKS = "answer_watermarks"
FOLD = "fold_metadata"
SEQUENCES = "produce_sequences"
AS_SENT = "fetch_as_sent"
CONTROL = "control_plane"
MERGE_ALLOWED: tuple[type[BaseException], ...] = (BrokerUnavailable,)

KINDS = ("valid", "mutated", "random", "truncated", "tags", "tags_mutated", "reshaped", "other_version", "header_only", "empty", "code")
WEIGHTS = (1, 8, 1, 2, 2, 2, 3, 1, 1, 1, 2)
WELL_FORMED = {"valid", "tags", "reshaped", "code"}  # answers after which the merged response must decode
# The "code" kind: a failed broker, or a sub-fetch not answered yet (NOT_YET; a
# Fetch's only: other requests are answered once every broker answered or failed,
# and for them it stands for a failure that reports no error code).
CODES: tuple[BrokerAnswer, ...] = (
    NOT_YET,
    Failed(errors.NOT_LEADER_OR_FOLLOWER),
    Failed(errors.REQUEST_TIMED_OUT),
    Failed(errors.NETWORK_EXCEPTION),
    Failed(errors.NOT_COORDINATOR),
    Failed(-1),
    Failed(0x7FFF),
)


def code_answer(code: BrokerAnswer | int, api_key: int) -> BrokerAnswer:
    """A failure or a sub-fetch still out (an int: its error code, 0 for "not answered yet"), as the connection
    hands it to the merge of ``api_key``: only a Fetch is answered while a broker has not answered yet."""
    if isinstance(code, int):
        code = NOT_YET if code == errors.NONE else Failed(code)
    if code is NOT_YET and api_key != apis.FETCH:
        return Failed(errors.NONE)
    return code


def merge(plan: Forward, answers: Mapping[Destination, BrokerAnswer], watermarks: Mapping[TopicPartition, Watermarks]) -> Reply:
    """What the connection does with the answers: merge (a Fetch's with the watermarks it remembers) and join the body."""
    if isinstance(plan, FetchForward):
        plan = dataclasses.replace(plan, ctx=dataclasses.replace(plan.ctx, watermarks=watermarks))
    reply = plan.merge(plan, answers)
    b"".join(bytes(p) for p in reply.body)
    return reply


def fetch_as_sent(
    plan: FetchForward, answers: Mapping[Destination, BrokerAnswer], watermarks: Mapping[TopicPartition, Watermarks], reply: Reply
) -> None:
    """A Fetch answer passed on as its broker sent it decodes as the merge that encodes every Fetch does
    (unless a partition was asked twice: the merge answers both from the first, a broker as it likes)."""
    if not (len(answers) == 1 and len(reply.body) == 1 and isinstance(reply.body[0], memoryview)):
        return
    (answer,) = answers.values()
    if not isinstance(answer, Response) or reply.body[0].obj is not answer.payload:
        return
    keys = plan.state.request_layout.keys(plan.state.request)
    if len(set(keys)) < len(keys):
        return
    passed = fetch._as_answered
    fetch._as_answered = lambda *args: False  # type: ignore[assignment]  # one process, one case at a time
    try:
        full = merge(plan, answers, watermarks)
    finally:
        fetch._as_answered = passed  # type: ignore[assignment]
    spec = schema.response_spec(plan.header.api_key, plan.header.api_version)
    as_sent = schema.decode_body(spec, b"".join(bytes(p) for p in reply.body), allow_trailing=True)
    if as_sent != schema.decode_body(spec, b"".join(bytes(p) for p in full.body)):
        raise Broken("a Fetch passed on as it came differs from the merge that encodes it")


def fold(metadata: Mapping[str, Any]) -> None:
    """What the control plane and the connection do with a Metadata answer: fold it into the
    topology (a fresh one and the current one); captures record the result as JSON, which the
    replay job reads back."""
    for base in (Topology(), TOPOLOGY):
        topology = base.with_metadata(metadata)
        again = Topology.from_json(topology.to_json())
        if again != topology:
            raise Broken(f"topology does not survive its JSON form: {topology} != {again}")


def produce_orders(plan: Forward, answers: Mapping[Destination, BrokerAnswer]) -> None:
    """What kfan reads to keep an idempotent producer's batches in order (:mod:`backends.sequences`): the
    producers' batches per broker and those it answers itself, and what each broker's answer refused."""
    produce.sequenced(plan.state)
    produce.unroutable_batches(plan.state)
    for answer in answers.values():
        if isinstance(answer, Response):
            produce.sent_again(plan.header, plan.state.response_layout, answer.payload)


def check_response(plan: Forward, reply: Reply) -> None:
    """The merged body decodes under the response schema (for answers that were well formed)."""
    body = b"".join(bytes(p) for p in reply.body)
    try:
        schema.decode_body(schema.response_spec(plan.header.api_key, plan.header.api_version), body)
    except Malformed as e:
        raise Broken(f"merged response does not decode: {e}") from e


def answer_variant(kind: str, valid: bytes, api_key: int, version: int, rng: random.Random) -> BrokerAnswer:
    """One broker's answer of ``kind``: a response (see :func:`answer_bytes`), or for "code" a failure or NOT_YET."""
    if kind == "code":
        return code_answer(rng.choice(CODES), api_key)
    return Response(answer_bytes(kind, valid, api_key, version, rng))


def answer_bytes(kind: str, valid: bytes, api_key: int, version: int, rng: random.Random) -> bytes:
    """The payload of a response of ``kind`` (any kind but "code"), made from the ``valid`` one."""
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
        return encode_answer(api_key, other, Generator(rng, answer=True).message(schema.response_spec(api_key, other)))
    if kind == "header_only":
        return response_header(api_key, version, 9)
    assert kind == "empty", kind
    return b""


def _hex(answer: BrokerAnswer) -> str:
    return bytes(answer.payload).hex() if isinstance(answer, Response) else repr(answer)


def _plan_for(rng: random.Random, corpus: list[bytes]) -> tuple[bytes, Forward]:
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
        if isinstance(plan, Forward) and plan.subs:
            return payload, plan


def run_case(rng: random.Random, corpus: list[bytes], tally: Tally, index: int, hang_seconds: float = HANG_SECONDS) -> None:
    request, plan = _plan_for(rng, corpus)
    hdr = plan.header
    valid = valid_answers(plan, rng)
    baseline = rng.random() < 0.08
    kinds = {t: "valid" if baseline else rng.choices(KINDS, WEIGHTS)[0] for t in plan.subs}
    if not baseline and all(k == "valid" for k in kinds.values()):
        kinds[rng.choice(list(kinds))] = "mutated"
    answers = {t: answer_variant(kinds[t], bytes(valid[t].payload), hdr.api_key, hdr.api_version, rng) for t in plan.subs}
    partitions = plan.partitions if isinstance(plan, FetchForward) else {}
    # What the connection remembers of the partitions' watermarks (those not answered yet report them).
    watermarks = {tp: (rng.randint(-1, 100), rng.randint(-1, 100), rng.randint(-1, 10)) for ps in partitions.values() for tp in ps}
    if watermarks and rng.random() < 0.3:
        watermarks = {}

    def reproducer() -> dict[str, str]:
        out = {"request": request.hex()}
        out.update({f"answer[{t!r}] ({kinds[t]})": _hex(a) for t, a in answers.items()})
        return out

    def label() -> str:
        return api_label(request)

    def merged() -> Reply:
        reply = merge(plan, answers, watermarks)
        if all(k in WELL_FORMED for k in kinds.values()):
            check_response(plan, reply)
        return reply

    tally.count(MERGE)
    limits = {"hang_seconds": hang_seconds, "label": label}
    ok, reply = check(tally, MERGE, index, reproducer, MERGE_ALLOWED, merged, **limits)  # type: ignore[arg-type]
    for effect in reply.effects if ok else []:
        if isinstance(effect, FoldMetadata):
            tally.count(FOLD)
            metadata = effect.metadata
            check(tally, FOLD, index, reproducer, (), lambda m=metadata: fold(m), **limits)  # type: ignore[misc, arg-type]
    if hdr.api_key == apis.PRODUCE:
        tally.count(SEQUENCES, len(answers))
        check(tally, SEQUENCES, index, reproducer, (), lambda: produce_orders(plan, answers), **limits)  # type: ignore[arg-type]
    if isinstance(plan, FetchForward):
        fetch_plan = plan
        if ok and all(k in WELL_FORMED for k in kinds.values()):
            tally.count(AS_SENT)
            check(tally, AS_SENT, index, reproducer, (), lambda: fetch_as_sent(fetch_plan, answers, watermarks, reply), **limits)  # type: ignore[arg-type]
        tally.count(SATISFIED, 1 + len(answers))
        check(tally, SATISFIED, index, reproducer, (), lambda: satisfied(hdr, answers, fetch_plan.min_bytes), **limits)  # type: ignore[arg-type]
        for t, a in answers.items():
            check(tally, SATISFIED, index, reproducer, (), lambda t=t, a=a: satisfied(hdr, {t: a}, 1), **limits)  # type: ignore[misc, arg-type]
            tally.count(MARKS)
            check(tally, MARKS, index, reproducer, (), lambda a=a: answer_watermarks(fetch_plan, a), **limits)  # type: ignore[misc, arg-type]


# --- the control plane's decoders ------------------------------------------------------------

DECODERS = ("read_api_versions", "read_metadata", "read_coordinator")
_API = {"read_api_versions": apis.API_VERSIONS, "read_metadata": apis.METADATA, "read_coordinator": apis.FIND_COORDINATOR}
# Where each decoder lives: kfan's own requests (control), the coordinator cache (coordinators).
_MODULE = {"read_api_versions": "backends.reads", "read_metadata": "backends.reads", "read_coordinator": "backends.coordinators"}


def decoder(name: str) -> Callable[..., Any]:
    """``backends.<module>.<name>``; an AttributeError (a finding) while it does not exist."""
    module = importlib.import_module(_MODULE[name])
    fn = getattr(module, name, None)
    if fn is None:
        raise AttributeError(f"{module.__name__} has no {name}(): the control plane's decoder is not fuzzed")
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
    kind = rng.choices(KINDS[:-1], WEIGHTS[:-1])[0]  # a response: the control plane's failures are its links'
    return version, answer_bytes(kind, valid, api_key, version, rng), key_type, key


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
    """Huge valid requests (16,000 groups, partitions, topics...) planned and merged once each: any slow one is quadratic work
    (the bound allows for linear work on their megabytes)."""
    from .client_frames import fuzz_plan

    for i, request in enumerate(large_requests()):
        if only is not None and not only(request):
            continue
        ok, plan = fuzz_plan(tally, LARGE_PLAN, i, request, hang_seconds, input_bytes=len(request))
        if not ok or not isinstance(plan, Forward) or not plan.subs:
            continue
        answers = valid_answers(plan, random.Random(f"large answers {i}"), lean=True)
        size = len(request) + sum(len(a.payload) for a in answers.values())
        tally.count(LARGE_MERGE)
        check(
            tally,
            LARGE_MERGE,
            i,
            lambda r=request: {"request": r.hex()},  # type: ignore[misc]
            MERGE_ALLOWED,
            lambda p=plan, a=answers: merge(p, a, {}),  # type: ignore[misc]
            hang_seconds=hang_seconds,
            input_bytes=size,
            label=lambda r=request: api_label(r),  # type: ignore[misc]
        )


def replay(
    request_hex: str,
    answers_hex: Mapping[Destination, str | int | BrokerAnswer],
    watermarks: Mapping[TopicPartition, Watermarks] | None = None,
) -> Reply:
    """Merge hex answers (or failures: int error codes, 0 for "not answered yet") into the plan of a hex request;
    raises what the merge raises."""
    plan = plan_like_connection(bytes.fromhex(request_hex))
    assert isinstance(plan, Forward), plan
    answers = {t: Response(bytes.fromhex(a)) if isinstance(a, str) else code_answer(a, plan.header.api_key) for t, a in answers_hex.items()}
    return merge(plan, answers, watermarks or {})


__all__ = ["Context", "campaign", "large_campaign", "replay", "run_case", "run_control_case"]
