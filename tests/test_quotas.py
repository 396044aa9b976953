"""Client quotas in the core: Kafka's entity precedence, the token buckets and their throttle times, the quota
file's document, the bounds on what kfan keeps; and the throttle time set in encoded answers (KIP-219).

The end-to-end checks against Apache Kafka's clients are tests/test_quotas_kafka.py.
"""

from __future__ import annotations

import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.quotas import DEFAULT, ClientQuotas, QuotaConfig, QuotaEntity, QuotaFileError, QuotaType, parse_quotas
from proxy.core.throttle import client_throttles, with_throttle
from proxy.kafka import apis
from proxy.kafka.schema import decode_body, encode_body, response_spec

P, F, R = QuotaType.PRODUCE, QuotaType.FETCH, QuotaType.REQUEST
MB = 1024 * 1024

# Every entity Kafka knows, each with a limit that names it.
ALL_ENTITIES = {
    QuotaEntity("alice", "app"): 1.0,
    QuotaEntity("alice", DEFAULT): 2.0,
    QuotaEntity("alice", None): 3.0,
    QuotaEntity(DEFAULT, "app"): 4.0,
    QuotaEntity(DEFAULT, DEFAULT): 5.0,
    QuotaEntity(DEFAULT, None): 6.0,
    QuotaEntity(None, "app"): 7.0,
    QuotaEntity(None, DEFAULT): 8.0,
}


def _config(entities: dict[QuotaEntity, float], kind: QuotaType = P) -> QuotaConfig:
    return QuotaConfig({kind: entities})


@pytest.mark.parametrize(
    ("removed", "expected"),
    [
        # Kafka's order: each entity wins while every more specific one is absent.
        (0, (1.0, ("alice", "app"))),
        (1, (2.0, ("alice", "app"))),  # <user, default client>: a rate per client id of the user
        (2, (3.0, ("alice", ""))),  # <user>: one rate for all the user's client ids
        (3, (4.0, ("alice", "app"))),
        (4, (5.0, ("alice", "app"))),
        (5, (6.0, ("alice", ""))),
        (6, (7.0, ("", "app"))),
        (7, (8.0, ("", "app"))),
    ],
)
def test_the_most_specific_entity_sets_the_quota_in_kafkas_order(removed: int, expected: tuple[float, tuple[str, str]]) -> None:
    entities = dict(list(ALL_ENTITIES.items())[removed:])
    resolved = _config(entities).resolve(P, "alice", "app")
    assert resolved is not None
    bucket, limit = resolved
    assert (limit, bucket) == expected


def test_a_quota_type_resolves_on_its_own_and_unmatched_clients_have_none() -> None:
    config = QuotaConfig({P: {QuotaEntity("alice", None): 10.0}, F: {QuotaEntity(None, DEFAULT): 20.0}})
    assert config.resolve(P, "alice", "x") == (("alice", ""), 10.0)
    assert config.resolve(P, "bob", "x") is None  # no produce quota names bob, nor a default
    assert config.resolve(F, "alice", "x") == (("", "x"), 20.0)  # the fetch quota does: its own precedence
    assert config.resolve(R, "alice", "x") is None


def test_other_users_and_client_ids_match_neither_named_entity() -> None:
    config = _config({QuotaEntity("alice", "app"): 1.0, QuotaEntity("alice", None): 2.0, QuotaEntity(None, "app"): 3.0})
    assert config.resolve(P, "bob", "app") == (("", "app"), 3.0)
    assert config.resolve(P, "alice", "other") == (("alice", ""), 2.0)
    assert config.resolve(P, "bob", "other") is None


def test_a_new_client_may_use_its_burst_then_waits_back_to_its_quota() -> None:
    quotas = ClientQuotas(QuotaConfig({P: {QuotaEntity("alice", None): float(MB)}}, burst_seconds=2.0))
    first = quotas.record(P, "alice", "app", 2 * MB, 0.0)
    assert first is not None and first.throttle == 0.0  # the burst: two seconds of the quota
    second = quotas.record(P, "alice", "app", MB, 0.5)
    assert second is not None
    # 0.5 s refilled half a second's worth: half a megabyte short, half a second to wait (the time back to the quota).
    assert second.throttle == pytest.approx(0.5)
    assert second.bucket == ("alice", "") and second.limit == MB
    # Waiting it out (and no more) is enough for the next request of the refill's size.
    third = quotas.record(P, "alice", "app", MB / 10, 1.1)
    assert third is not None and third.throttle == pytest.approx(0.0, abs=1e-9)


