"""The embedded multi-broker cluster: librdkafka's mock cluster driven through ctypes.

librdkafka (shipped inside the confluent-kafka wheel) contains a real
multi-broker implementation of the Kafka protocol that Confluent tests its
clients with: one TCP listener per broker on 127.0.0.1, partitions led by
different brokers, consumer groups, transactions. It is the only multi-broker
backend available without a JVM; it powers ``kfan demo``, ``kfan cluster`` and
the integration tests.

This module only starts, shapes and stops that cluster (topics, leaders,
broker up/down, latency, injected errors, coordinators, API version caps). It
does not speak the Kafka protocol itself and knows nothing about the proxy.
Loading librdkafka, its C signatures and the handle that owns the cluster
are in :mod:`proxy.tools.mock_lib`.

Threading and lifetime: the brokers run in librdkafka background threads
inside *this* process. The process must stay alive for as long as anything
talks to the cluster, and ``close()`` tears every broker down at once. The
control calls below are thread-safe on the librdkafka side (they post to the
cluster's own thread and wait), so they may be made from any Python thread.
"""

from __future__ import annotations

import ctypes
from types import TracebackType

from proxy.tools.mock_lib import MockError, broker_addresses, close_cluster, error_text, find_librdkafka, load, open_cluster

__all__ = ["COMPAT_CAPS", "MockCluster", "MockError", "find_librdkafka"]

# Highest versions the 2.16 mock handles correctly: it misparses JoinGroup v6,
# SyncGroup v4 and LeaveGroup v3, and Heartbeat is capped with them (a group
# member must speak one generation of the group protocol across the four). Its ApiVersions reply to a v3+
# request is malformed (the compact array count is off by one); 2.16 already
# advertises ApiVersions 0-2, so that cap only guards builds that advertise more.
COMPAT_CAPS: dict[int, int] = {
    18: 2,  # ApiVersions
    11: 5,  # JoinGroup
    14: 3,  # SyncGroup
    12: 3,  # Heartbeat
    13: 2,  # LeaveGroup
}


