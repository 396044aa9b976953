"""DescribeLogDirs: the log dirs of kfan's one node are every broker's log dirs together.

kfan's Metadata says its node holds every replica, so its log dirs are all
the brokers' ones: the request goes whole to every broker (:func:`.broadcast.plan`)
and their log dirs are listed in broker order. Kafka's Admin client (and
``kafka-log-dirs`` and ``kafka-reassign-partitions`` on top of it) reads that
list in two ways a plain concatenation does not survive:

- It keys one node's log dirs by path. Brokers configured alike report the
  same path (``/var/lib/kafka/data`` on each), and all but one of them would
  vanish with their replicas. A path reported by more than one broker is
  therefore told apart with a suffix, ``#1``, ``#2``, ... in broker order
  (an ordinal, not the broker's id, which clients of kfan never see).
- It ignores the top-level error code whenever any log dir is listed, so a
  broker that did not answer cannot be reported there without the list
  looking whole. It is reported as a broker reports a disk it cannot read:
  a log dir with ``KAFKA_STORAGE_ERROR`` and no replicas (named
  :data:`UNREACHABLE`), which the Admin client shows as an offline log dir
  and which every version of the answer can carry.
"""

from __future__ import annotations

from collections import Counter

from ..kafka import errors
from ..kafka.schema import Struct, encode_body, response_spec
from .answers import decode_answers, fold_top_level
from .plan import Answers, Forward, Reply

UNREACHABLE = "(unreachable broker)"


def merge(plan: Forward[list[int]], answers: Answers) -> Reply:
    hdr = plan.header
    array = plan.route.broadcast_array
    assert array is not None
    spec = response_spec(hdr.api_key, hdr.api_version)
    result_spec = spec.field(array).struct
    assert result_spec is not None
    decoded = decode_answers(hdr, answers, errors.KAFKA_STORAGE_ERROR)
    results: list[Struct] = []
    for broker in plan.state:
        body = decoded.bodies.get(broker)
        if body is None:
            results.append({**result_spec.blank(), "error_code": errors.KAFKA_STORAGE_ERROR, "log_dir": UNREACHABLE, "topics": []})
        else:
            results.extend(body[array])
    # A broker's own top-level error (an authorization failure) still reaches
    # the client; a broker that failed is in the list instead.
    throttle, error = fold_top_level(decoded.bodies.values())
    out = spec.blank()
    out["throttle_time"] = throttle
    if "error_code" in out:
        out["error_code"] = error
    out[array] = distinct_names(results)
    return Reply(encode_body(spec, out))


def distinct_names(results: list[Struct]) -> list[Struct]:
    """``results`` with every log dir named by more than one entry suffixed ``#1``, ``#2``, ... in order."""
    counts = Counter(r["log_dir"] for r in results)
    taken = set(counts)  # a suffixed name must not be one a broker reported as is
    seen: Counter[str] = Counter()
    out = []
    for r in results:
        name = r["log_dir"]
        if counts[name] > 1:
            seen[name] += 1
            while f"{name}#{seen[name]}" in taken:
                seen[name] += 1
            taken.add(f"{name}#{seen[name]}")
            r = {**r, "log_dir": f"{name}#{seen[name]}"}
        out.append(r)
    return out