def test_a_bucket_never_holds_more_than_its_burst() -> None:
    quotas = ClientQuotas(QuotaConfig({P: {QuotaEntity(None, DEFAULT): 100.0}}, burst_seconds=1.0))
    quotas.record(P, "u", "c", 0.0, 0.0)
    usage = quotas.record(P, "u", "c", 150.0, 3600.0)  # an hour idle fills it to 100, not 360,000
    assert usage is not None and usage.throttle == pytest.approx(0.5)


def test_a_request_quota_throttle_is_bounded_as_kafka_bounds_it() -> None:
    quotas = ClientQuotas(_config({QuotaEntity(None, DEFAULT): 1.0}, R))
    usage = quotas.record(R, "u", "c", 10_000.0, 0.0, max_throttle=1.0)
    assert usage is not None and usage.throttle == 1.0
    unbounded = ClientQuotas(_config({QuotaEntity(None, DEFAULT): 1.0}, R)).record(R, "u", "c", 10_000.0, 0.0)
    assert unbounded is not None and unbounded.throttle > 1.0


def test_clients_sharing_a_user_quota_share_one_rate() -> None:
    quotas = ClientQuotas(_config({QuotaEntity("alice", None): float(MB), QuotaEntity(DEFAULT, None): float(MB)}))
    assert quotas.record(P, "alice", "a", MB, 0.0).throttle == 0.0  # type: ignore[union-attr]
    assert quotas.record(P, "alice", "b", MB, 0.0).throttle > 0  # type: ignore[union-attr]
    # Two other users each have their own default rate, whatever their client ids.
    assert quotas.record(P, "bob", "a", MB, 0.0).throttle == 0.0  # type: ignore[union-attr]
    assert quotas.record(P, "carol", "a", MB, 0.0).throttle == 0.0  # type: ignore[union-attr]


def test_fetch_cap_is_the_burst() -> None:
    quotas = ClientQuotas(QuotaConfig({F: {QuotaEntity(None, DEFAULT): 1000.0}}, burst_seconds=2.0))
    assert quotas.burst(F, "u", "c") == 2000.0
    assert quotas.burst(P, "u", "c") is None


def test_rates_kept_are_bounded_least_recently_used_first_and_expire_when_idle() -> None:
    quotas = ClientQuotas(_config({QuotaEntity(None, DEFAULT): 100.0}), max_buckets=3, expire_after=60.0)
    for i in range(5):
        quotas.record(P, "u", f"c{i}", 1.0, float(i))
    assert len(quotas) == 3
    quotas.record(P, "u", "c9", 1.0, 1000.0)  # the others were idle for over 60 s
    assert len(quotas) == 1


def test_a_new_configuration_keeps_the_rates_measured() -> None:
    quotas = ClientQuotas(_config({QuotaEntity(None, DEFAULT): float(MB)}))
    quotas.record(P, "u", "c", 3 * MB, 0.0)  # 2 MB owed
    quotas.config = _config({QuotaEntity(None, DEFAULT): float(MB) / 2})
    usage = quotas.record(P, "u", "c", 0, 1.0)
    # What is owed stays owed, repaid at the new quota: 2 MB less the 0.5 MB of one second, at 0.5 MB/s.
    assert usage is not None and usage.throttle == pytest.approx(3.0)


@settings(max_examples=40, deadline=None)
@given(
    limit=st.floats(1_000, 10_000_000),
    fractions=st.lists(st.floats(0.02, 5.0), min_size=1, max_size=8),
    seconds=st.integers(30, 90),
)
def test_a_client_that_waits_out_its_throttle_gets_the_quota(limit: float, fractions: list[float], seconds: int) -> None:
    """Whatever its request sizes, a client sending as fast as allowed gets its quota over time: at most the quota,
    its burst and one request; at least the quota less one request and its own pace."""
    quotas = ClientQuotas(_config({QuotaEntity(None, DEFAULT): limit}))
    sizes = [limit * f for f in fractions]  # at its own pace (10 ms a request) it would send at twice the quota or more
    now, sent, i = 0.0, 0.0, 0
    while now < seconds:
        size = sizes[i % len(sizes)]
        i += 1
        usage = quotas.record(P, "u", "c", size, now)
        assert usage is not None
        sent += size
        now += max(usage.throttle, 0.01)
    biggest = max(sizes)
    assert sent <= limit * (now + 1.0) + biggest
    assert sent >= limit * (now - 0.01) - biggest


def _quota_doc(text: str) -> QuotaConfig:
    return parse_quotas(tomllib.loads(text))