class MockCluster:
    """N brokers (ids 1..N) on 127.0.0.1 ports, with fault injection for tests.

    Use as a context manager, or call ``close()``; either is idempotent.
    """

    bootstrap: str
    brokers: dict[int, tuple[str, int]]

    def __init__(self, brokers: int = 3, *, compat_caps: bool = True, group_initial_rebalance_delay_ms: int = 0) -> None:
        if brokers < 1:
            raise ValueError(f"a cluster needs at least one broker, got {brokers}")
        self._mc: int | None = None
        self._rk: int | None = None
        lib = self._lib = load()
        self._rk, mc = open_cluster(lib, brokers)
        self._mc = mc
        self.broker_count = brokers

        try:
            # The mock's default (3 s, like Kafka) makes every first join slow.
            lib.rd_kafka_mock_group_initial_rebalance_delay_ms(mc, group_initial_rebalance_delay_ms)
            if compat_caps:
                for api_key, max_version in COMPAT_CAPS.items():
                    self.set_apiversion(api_key, 0, max_version)
            self.bootstrap, self.brokers = broker_addresses(lib, mc, brokers)
        except BaseException:
            self.close()
            raise

    # -- helpers -------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._mc is None

    def _cluster(self) -> int:
        # Calling into a destroyed cluster would be a use-after-free crash.
        if self._mc is None:
            raise MockError("mock cluster is closed")
        return self._mc

    def _check(self, err: int, what: str) -> None:
        if err != 0:
            raise MockError(f"{what}: {error_text(self._lib, err)}")

    # -- topics and leaders --------------------------------------------------

    def create_topic(self, name: str, partitions: int, replication_factor: int = 1, leaders: list[int] | None = None) -> None:
        """Create a topic and place its leaders.

        Leaders default to round-robin, partition p led by broker (p % N) + 1,
        because the mock's own placement is random and tests need to know
        which broker leads what.
        """
        if leaders is None:
            leaders = [p % self.broker_count + 1 for p in range(partitions)]
        elif len(leaders) != partitions:
            raise ValueError(f"{len(leaders)} leaders given for {partitions} partitions")
        # Checked up front: the mock would create the topic and only then
        # reject the leader, leaving a half-placed topic behind.
        unknown = sorted({b for b in leaders if b not in self.brokers})
        if unknown:
            raise ValueError(f"leaders {unknown} are not brokers of this cluster (ids 1..{self.broker_count})")
        err = self._lib.rd_kafka_mock_topic_create(self._cluster(), name.encode(), partitions, replication_factor)
        self._check(err, f"create_topic({name!r}, {partitions}, {replication_factor})")
        for partition, broker in enumerate(leaders):
            self.set_leader(name, partition, broker)

    def set_leader(self, topic: str, partition: int, broker: int) -> None:
        """Make ``broker`` the leader of topic/partition; -1 leaves the partition leaderless.

        Clients learn of the move from Metadata or NOT_LEADER errors. Beware:
        the mock auto-creates an unknown topic here (with partition + 1
        partitions) instead of failing.
        """
        err = self._lib.rd_kafka_mock_partition_set_leader(self._cluster(), topic.encode(), partition, broker)
        self._check(err, f"set_leader({topic!r}, {partition}, {broker})")

    def set_follower(self, topic: str, partition: int, broker: int) -> None:
        """Make ``broker`` the preferred read replica the partition's leader names (KIP-392); -1: none.

        The mock's leader then names it in every Fetch v11+ it answers, whatever
        the request's rack_id, and returns no records; the follower serves the
        partition's log between its own watermarks. It keeps naming a follower
        that is down (Kafka's leader stops naming a replica that left the
        cluster or the ISR): set -1 to play that part.
        """
        err = self._lib.rd_kafka_mock_partition_set_follower(self._cluster(), topic.encode(), partition, broker)
        self._check(err, f"set_follower({topic!r}, {partition}, {broker})")

    def set_follower_wmarks(self, topic: str, partition: int, low: int, high: int) -> None:
        """The follower's log start and high watermark (a lagging follower); -1 follows the leader's.

        A Fetch to the follower for an offset past ``high`` (and short of the
        leader's end) answers OFFSET_OUT_OF_RANGE.
        """
        err = self._lib.rd_kafka_mock_partition_set_follower_wmarks(self._cluster(), topic.encode(), partition, low, high)
        self._check(err, f"set_follower_wmarks({topic!r}, {partition}, {low}, {high})")

    # -- brokers -------------------------------------------------------------

    def set_rack(self, broker: int, rack: str) -> None:
        """The broker's rack (broker.rack), as Metadata reports it."""
        self._check(self._lib.rd_kafka_mock_broker_set_rack(self._cluster(), broker, rack.encode()), f"set_rack({broker}, {rack!r})")

    def broker_down(self, broker: int) -> None:
        """Close the broker's connections and refuse new ones; its leaderships do not move."""
        self._check(self._lib.rd_kafka_mock_broker_set_down(self._cluster(), broker), f"broker_down({broker})")

    def broker_up(self, broker: int) -> None:
        self._check(self._lib.rd_kafka_mock_broker_set_up(self._cluster(), broker), f"broker_up({broker})")

    def set_rtt(self, broker: int, ms: int) -> None:
        """Delay every response of ``broker`` by ``ms`` milliseconds (0 removes the delay)."""
        self._check(self._lib.rd_kafka_mock_broker_set_rtt(self._cluster(), broker, ms), f"set_rtt({broker}, {ms})")

    # -- injected errors -----------------------------------------------------

    def push_request_errors(self, api_key: int, errors: list[int]) -> None:
        """The next len(errors) requests of ``api_key``, on any broker, fail with these codes in order."""
        array = (ctypes.c_int * len(errors))(*errors)
        self._lib.rd_kafka_mock_push_request_errors_array(self._cluster(), api_key, len(errors), array)

    def push_broker_request_errors(self, broker: int, api_key: int, errors_and_rtts: list[tuple[int, int]]) -> None:
        """The next requests of ``api_key`` to ``broker`` answer these (error code, delay ms) pairs in order.

        Broker-level errors take precedence over cluster-level ones.
        """
        # Without argtypes ctypes would pass Python ints as C int and the fixed
        # int16/size_t parameters would rely on luck; type each one. The C side
        # reads each pair with va_arg(rd_kafka_resp_err_t) and va_arg(int).
        # ctypes passes at most 1024 arguments: push long lists in chunks (they queue up in order).
        for start in range(0, len(errors_and_rtts), 500):
            chunk = errors_and_rtts[start : start + 500]
            pairs: list[ctypes.c_int] = []
            for err, rtt in chunk:
                pairs += [ctypes.c_int(err), ctypes.c_int(rtt)]
            rc = self._lib.rd_kafka_mock_broker_push_request_error_rtts(
                ctypes.c_void_p(self._cluster()),
                ctypes.c_int32(broker),
                ctypes.c_int16(api_key),
                ctypes.c_size_t(len(chunk)),
                *pairs,
            )
            self._check(rc, f"push_broker_request_errors({broker}, {api_key})")

    # -- coordinators and versions -------------------------------------------

    def set_coordinator(self, kind: str, key: str, broker: int) -> None:
        """Make ``broker`` the coordinator of group ``key`` (kind "group") or transactional id ``key`` ("transaction").

        The mock accepts any broker id here, even one that does not exist.
        """
        if kind not in ("group", "transaction"):
            raise ValueError(f"coordinator kind must be 'group' or 'transaction', not {kind!r}")
        err = self._lib.rd_kafka_mock_coordinator_set(self._cluster(), kind.encode(), key.encode(), broker)
        self._check(err, f"set_coordinator({kind!r}, {key!r}, {broker})")

    def set_apiversion(self, api_key: int, min_version: int, max_version: int) -> None:
        """Advertise and accept only ``min_version..max_version`` of an API; (-1, -1) disables it."""
        err = self._lib.rd_kafka_mock_set_apiversion(self._cluster(), api_key, min_version, max_version)
        self._check(err, f"set_apiversion({api_key}, {min_version}, {max_version})")

    def set_broker_address(self, broker: int, host: str, port: int) -> None:
        """Advertise ``broker`` at ``host:port`` in Metadata (it still listens on 127.0.0.1 only)."""
        self._lib.rd_kafka_mock_broker_set_host_port(
            ctypes.c_void_p(self._cluster()), ctypes.c_int32(broker), host.encode(), ctypes.c_int(port)
        )

    # -- lifetime ------------------------------------------------------------

    def close(self) -> None:
        """Stop every broker, then free the owning handle. Safe to call twice."""
        rk, mc = self._rk, self._mc
        self._rk = self._mc = None
        close_cluster(self._lib, rk, mc)

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.bootstrap
        return f"<MockCluster {self.broker_count if hasattr(self, 'broker_count') else '?'} brokers {state}>"
