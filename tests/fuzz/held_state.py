"""Fuzz target (d): state that clients grow with what they choose, under random sequences of operations.

* ``coordinator_cache`` — group and transactional ids of random lengths (some
  of megabytes), from a few scopes (kfan's own, client connections'), put,
  read and dropped in any order on :class:`backends.coordinators.CoordinatorCache`:
  it never holds more entries or bytes than its bounds, its byte count is
  exactly what its entries cost, and a key too long to cache is never kept.
* ``inflight_fetches`` — a client's Fetches as kfan sees them, pipelined and
  left unread: sub-fetches recorded, reused, answered late, settled, expired
  and replaced at random times on :class:`proxy.core.fetch_wait.InflightFetches`.
  Every sub-fetch it stops holding is either handed back to its caller
  (settled, reused as hung) or reported evicted, once: none is dropped
  silently, or the bytes of its answer would stay counted (or uncounted) for ever;
  and it holds at most one per broker.
* ``share_sessions`` — a client's share session (KIP-932) through the core's
  ShareFetch and ShareAcknowledge plans and merges (:mod:`proxy.core.share`),
  against random answers and moving leaders: every sub-request carries its
  broker session's epoch, and the session stays within its bounds.
* ``client_quotas`` — clients of random users and client ids (some cycling
  through thousands) recording random amounts at random times on
  :class:`proxy.core.quotas.ClientQuotas`, its configuration replaced at random:
  it never keeps more rates than its bound, and every throttle is finite, not
  negative, and within the bound it was given. Each case also sets a throttle
  time in a mutated broker answer (:func:`proxy.core.throttle.with_throttle`):
  nothing is raised, and an answer that decodes says the longer throttle after.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from backends.coordinators import CoordinatorCache, entry_bytes
from proxy.core import (
    NOT_YET,
    Context,
    Coordinator,
    Failed,
    Forward,
    Identity,
    KeyType,
    Response,
    ShareKey,
    ShareSession,
    plan_request,
    share,
)
from proxy.core.fetch_wait import InflightFetches
from proxy.core.plan import MAX_CACHED_KEY_CHARS, cacheable
from proxy.core.quotas import DEFAULT, ClientQuotas, QuotaConfig, QuotaEntity, QuotaType
from proxy.core.throttle import with_throttle
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, schema
from proxy.kafka.schema import Struct
from proxy.kafka.wire import Malformed
from tests.support import golden
from tests.support.core_inputs import keep_share_sessions

from .harness import HANG_SECONDS, Broken, Tally, check

CACHE, INFLIGHT, SHARE, QUOTAS = "coordinator_cache", "inflight_fetches", "share_sessions", "client_quotas"
_KEY_LENGTHS = (0, 1, 10, 255, MAX_CACHED_KEY_CHARS - 1, MAX_CACHED_KEY_CHARS, MAX_CACHED_KEY_CHARS + 1, 100_000, 2 * 1024 * 1024)


def _cache_case(rng: random.Random) -> None:
    cache = CoordinatorCache(max_entries=rng.choice((1, 5, 50)), max_bytes=rng.choice((400, 5_000, 60_000)))
    scopes = (None, "client-1", "client-2")
    keys: list[Coordinator] = []
    for _ in range(rng.randint(1, 60)):
        roll = rng.random()
        if roll < 0.5 or not keys:
            size = rng.choice(_KEY_LENGTHS) if rng.random() < 0.3 else rng.randint(0, 300)
            c = Coordinator(rng.choice(list(KeyType)), "k" * size + str(rng.randint(0, 20)))
            keys.append(c)
            scope = rng.choice(scopes)
            cache.put(scope, c, rng.randint(-1, 5), float(rng.randint(0, 1000)))
            kept = cache.get(scope, c) is not None
            fits = entry_bytes(c) <= cache.max_bytes
            if cacheable(c) and fits and not kept:
                raise Broken(f"a {len(c.key)}-character key just put is not kept")
            if not cacheable(c) and kept:
                raise Broken(f"a {len(c.key)}-character key was kept (over {MAX_CACHED_KEY_CHARS})")
        elif roll < 0.8:
            cache.get(rng.choice(scopes), rng.choice(keys))
        else:
            cache.pop(rng.choice(scopes), rng.choice(keys))
        entries = cache.entries()
        if len(entries) > cache.max_entries:
            raise Broken(f"{len(entries)} entries over the bound of {cache.max_entries}")
        counted = sum(entry_bytes(c) for _, c in entries)
        if cache.bytes != counted:
            raise Broken(f"the cache counts {cache.bytes} bytes, its entries cost {counted}")
        if cache.bytes > cache.max_bytes:
            raise Broken(f"{cache.bytes} bytes over the bound of {cache.max_bytes}")


class _Sub:
    """A sub-fetch's handle: when its answer came (None: not yet)."""

    __slots__ = ("done_at", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.done_at: float | None = None


def _inflight_case(rng: random.Random) -> None:
    evicted: list[_Sub] = []
    fetches = InflightFetches[_Sub](lambda h: h.done_at, ttl=1.0, on_evict=evicted.append)
    brokers = range(rng.randint(1, 4))
    keys = ("a", "b", "c")
    now = 0.0
    live: set[int] = set()  # handles recorded and not yet handed back or evicted
    handed_back: set[int] = set()
    subs: list[_Sub] = []
    for _ in range(rng.randint(1, 80)):
        now += rng.choice((0.0, 0.01, 0.3, 1.2, 40.0))
        roll = rng.random()
        broker = rng.choice(brokers)
        if roll < 0.35:  # a Fetch (or a fetch sent ahead) sends a new sub-fetch
            sub = _Sub(len(subs))
            subs.append(sub)
            fetches.record(broker, rng.choice(keys), sub, now)
            live.add(sub.n)
        elif roll < 0.55 and subs:  # a broker answers, maybe late
            sub = rng.choice(subs)
            if sub.done_at is None:
                sub.done_at = now
        elif roll < 0.75:  # the next Fetch looks for one to reuse
            reuse = fetches.reusable(broker, rng.choice(keys), now, hung_after=30.0)
            if reuse is not None and reuse.hung:
                handed_back.add(reuse.handle.n)
                live.discard(reuse.handle.n)
        elif roll < 0.9 and subs:  # a Fetch is answered: what it used is spent, what is still out stays
            sub = rng.choice(subs)
            answered = rng.random() < 0.5
            before = fetches.kept(broker, sub)
            fetches.settle({broker: sub}, {broker: b"answer" if answered else NOT_YET})
            if before and not fetches.kept(broker, sub):
                handed_back.add(sub.n)
                live.discard(sub.n)
        elif subs:  # its time is up
            sub = rng.choice(subs)
            fetches.expire(broker, sub, now)
        for sub in evicted:
            if sub.n not in live:
                raise Broken(f"sub-fetch {sub.n} evicted twice, or after it was handed back")
            live.discard(sub.n)
        evicted.clear()
        if len(fetches) > len(brokers):
            raise Broken(f"{len(fetches)} sub-fetches held for {len(brokers)} brokers")
        held = {s.n for s in subs if any(fetches.kept(b, s) for b in brokers)}
        if held != live:
            raise Broken(f"held {sorted(held)}, but {sorted(live - held)} went without being evicted or handed back")
    # A Failed handle is never recorded (it has no answer to hold); settling one is harmless.
    fetches.settle({0: Failed(0)}, {0: b""})


_SHARE_IDENTITY = Identity(42, "kfan", 9092)
_TOPICS = (uuid.UUID(int=0xA1), uuid.UUID(int=0xB2), uuid.UUID(int=0xC3))  # the last one unknown to the topology
_SHARE_ERRORS = (0, 0, 0, 0, 6, 100, 121, 122, 123, 133, 42, 30)


def _share_topology(rng: random.Random) -> Topology:
    brokers = {b: Broker(b, f"b{b}", 9000 + b) for b in (1, 2, 3) if b == 1 or rng.random() < 0.8}
    leaders = {name: {p: rng.choice((1, 2, 3, -1)) for p in range(4)} for name in ("a", "b")}
    return Topology(brokers=brokers, leaders=leaders, topic_ids={_TOPICS[0]: "a", _TOPICS[1]: "b"})


def _share_request(rng: random.Random, session: ShareSession | None, fetch: bool) -> dict[str, Any]:
    epoch = rng.choice((0, -1, 7)) if session is None or rng.random() < 0.1 else session.client_epoch
    named = [(rng.choice(_TOPICS), rng.randrange(6)) for _ in range(rng.randrange(6))]
    topics: dict[Any, list[dict[str, Any]]] = {}
    for topic, p in named:
        acks = [{"first_offset": 0, "last_offset": 3, "acknowledge_types": [rng.choice((1, 2, 3))]}] if rng.random() < 0.4 else []
        topics.setdefault(topic, []).append({"partition_index": p, "acknowledgement_batches": acks})
    body: dict[str, Any] = {
        "group_id": "g",
        "member_id": "m",
        "share_session_epoch": epoch,
        "topics": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
    }
    if fetch:
        forget = [(rng.choice(_TOPICS), rng.randrange(6)) for _ in range(rng.randrange(3))]
        body.update(max_wait=500, min_bytes=1, max_bytes=rng.choice((0, 1, 1 << 20)), max_records=500, batch_size=500)
        body["forgotten_topics_data"] = [{"topic_id": t, "partitions": [p]} for t, p in forget]
    return body


def _share_answer(rng: random.Random, api: int, sub: Struct) -> Any:
    roll = rng.random()
    if roll < 0.1:
        return Failed(rng.choice((6, 13, 7)))
    if roll < 0.15:
        return Response(bytes(rng.randrange(256) for _ in range(rng.randrange(12))))  # garbage
    spec = schema.response_spec(api, 1)
    entries = [
        {
            "topic_id": t["topic_id"],
            "partitions": [
                {
                    **spec.field("responses").struct.field("partitions").struct.blank(),  # type: ignore[union-attr]
                    "partition_index": p["partition_index"],
                    "error_code": rng.choice(_SHARE_ERRORS),
                }
                for p in t["partitions"]
            ],
        }
        for t in sub["topics"]
    ]
    body = {
        **spec.blank(),
        "error_code": rng.choice(_SHARE_ERRORS) if rng.random() < 0.2 else 0,
        "responses": entries,
        "node_endpoints": [],
    }
    return Response(golden.answer_payload(api, 1, body))


def _share_case(rng: random.Random) -> None:
    """A client's share session through kfan: random ShareFetch and ShareAcknowledge requests (right and wrong
    epochs, acknowledgements, forgotten partitions, unknown topics), random broker answers (errors, failures,
    garbage), leaders moving. Every sub-request carries the epoch the session held for its broker; the session
    never holds a broker outside the cluster nor more unrouted partitions than its bound; every answer decodes."""
    sessions: dict[ShareKey, ShareSession] = {}
    for _ in range(rng.randint(1, 25)):
        topology = _share_topology(rng)
        fetch = rng.random() < 0.7
        api = apis.SHARE_FETCH if fetch else apis.SHARE_ACKNOWLEDGE
        before = sessions.get(("g", "m"))
        body = _share_request(rng, before, fetch)
        ctx = Context(_SHARE_IDENTITY, topology, {apis.SHARE_FETCH: (1, 2), apis.SHARE_ACKNOWLEDGE: (1, 2)}, share_sessions=dict(sessions))
        plan = plan_request(ctx, golden.request_payload(api, 1, body))
        effects = list(plan.at_plan)
        if isinstance(plan, Forward):
            for b, sub in plan.subs.items():
                if not isinstance(b, int) or b not in topology.brokers:
                    raise Broken(f"a sub-request to {b!r}, not a broker of the cluster")
                _, sent = golden.decode_sub(api, 1, b"".join(sub.tail))
                expected = before.broker_epochs.get(b, 0) if before is not None and body["share_session_epoch"] > 0 else 0
                if sent["share_session_epoch"] not in (expected, -1):
                    raise Broken(f"broker {b} sent epoch {sent['share_session_epoch']}, its session holds {expected}")
            reply = plan.merge(
                plan, {b: _share_answer(rng, api, golden.decode_sub(api, 1, b"".join(sub.tail))[1]) for b, sub in plan.subs.items()}
            )
            effects += reply.effects
            schema.decode_body(schema.response_spec(api, 1), b"".join(reply.body))
        else:
            schema.decode_body(schema.response_spec(api, 1), b"".join(plan.body))
        keep_share_sessions(sessions, effects)
        for session in sessions.values():
            if sum(1 for b in session.partitions.values() if b is None) > share.MAX_UNROUTED_PER_SESSION:
                raise Broken("a session holds more unrouted partitions than its bound")


def _quota_config(rng: random.Random) -> QuotaConfig:
    users = ("alice", "bob", DEFAULT, None)
    clients = ("app", "c1", DEFAULT, None)
    limits: dict[QuotaType, dict[QuotaEntity, float]] = {}
    for kind in QuotaType:
        for _ in range(rng.randrange(4)):
            user, client_id = rng.choice(users), rng.choice(clients)
            if user is None and client_id is None:
                continue
            limits.setdefault(kind, {})[QuotaEntity(user, client_id)] = rng.choice((1.0, 100.0, 1e6, 1e12))
    return QuotaConfig(limits, burst_seconds=rng.choice((0.1, 1.0, 30.0)))


def _quota_case(rng: random.Random) -> None:
    bound = rng.choice((1, 4, 100))
    quotas = ClientQuotas(_quota_config(rng), max_buckets=bound, expire_after=rng.choice((0.5, 3600.0)))
    now = rng.uniform(0, 1e6)
    for _ in range(rng.randrange(1, 300)):
        if rng.random() < 0.05:
            quotas.config = _quota_config(rng)
        now += rng.choice((0.0, 0.001, 0.5, 5.0, 4000.0))
        user = rng.choice(("alice", "bob", "ANONYMOUS", f"u{rng.randrange(10_000)}"))
        client_id = rng.choice(("app", "c1", "", f"c{rng.randrange(10_000)}"))
        kind = rng.choice(list(QuotaType))
        most = rng.choice((None, 1.0))
        usage = quotas.record(kind, user, client_id, rng.choice((0.0, 1.0, 1e3, 1e9, rng.uniform(0, 1e7))), now, most)
        if usage is not None and not (0.0 <= usage.throttle < float("inf")):
            raise Broken(f"throttle {usage.throttle}")
        if usage is not None and most is not None and usage.throttle > most:
            raise Broken(f"throttle {usage.throttle} past its bound {most}")
        if len(quotas) > bound:
            raise Broken(f"{len(quotas)} rates kept, bound {bound}")
        cap = quotas.burst(kind, user, client_id)
        if cap is not None and not cap > 0:
            raise Broken(f"window cap {cap}")
    api, version = rng.choice(((apis.FETCH, 12), (apis.PRODUCE, 9), (apis.API_VERSIONS, 3), (apis.OFFSET_DELETE, 0), (apis.METADATA, 12)))
    spec = schema.response_spec(api, version)
    body = bytearray(b"".join(schema.encode_body(spec, {**spec.blank(), "throttle_time": rng.choice((0, 5, 2**31 - 1))})))
    for _ in range(rng.randrange(3)):
        if body and rng.random() < 0.5:
            body[rng.randrange(len(body))] = rng.randrange(256)
        else:
            del body[rng.randrange(len(body) + 1) :]
    ms = rng.choice((1, 1000, 2**31 - 1))
    parts: list[bytes | memoryview] = [bytes(body[:3]), memoryview(bytes(body[3:]))]
    out = b"".join(bytes(p) for p in with_throttle(api, version, parts, ms))
    try:
        before = schema.decode_body(spec, bytes(body))
    except Malformed:
        return
    after = schema.decode_body(spec, out)
    if after["throttle_time"] != max(before["throttle_time"], ms) or {**after, "throttle_time": 0} != {**before, "throttle_time": 0}:
        raise Broken("the answer changed beyond its throttle time")


def campaign(seed: int | str, indexes: range, tally: Tally, hang_seconds: float = HANG_SECONDS, deadline: float | None = None) -> None:
    for i in indexes:
        if deadline is not None and time.monotonic() > deadline:
            return
        for target, case in ((CACHE, _cache_case), (INFLIGHT, _inflight_case), (SHARE, _share_case), (QUOTAS, _quota_case)):
            run_case(target, case, seed, i, tally, hang_seconds)


def run_case(target: str, case: Callable[[random.Random], None], seed: int | str, i: int, tally: Tally, hang_seconds: float) -> None:
    """One case of ``target``: its operations come from a generator seeded by the campaign's seed and the case's index."""
    tally.count(target)
    rng = random.Random(f"{target} {seed} {i}")
    check(
        tally,
        target,
        i,
        lambda: {"seed": str(seed), "case": str(i)},
        (),
        lambda: case(rng),
        hang_seconds=hang_seconds,
        label=lambda: target,
    )
