"""What ``kfan bench`` measures against: the brokers and the topic, set up before and cleaned up after.

Two kinds: the embedded cluster (librdkafka's mock, three brokers in this
process, topic created with leaders spread round-robin), or a real cluster
given by ``--bootstrap`` (topic created with the admin API and deleted at the
end, or an existing one given with ``--topic``). This module does not start
kfan and measures nothing.

Brokers that do not serve CreateTopics (librdkafka's mock run as
``kfan cluster``) get their topic auto-created by a Metadata request instead;
it then has the partition count the brokers choose, which the report states.
"""

from __future__ import annotations

import socket
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from proxy.kafka import apis
from proxy.kafka.frames import MIN_RESPONSE_FRAME, FrameReader, frame
from proxy.kafka.headers import decode_response, encode_request_header
from proxy.kafka.wire import Malformed
from proxy.tools.bench.errors import BenchError

EMBEDDED_BROKERS = 3
TOPIC_READY_TIMEOUT_S = 30.0
ADMIN_TIMEOUT_S = 30.0


@dataclass
class Target:
    kind: str  # "embedded" or "external"
    bootstrap: str
    brokers: int
    topic: str
    partitions: int
    topic_note: str  # how the topic came to be, and what happens to it at the end


def new_topic_name() -> str:
    return f"kfan-bench-{uuid.uuid4().hex[:8]}"


@contextmanager
def embedded(partitions: int) -> Iterator[Target]:
    """The mock cluster in this process, with a fresh topic of ``partitions`` partitions; closed on exit."""
    from proxy.tools.mock_cluster import MockCluster

    with MockCluster(EMBEDDED_BROKERS) as mock:
        topic = new_topic_name()
        mock.create_topic(topic, partitions, replication_factor=EMBEDDED_BROKERS)
        wait_for_topic(mock.bootstrap, topic, partitions)
        yield Target("embedded", mock.bootstrap, EMBEDDED_BROKERS, topic, partitions, "created, leaders round-robin")


@contextmanager
def external(bootstrap: str, partitions: int, topic: str | None) -> Iterator[Target]:
    """A real cluster: ``topic`` as it is, or a fresh one created (and deleted on exit) with ``partitions`` partitions."""
    # First, and fast: a cluster that is not there fails here in a second, not at an admin client's timeout.
    served = api_keys(bootstrap)
    # log_level 5: not the informational lines the admin client prints as it is destroyed.
    admin = AdminClient({"bootstrap.servers": bootstrap, "log.connection.close": False, "log_level": 5})
    try:
        brokers = len(admin.list_topics(timeout=ADMIN_TIMEOUT_S).brokers)
    except KafkaException as e:
        raise BenchError(f"cannot reach the brokers at {bootstrap}: {e}") from None
    if topic is not None:
        found = wait_for_topic(bootstrap, topic, None, auto_create=False, must_exist=True)
        yield Target("external", bootstrap, brokers, topic, found, "given with --topic, left as it was")
        return
    name = new_topic_name()
    if apis.CREATE_TOPICS in served:
        replication = min(3, brokers)
        future = admin.create_topics([NewTopic(name, partitions, replication)], request_timeout=ADMIN_TIMEOUT_S)[name]
        try:
            future.result(ADMIN_TIMEOUT_S)
        except KafkaException as e:
            raise BenchError(f"cannot create topic {name} ({partitions} partitions, replication {replication}): {e}") from None
        found = wait_for_topic(bootstrap, name, partitions, auto_create=False)
        note = f"created (replication {replication}), deleted at the end"
    else:
        # librdkafka's mock cluster has no CreateTopics, but creates a topic a
        # Metadata request names (with its own default partition count).
        found = wait_for_topic(bootstrap, name, None, auto_create=True)
        note = "auto-created by a Metadata request: the brokers do not serve CreateTopics, so they chose the partition count"
    deletable = apis.DELETE_TOPICS in served
    if not deletable:
        note += "; left in place (the brokers do not serve DeleteTopics)"
    try:
        yield Target("external", bootstrap, brokers, name, found, note)
    finally:
        if deletable:
            future = admin.delete_topics([name], request_timeout=ADMIN_TIMEOUT_S)[name]
            try:
                future.result(ADMIN_TIMEOUT_S)
            except KafkaException as e:
                # Not a failed measurement: say so and go on.
                print(f"kfan bench: could not delete topic {name}: {e}", file=sys.stderr, flush=True)


def wait_for_topic(bootstrap: str, topic: str, partitions: int | None, auto_create: bool = False, must_exist: bool = False) -> int:
    """Wait until ``topic`` has ``partitions`` partitions (any number when None), each with a leader; its partition count.

    ``auto_create``: ask with Metadata requests that allow the brokers to create it. ``must_exist``:
    an unknown topic fails at once (one just created may take a moment to be known).
    """
    producer = Producer({"bootstrap.servers": bootstrap, "allow.auto.create.topics": auto_create, "log.connection.close": False})
    deadline = time.monotonic() + TOPIC_READY_TIMEOUT_S
    state = "not in the metadata"
    while time.monotonic() < deadline:
        try:
            meta = producer.list_topics(topic, timeout=5).topics.get(topic)
        except KafkaException as e:
            meta, state = None, str(e)
        if meta is not None and meta.error is None and meta.partitions:
            count = len(meta.partitions)
            leaderless = [p for p, pm in meta.partitions.items() if pm.leader < 0]
            if not leaderless and (partitions is None or count == partitions):
                return count
            state = f"{count} partitions, {len(leaderless)} without a leader"
        elif meta is not None and meta.error is not None:
            if must_exist and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise BenchError(f"topic {topic} does not exist at {bootstrap}")
            state = str(meta.error)
        time.sleep(0.2)
    raise BenchError(f"topic {topic} not ready within {TOPIC_READY_TIMEOUT_S:.0f} s: {state}")


def api_keys(bootstrap: str, timeout: float = 10.0) -> set[int]:
    """The API keys the first reachable bootstrap broker advertises (ApiVersions v0, which every broker answers)."""
    last: Exception | None = None
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=timeout) as sock:
                sock.sendall(frame([encode_request_header(apis.API_VERSIONS, 0, 1, "kfan-bench")]))
                reader = FrameReader(min_frame_bytes=MIN_RESPONSE_FRAME)
                while (payload := reader.next_frame()) is None:
                    data = sock.recv(65536)
                    if not data:
                        raise OSError("connection closed")
                    reader.feed(data)
            answer = decode_response(payload, apis.API_VERSIONS, 0)
            if answer["error_code"]:
                raise BenchError(f"{address} answered ApiVersions with error {answer['error_code']}")
            return {key["api_key"] for key in answer["api_keys"]}
        except (OSError, ValueError, Malformed) as e:  # ValueError: not HOST:PORT
            last = e
    raise BenchError(f"no broker at {bootstrap} answered (ApiVersions): {last}")
