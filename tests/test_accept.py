"""Out of descriptors, kfan's accept loop backs off and logs once per interval, then serves again.

Two levels: the loop itself against a listener double whose accept() fails
with EMFILE as long as the test says (on trio's virtual clock), and the real
kfan process whose descriptor limit the test lowers under it (prlimit) after
it started: the log is not flooded, a request of a protocol version no client
used before is still served (its schema was loaded at start, not on first
use, which needs descriptors), and once the limit is raised again kfan
accepts and serves the connections that waited.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import resource
import time
from collections.abc import Iterator
from typing import Any

import pytest
import trio
import trio.testing
from kio.schema.api_versions.v1.request import ApiVersionsRequest as ApiVersionsV1
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsV3

from backends import schemas
from proxy.kafka import apis, schema
from proxy.kafka.preload import preload
from proxy.server import accept
from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, kfan_on
from tests.support.rawclient import RawClient
from tests.support.waiting import wait_for, wait_for_async


class FailingListener(trio.abc.Listener[Any]):
    """accept() fails with ``errno`` while ``failing`` is set, then hands out memory streams."""

    def __init__(self, error: int = errno.EMFILE) -> None:
        self.error = error
        self.failing = True
        self.attempts: list[float] = []  # when accept() was called
        self.accepted = 0

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        self.attempts.append(trio.current_time())
        if self.failing:
            raise OSError(self.error, os.strerror(self.error))
        self.accepted += 1
        if self.accepted > 1:
            await trio.sleep_forever()  # one connection is enough
        ours, _theirs = trio.testing.memory_stream_pair()
        return ours

    async def aclose(self) -> None:
        pass


def accept_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "accept" in r.getMessage()]


async def test_accept_failures_back_off_and_log_once_per_interval(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    listener = FailingListener()
    served = trio.Event()

    async def handler(stream: trio.abc.Stream) -> None:
        served.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept.serve_listener, handler, listener, nursery, 10.0)
        await trio.sleep(25.0)  # 25 s at the limit
        failed = len(listener.attempts)
        listener.failing = False  # descriptors free up
        with trio.fail_after(accept.MAX_WAIT_S + 0.01):
            await served.wait()
        nursery.cancel_scope.cancel()

    gaps = [round(b - a, 3) for a, b in zip(listener.attempts, listener.attempts[1:], strict=False)]
    assert gaps[:6] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0], "the wait doubles from 0.1 s up to 1 s"
    assert 20 <= failed <= 30, f"{failed} attempts in 25 s (trio's loop makes 250)"
    warnings = [r for r in accept_lines(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == 3, "one line at once, then one per 10 s: " + "\n".join(r.getMessage() for r in warnings)
    assert all(r.exc_info is None for r in warnings), "no traceback: it is the same every time"
    assert "EMFILE" in warnings[0].getMessage() and "more failures since" in warnings[1].getMessage()
    assert not [r for r in caplog.records if r.name == "trio.serve_listeners"]
    (again,) = [r for r in accept_lines(caplog) if "accepting client connections again" in r.getMessage()]
    assert f"after {failed} failed attempts" in again.getMessage()


async def test_other_accept_errors_still_end_the_loop(autojump_clock: trio.testing.MockClock) -> None:
    listener = FailingListener(errno.EBADF)
    async with trio.open_nursery() as nursery:
        with pytest.raises(OSError) as raised:
            await accept.serve_listener(lambda s: trio.lowlevel.checkpoint(), listener, nursery, 10.0)
    assert raised.value.errno == errno.EBADF and len(listener.attempts) == 1


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# --- the real process --------------------------------------------------------------------


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture
def kfan_alone(cluster: MockCluster) -> Iterator[Kfan]:
    # Its own kfan: the test takes its descriptors away. No refresh while it does (they would open links).
    with kfan_on(cluster, "--metadata-refresh", "300") as k:
        yield k


def test_kfan_out_of_descriptors_logs_a_line_not_a_flood_and_serves_again(kfan_alone: Kfan) -> None:
    k = kfan_alone
    wait_for("kfan's line that it loaded the protocol schemas", lambda: any("protocol schemas:" in line for line in k.log), 30)
    with RawClient(k.address) as client:
        assert client.call(ApiVersionsV3(client_software_name="t", client_software_version="1")).error_code == 0
        soft, hard = resource.prlimit(k.pid, resource.RLIMIT_NOFILE)
        try:
            start = len(k.log)
            resource.prlimit(k.pid, resource.RLIMIT_NOFILE, (open_fds(k.pid), hard))  # not one descriptor left
            waiting = RawClient(k.address)  # connected (the kernel's backlog), not accepted
            wait_for("kfan's line that accepting fails", lambda: any("EMFILE" in line for line in k.log[start:]), 10)
            # ApiVersions v1: no client used it, so its schema was never needed before; it must not need a descriptor now.
            answer = client.call(ApiVersionsV1())
            assert answer.error_code == 0 and answer.api_keys
            time.sleep(3)  # a window at the limit: trio's own loop would log 30 tracebacks in it
            flood = [line for line in k.log[start:] if re.search(r"EMFILE|Traceback", line)]
            assert len(flood) <= 2, "the log is flooded:\n" + "".join(flood[:20])
        finally:
            resource.prlimit(k.pid, resource.RLIMIT_NOFILE, (soft, hard))
        with waiting:
            answer = waiting.call(ApiVersionsV3(client_software_name="t", client_software_version="1"))
            assert answer.error_code == 0, "the connection that waited in the backlog is served"
        wait_for(
            "kfan's line that it accepts again", lambda: any("accepting client connections again" in line for line in k.log[start:]), 10
        )


# --- the schemas, preloaded ----------------------------------------------------------------


def test_preloaded_versions_need_no_import_afterwards(monkeypatch: pytest.MonkeyPatch) -> None:
    wanted = {apis.API_VERSIONS: (0, 4), apis.METADATA: (0, 12), apis.PRODUCE: (3, 11)}
    schema.request_spec.cache_clear()
    schema.response_spec.cache_clear()
    assert preload(wanted) == 2 * (5 + 13 + 9)
    assert preload(wanted) == 0, "loaded once"

    def out_of_descriptors(*args: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(schema, "load_request_schema", out_of_descriptors)
    monkeypatch.setattr(schema, "load_response_schema", out_of_descriptors)
    for api_key, (lo, hi) in wanted.items():
        for version in range(lo, hi + 1):
            assert schema.request_spec(api_key, version).name and schema.response_spec(api_key, version).name
    with pytest.raises(OSError):
        schema.response_spec(apis.FETCH, 12)  # not preloaded: it would have needed a descriptor


async def test_a_failed_preload_is_logged_and_tried_again(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[dict[int, tuple[int, int]]] = []

    def flaky(versions: dict[int, tuple[int, int]]) -> int:
        calls.append(versions)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return 2

    monkeypatch.setattr(schemas, "preload", flaky)
    monkeypatch.setattr(schemas, "RETRY_S", 0.01)  # real time: the preload runs in a thread, which a virtual clock would not wait for
    preloader = schemas.SchemaPreloader()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(preloader.run)
        preloader.want({apis.API_VERSIONS: (0, 4)})
        await wait_for_async("the second try", lambda: preloader.loaded, 10)
        nursery.cancel_scope.cancel()
    assert calls == [{apis.API_VERSIONS: (0, 4)}] * 2 and preloader.loaded == 2
    assert any("preloading failed" in r.getMessage() for r in caplog.records)
