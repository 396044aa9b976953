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

Threading and lifetime: the brokers run in librdkafka background threads
inside *this* process. The process must stay alive for as long as anything
talks to the cluster, and ``close()`` tears every broker down at once. The
control calls below are thread-safe on the librdkafka side (they post to the
cluster's own thread and wait), so they may be made from any Python thread.
"""

from __future__ import annotations

import ctypes
import glob
import os
from types import TracebackType

__all__ = ["COMPAT_CAPS", "MockCluster", "MockError", "find_librdkafka"]

_RD_KAFKA_PRODUCER = 0
_ERRSTR_SIZE = 512

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


class MockError(RuntimeError):
    """librdkafka refused a mock-cluster operation, or could not be loaded."""


def find_librdkafka() -> str:
    """Path of the librdkafka shared object bundled with the installed confluent-kafka wheel.

    The wheel's copy is required: Debian's librdkafka1 is far older and lacks
    most of the mock API.
    """
    try:
        import confluent_kafka
    except ImportError as e:  # pragma: no cover - dependency of the project
        raise MockError("confluent-kafka is not installed; the mock cluster needs its bundled librdkafka") from e
    pkg_dir = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    libs_dir = os.path.join(os.path.dirname(pkg_dir), "confluent_kafka.libs")
    candidates = sorted(glob.glob(os.path.join(libs_dir, "librdkafka*.so*")))
    if not candidates:
        raise MockError(f"no librdkafka*.so* in {libs_dir}: is confluent-kafka installed from a manylinux wheel?")
    return candidates[0]


_lib: ctypes.CDLL | None = None


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(find_librdkafka())
    vp, cint, i16, i32, size = ctypes.c_void_p, ctypes.c_int, ctypes.c_int16, ctypes.c_int32, ctypes.c_size_t
    cstr = ctypes.c_char_p
    # Every pointer is c_void_p: ctypes' default int return type would truncate
    # 64-bit addresses and crash later, far from the cause.
    signatures: dict[str, tuple[type | None, list[type]]] = {
        "rd_kafka_conf_new": (vp, []),
        "rd_kafka_conf_destroy": (None, [vp]),
        "rd_kafka_conf_set": (cint, [vp, cstr, cstr, cstr, size]),
        "rd_kafka_new": (vp, [cint, vp, cstr, size]),
        "rd_kafka_destroy": (None, [vp]),
        "rd_kafka_err2str": (cstr, [cint]),
        "rd_kafka_mock_cluster_new": (vp, [vp, cint]),
        "rd_kafka_mock_cluster_destroy": (None, [vp]),
        "rd_kafka_mock_cluster_bootstraps": (cstr, [vp]),
        "rd_kafka_mock_topic_create": (cint, [vp, cstr, cint, cint]),
        "rd_kafka_mock_partition_set_leader": (cint, [vp, cstr, i32, i32]),
        "rd_kafka_mock_partition_set_follower": (cint, [vp, cstr, i32, i32]),
        "rd_kafka_mock_partition_set_follower_wmarks": (cint, [vp, cstr, i32, ctypes.c_int64, ctypes.c_int64]),
        "rd_kafka_mock_broker_set_rack": (cint, [vp, i32, cstr]),
        "rd_kafka_mock_broker_set_down": (cint, [vp, i32]),
        "rd_kafka_mock_broker_set_up": (cint, [vp, i32]),
        "rd_kafka_mock_broker_set_rtt": (cint, [vp, i32, cint]),
        "rd_kafka_mock_push_request_errors_array": (None, [vp, i16, size, ctypes.POINTER(cint)]),
        "rd_kafka_mock_coordinator_set": (cint, [vp, cstr, cstr, i32]),
        "rd_kafka_mock_set_apiversion": (cint, [vp, i16, i16, i16]),
        "rd_kafka_mock_group_initial_rebalance_delay_ms": (None, [vp, i32]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    # Variadic: argtypes must stay unset (ctypes would reject the extra
    # arguments), so callers pass explicitly typed ctypes values instead.
    lib.rd_kafka_mock_broker_push_request_error_rtts.restype = cint
    _lib = lib
    return lib


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
        lib = self._lib = _load()

        conf = lib.rd_kafka_conf_new()
        errstr = ctypes.create_string_buffer(_ERRSTR_SIZE)
        # The handle exists only to own the cluster; it has no brokers of its
        # own, so its logs would be noise.
        if lib.rd_kafka_conf_set(conf, b"log_level", b"0", errstr, _ERRSTR_SIZE) != 0:
            lib.rd_kafka_conf_destroy(conf)
            raise MockError(f"rd_kafka_conf_set(log_level): {errstr.value.decode(errors='replace')}")
        rk = lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, _ERRSTR_SIZE)
        if not rk:
            # rd_kafka_new only takes ownership of conf when it succeeds.
            lib.rd_kafka_conf_destroy(conf)
            raise MockError(f"rd_kafka_new: {errstr.value.decode(errors='replace')}")
        self._rk = rk
        mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
        if not mc:
            self.close()
            raise MockError(f"rd_kafka_mock_cluster_new({brokers}) failed")
        self._mc = mc
        self.broker_count = brokers

        try:
            # The mock's default (3 s, like Kafka) makes every first join slow.
            lib.rd_kafka_mock_group_initial_rebalance_delay_ms(mc, group_initial_rebalance_delay_ms)
            if compat_caps:
                for api_key, max_version in COMPAT_CAPS.items():
                    self.set_apiversion(api_key, 0, max_version)
            raw = lib.rd_kafka_mock_cluster_bootstraps(mc)
            if not raw:
                raise MockError("rd_kafka_mock_cluster_bootstraps returned NULL")
            self.bootstrap = raw.decode()
            # Bootstraps lists brokers in id order, ids being 1..N.
            self.brokers = {}
            for broker_id, address in enumerate(self.bootstrap.split(","), start=1):
                host, _, port = address.rpartition(":")
                self.brokers[broker_id] = (host, int(port))
            if len(self.brokers) != brokers:
                raise MockError(f"expected {brokers} brokers in bootstraps {self.bootstrap!r}")
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
            reason = self._lib.rd_kafka_err2str(err)
            raise MockError(f"{what}: librdkafka error {err} ({reason.decode() if reason else 'unknown'})")

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
        # The cluster must go before the handle that owns it.
        mc, self._mc = self._mc, None
        if mc is not None:
            self._lib.rd_kafka_mock_cluster_destroy(mc)
        rk, self._rk = self._rk, None
        if rk is not None:
            self._lib.rd_kafka_destroy(rk)

    def __enter__(self) -> MockCluster:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else self.bootstrap
        return f"<MockCluster {self.broker_count if hasattr(self, 'broker_count') else '?'} brokers {state}>"
