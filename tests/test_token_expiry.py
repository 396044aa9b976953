"""Expiring a client's delegation token when it leaves (``--broker-identity client``), against a scripted broker.

A broker that cannot reach the controller in time answers ExpireDelegationToken with REQUEST_TIMED_OUT or
NOT_CONTROLLER; the token is then still valid, so kfan asks again. A refusal that asking again cannot change
(the token is not found) ends it at once, and one that does not clear in time is logged, never silent.
The broker here is a trio server on a real socket that answers with the error codes a test scripts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator

import pytest
import trio

from backends.cluster import Cluster
from backends.tokens import Token
from proxy.core.topology import Broker, Topology
from proxy.kafka import apis, errors
from proxy.kafka.frames import FrameReader, frame
from proxy.kafka.headers import peek_request
from proxy.server import token_identity
from proxy.server.token_identity import TokenIdentity
from tests.support.messages import answer_bytes

TOKEN = Token("token-1", b"hmac-of-token-1", 2**62)


def _answers(codes: Iterator[int], asked: list[int]) -> functools.partial[object]:
    """A broker handler answering each ExpireDelegationToken with the next code (``asked`` records them)."""

    async def handle(stream: trio.SocketStream) -> None:
        reader = FrameReader()
        async with stream:
            while data := await stream.receive_some():
                reader.feed(data)
                while (payload := reader.next_frame()) is not None:
                    key, version, cid = peek_request(payload)
                    assert key == apis.EXPIRE_DELEGATION_TOKEN, key
                    code = next(codes)
                    asked.append(code)
                    body = {"error_code": code, "expiry_timestamp_ms": -1, "throttle_time_ms": 0}
                    await stream.send_all(frame([answer_bytes(key, version, body, cid)]))

    return functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1")


async def _expire(codes: Iterator[int]) -> list[int]:
    """Expire :data:`TOKEN` through a broker answering ``codes``; the codes it answered."""
    asked: list[int] = []
    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(_answers(codes, asked))
        port = listener.socket.getsockname()[1]
        cluster = Cluster([("127.0.0.1", port)])
        cluster.topology = Topology(brokers={1: Broker(1, "127.0.0.1", port)}, leaders={}, cluster_id="c", controller_id=1)
        cluster.control.nursery = nursery
        tokens = TokenIdentity(cluster, "client 1")
        tokens.token = TOKEN
        await tokens.expire()
        assert tokens.token is None
        nursery.cancel_scope.cancel()
    return asked


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_identity, "EXPIRE_RETRY_S", 0.01)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.text = ""

    def emit(self, record: logging.LogRecord) -> None:
        self.text += record.getMessage() + "\n"


@pytest.fixture
def logged() -> Iterator[_Lines]:
    """What kfan.auth logs, read from the logger itself (kfan's logging set up in this process by another test
    may keep its records from the root logger that pytest's caplog listens to)."""
    logger, lines = logging.getLogger("kfan.auth"), _Lines()
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(level)


def test_a_broker_that_could_not_reach_the_controller_is_asked_again(quick: None, logged: _Lines) -> None:
    codes = iter([errors.REQUEST_TIMED_OUT, errors.NOT_CONTROLLER, errors.NONE])
    assert trio.run(_expire, codes) == [errors.REQUEST_TIMED_OUT, errors.NOT_CONTROLLER, errors.NONE]
    assert "delegation token token-1 expired" in logged.text
    assert "not expired" not in logged.text


def test_a_token_the_brokers_do_not_know_is_not_asked_about_again(quick: None, logged: _Lines) -> None:
    not_found = 62
    assert trio.run(_expire, iter([not_found, errors.NONE])) == [not_found]
    assert "delegation token token-1 not expired: the token is not found" in logged.text


def test_a_token_not_expired_in_time_is_logged(quick: None, monkeypatch: pytest.MonkeyPatch, logged: _Lines) -> None:
    monkeypatch.setattr(token_identity, "EXPIRE_WITHIN_S", 0.5)
    asked = trio.run(_expire, iter(lambda: errors.REQUEST_TIMED_OUT, None))
    assert len(asked) >= 2 and set(asked) == {errors.REQUEST_TIMED_OUT}
    assert (
        "delegation token token-1 not expired: not done within 0.5 s (last: the broker could not reach the controller in time)"
        in logged.text
    )
