"""The request path's metric updates, added up and flushed in batches (proxy.runtime.metrics): the same samples
as updating the metrics one at a time."""

from __future__ import annotations

import math

import trio
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from proxy.runtime import metrics

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
values = st.floats(min_value=0, max_value=100, allow_nan=False) | st.sampled_from(BUCKETS)
labels = st.sampled_from([(0, 9), (1, 12), (0, "-")])


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples if not s.name.endswith("_created")
    }


def _pair(kind: type, name: str, *args: object, **kw: object) -> tuple[object, object, CollectorRegistry, CollectorRegistry]:
    one, batched = CollectorRegistry(), CollectorRegistry()
    return kind(name, "h", *args, registry=one, **kw), kind(name, "h", *args, registry=batched, **kw), one, batched


@given(st.lists(st.tuples(labels, values), max_size=60))
def test_histogram_sums_equal_observing_one_at_a_time(observations: list[tuple[tuple[object, object], float]]) -> None:
    direct, batched, one, other = _pair(Histogram, "kfan_test_seconds", ["a", "b"], buckets=BUCKETS)
    for key, v in observations:
        direct.labels(*map(str, key)).observe(v)
        metrics.observe(batched, key, v)
    metrics.flush()
    got, want = _samples(other), _samples(one)
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert math.isclose(got[k], v, rel_tol=1e-9, abs_tol=1e-9), k


@given(st.lists(st.tuples(labels, st.integers(min_value=-5, max_value=5)), max_size=60))
def test_counter_and_gauge_sums_equal_updating_one_at_a_time(updates: list[tuple[tuple[object, object], int]]) -> None:
    counter, batched_counter, c1, c2 = _pair(Counter, "kfan_test_things", ["a", "b"])
    gauge, batched_gauge, g1, g2 = _pair(Gauge, "kfan_test_held", [])
    for key, n in updates:
        counter.labels(*map(str, key)).inc(abs(n))
        metrics.count(batched_counter, key, abs(n))
        gauge.inc(n)
        metrics.count(batched_gauge, (), n)
    metrics.flush()
    assert _samples(c2) == _samples(c1)
    assert _samples(g2) == _samples(g1)


def test_nothing_is_counted_before_a_flush_and_flush_forever_flushes_when_cancelled() -> None:
    counter, batched, one, other = _pair(Counter, "kfan_test_requests", [])
    metrics.count(batched, (), 3)
    assert _samples(other)[("kfan_test_requests_total", ())] == 0
    metrics.flush()
    assert _samples(other)[("kfan_test_requests_total", ())] == 3

    async def main() -> None:
        with trio.move_on_after(0.05):
            metrics.count(batched, (), 2)
            await metrics.flush_forever(every=3600)

    trio.run(main)
    assert _samples(other)[("kfan_test_requests_total", ())] == 5