def test_the_quota_file() -> None:
    config = _quota_doc(
        """
        burst_seconds = 2
        [[quotas]]
        user = "alice"
        producer_byte_rate = 1048576
        consumer_byte_rate = 2097152
        [[quotas]]
        user = "<default>"
        client-id = "<default>"
        request_percentage = 50
        [[quotas]]
        client_id = "reports"
        consumer_byte_rate = 1000
        """
    )
    assert config.burst_seconds == 2.0 and len(config) == 4
    assert config.limits[P] == {QuotaEntity("alice", None): 1048576.0}
    assert config.limits[F] == {QuotaEntity("alice", None): 2097152.0, QuotaEntity(None, "reports"): 1000.0}
    assert config.limits[R] == {QuotaEntity(DEFAULT, DEFAULT): 50.0}
    assert not _quota_doc("")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("quota = 1", "unknown keys"),
        ("[[quotas]]\nproducer_byte_rate = 1", "name a user, a client-id, or both"),
        ('[[quotas]]\nuser = "a"', "sets no quota"),
        ('[[quotas]]\nuser = "a"\nproducer_byte_rate = 0', "must be a positive number"),
        ('[[quotas]]\nuser = "a"\nproducer_byte_rate = "fast"', "must be a positive number"),
        ('[[quotas]]\nuser = "a"\nbyte_rate = 1', "unknown keys"),
        ("[[quotas]]\nuser = 1\nproducer_byte_rate = 1", "user must be a string"),
        ('[[quotas]]\nuser = "a"\nproducer_byte_rate = 1\n[[quotas]]\nuser = "a"\nproducer_byte_rate = 2', "set twice"),
        ("burst_seconds = 0", "burst_seconds"),
        ("window_samples = 11", "unknown keys"),
        ('quotas = "x"', "array of tables"),
    ],
)
def test_an_invalid_quota_file_says_what_is_wrong(text: str, problem: str) -> None:
    with pytest.raises(QuotaFileError, match=problem):
        _quota_doc(text)


def test_which_clients_throttle_themselves_is_kafkas_table() -> None:
    assert client_throttles(apis.PRODUCE, 6) and not client_throttles(apis.PRODUCE, 5)
    assert client_throttles(apis.FETCH, 8) and not client_throttles(apis.FETCH, 7)
    assert client_throttles(apis.METADATA, 6) and not client_throttles(apis.METADATA, 5)
    assert not client_throttles(apis.SHARE_FETCH, 1)  # not in Kafka's table: the answer waits instead


def _encoded(api_key: int, version: int, body: dict[str, object]) -> list[bytes | memoryview]:
    spec = response_spec(api_key, version)
    return list(encode_body(spec, {**spec.blank(), **body}))


def _throttle_of(api_key: int, version: int, parts: list[bytes | memoryview]) -> int:
    return int(decode_body(response_spec(api_key, version), b"".join(bytes(p) for p in parts))["throttle_time"])


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (apis.FETCH, 12),
        (apis.FETCH, 17),
        (apis.PRODUCE, 9),  # after the responses: decoded
        (apis.PRODUCE, 3),
        (apis.API_VERSIONS, 3),  # after error_code and api_keys
        (apis.OFFSET_DELETE, 0),  # after error_code
        (apis.METADATA, 12),
        (apis.RENEW_DELEGATION_TOKEN, 2),
    ],
)
def test_the_longer_throttle_is_set_wherever_the_field_sits(api_key: int, version: int) -> None:
    body = _encoded(api_key, version, {"throttle_time": 40})
    assert _throttle_of(api_key, version, with_throttle(api_key, version, body, 250)) == 250
    # A broker's own longer throttle stays.
    assert _throttle_of(api_key, version, with_throttle(api_key, version, body, 10)) == 40
    # Everything else is as it was.
    assert decode_body(response_spec(api_key, version), b"".join(bytes(p) for p in with_throttle(api_key, version, body, 250))) == {
        **decode_body(response_spec(api_key, version), b"".join(bytes(p) for p in body)),
        "throttle_time": 250,
    }


def test_large_parts_are_sliced_not_copied_and_versions_without_the_field_are_left_alone() -> None:
    records = memoryview(bytes(1000))
    body: list[bytes | memoryview] = [b"\x00\x00", b"\x00\x00rest", records]
    patched = with_throttle(apis.FETCH, 12, body, 7)
    assert bytes(patched[0]) == b"\x00\x00\x00\x07" and patched[-1] is records
    assert b"".join(bytes(p) for p in patched) == b"\x00\x00\x00\x07rest" + bytes(1000)
    fetch_v0 = [b"\x00\x00\x00\x00"]
    assert with_throttle(apis.FETCH, 0, fetch_v0, 100) is fetch_v0
