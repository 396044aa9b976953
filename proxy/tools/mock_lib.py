"""librdkafka for the embedded cluster (:mod:`proxy.tools.mock_cluster`): finding and loading it, its C signatures, and the handle that owns a mock cluster.

The ctypes side of :class:`~proxy.tools.mock_cluster.MockCluster`, apart from what the
cluster does: here nothing knows of topics or brokers, only how to call the
library without crashing the process (every pointer typed, every handle freed
in the right order).
"""

from __future__ import annotations

import ctypes
import glob
import os

_RD_KAFKA_PRODUCER = 0
_ERRSTR_SIZE = 512


class MockError(RuntimeError):
    """librdkafka refused a mock-cluster operation, or could not be loaded."""


def find_librdkafka() -> str:
    """Path of the librdkafka shared object bundled with the installed confluent-kafka wheel.

    The wheel's copy is required: Debian's librdkafka1 is far older and lacks
    most of the mock API.
    """
    try:
        import confluent_kafka
    except ImportError as e:  # the demo extra, not a dependency of serving
        raise MockError(
            f"confluent-kafka cannot be imported ({e}); the embedded cluster needs the librdkafka its wheel bundles: pip install 'kfan[demo]'"
        ) from e
    pkg_dir = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    libs_dir = os.path.join(os.path.dirname(pkg_dir), "confluent_kafka.libs")
    candidates = sorted(glob.glob(os.path.join(libs_dir, "librdkafka*.so*")))
    if not candidates:
        raise MockError(f"no librdkafka*.so* in {libs_dir}: is confluent-kafka installed from a manylinux wheel?")
    return candidates[0]


_lib: ctypes.CDLL | None = None


def load() -> ctypes.CDLL:
    """The library, loaded once per process, with the signatures of every function kfan calls."""
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


def open_cluster(lib: ctypes.CDLL, brokers: int) -> tuple[int, int]:
    """A new mock cluster of ``brokers`` brokers and the client handle that owns it: (handle, cluster)."""
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
    mc = lib.rd_kafka_mock_cluster_new(rk, brokers)
    if not mc:
        lib.rd_kafka_destroy(rk)
        raise MockError(f"rd_kafka_mock_cluster_new({brokers}) failed")
    return rk, mc


def broker_addresses(lib: ctypes.CDLL, mc: int, brokers: int) -> tuple[str, dict[int, tuple[str, int]]]:
    """The cluster's bootstrap string, and each broker's (host, port) by id."""
    raw = lib.rd_kafka_mock_cluster_bootstraps(mc)
    if not raw:
        raise MockError("rd_kafka_mock_cluster_bootstraps returned NULL")
    bootstrap = raw.decode()
    # Bootstraps lists brokers in id order, ids being 1..N.
    addresses = {}
    for broker_id, address in enumerate(bootstrap.split(","), start=1):
        host, _, port = address.rpartition(":")
        addresses[broker_id] = (host, int(port))
    if len(addresses) != brokers:
        raise MockError(f"expected {brokers} brokers in bootstraps {bootstrap!r}")
    return bootstrap, addresses


def close_cluster(lib: ctypes.CDLL, rk: int | None, mc: int | None) -> None:
    """Stop every broker of ``mc``, then free ``rk``: the cluster must go before the handle that owns it."""
    if mc is not None:
        lib.rd_kafka_mock_cluster_destroy(mc)
    if rk is not None:
        lib.rd_kafka_destroy(rk)


def error_text(lib: ctypes.CDLL, err: int) -> str:
    reason = lib.rd_kafka_err2str(err)
    return f"librdkafka error {err} ({reason.decode() if reason else 'unknown'})"
