"""Before a client has logged in it may make kfan hold what a broker allows and no more, seen from the real process.

Frames are capped as Kafka's ``sasl.server.max.receive.size`` caps them, a
client must log in within ``--client-auth-timeout``, each address may have
``--max-unauthenticated-per-address`` connections not logged in, and their
bytes sit in a pool of their own: unauthenticated clients cannot stall the
logged-in ones. Each attacker's connection is closed with one log line naming why.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from kio.schema.api_versions.v3 import ApiVersionsRequest
from kio.schema.metadata.v4 import MetadataRequest
from kio.schema.metadata.v4.request import MetadataRequestTopic
from kio.schema.sasl_authenticate.v1 import SaslAuthenticateRequest
from kio.schema.sasl_handshake.v1 import SaslHandshakeRequest
from kio.schema.types import TopicName

from proxy.tools.mock_cluster import MockCluster
from tests.support.kfan import Kfan, start_kfan
from tests.support.rawclient import CLOSED_WITHIN_S, RawClient
from tests.support.secure_kfan import KfanSecrets, kfan_secrets
from tests.support.waiting import wait_for, wait_for_line

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> KfanSecrets:
    return kfan_secrets(tmp_path_factory.mktemp("prelogin-secrets"))


@contextmanager
def sasl_kfan(cluster: MockCluster, secrets: KfanSecrets, *flags: str) -> Iterator[Kfan]:
    k = start_kfan(cluster.bootstrap, *secrets.sasl_args(), *flags)
    try:
        yield k
        assert k.alive(), "kfan died:\n" + "".join(k.log[-40:])
    finally:
        k.stop()


def logged_in(k: Kfan, secrets: KfanSecrets, user: str = "alice") -> RawClient:
    """A raw client logged in with PLAIN."""
    rc = RawClient(k.address)
    assert rc.call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
    token = f"\0{user}\0{secrets.passwords[user]}".encode()
    assert rc.call(SaslAuthenticateRequest(auth_bytes=token)).error_code == 0
    return rc


def big_metadata(size: int) -> MetadataRequest:
    """A Metadata request of more than ``size`` bytes: many long topic names none of which exists (nor is created)."""
    names = [TopicName(f"no-such-topic-{i:06d}-" + "x" * 200) for i in range(size // 200 + 1)]
    return MetadataRequest(topics=tuple(MetadataRequestTopic(name=n) for n in names), allow_auto_topic_creation=False)


def lines_with(k: Kfan, text: str) -> int:
    return sum(text in line for line in k.log)


def test_frames_before_login_are_capped_as_kafka_caps_them(cluster: MockCluster, secrets: KfanSecrets) -> None:
    with sasl_kfan(cluster, secrets, "--client-auth-max-receive-bytes", str(64 * KiB)) as k:
        with RawClient(k.address) as attacker:
            attacker.send_bytes(struct.pack(">i", 20 * MiB) + b"\0" * 1024)  # a 20 MB SCRAM user name, say
            assert attacker.closed_by_peer(CLOSED_WITHIN_S), "a frame over the login cap is refused before it is read"
        wait_for_line(k.log, re.escape("before login (--client-auth-max-receive-bytes)"))
        assert lines_with(k, "20971520") == 1, "one line names the reason, once"
        with logged_in(k, secrets) as client:
            # Once logged in the full --max-frame-bytes applies: a 100 KiB request is served.
            answer = client.call(big_metadata(100 * KiB))
            assert len(answer.topics) > 400 and all(t.error_code == 3 for t in answer.topics), "UNKNOWN_TOPIC_OR_PARTITION each"


def test_a_client_that_does_not_log_in_in_time_is_closed(cluster: MockCluster, secrets: KfanSecrets) -> None:
    with sasl_kfan(cluster, secrets, "--client-auth-timeout", "1") as k:
        with logged_in(k, secrets) as client, RawClient(k.address) as idler:
            assert idler.call(ApiVersionsRequest(client_software_name="idle", client_software_version="1")).error_code == 0
            assert idler.closed_by_peer(CLOSED_WITHIN_S), "not logged in within --client-auth-timeout: closed"
            wait_for_line(k.log, "not logged in within 1 s, closing")
            # The deadline is past for the logged-in client too, which stays served.
            assert client.call(MetadataRequest(topics=None, allow_auto_topic_creation=False)).brokers


def test_connections_not_logged_in_are_capped_per_address(cluster: MockCluster, secrets: KfanSecrets) -> None:
    with sasl_kfan(cluster, secrets, "--max-unauthenticated-per-address", "3") as k, ExitStack() as stack:
        waiting = [stack.enter_context(RawClient(k.address)) for _ in range(3)]
        for rc in waiting:  # each is served: kfan has accepted it
            assert rc.call(ApiVersionsRequest(client_software_name="w", client_software_version="1")).error_code == 0
        with RawClient(k.address) as fourth:
            assert fourth.closed_by_peer(CLOSED_WITHIN_S), "a fourth connection not logged in is closed as it arrives"
        wait_for_line(k.log, re.escape("3 not logged in yet, the limit (--max-unauthenticated-per-address)"))
        # One logs in: its place is free again, and a new connection is served.
        assert waiting[0].call(SaslHandshakeRequest(mechanism="PLAIN")).error_code == 0
        token = f"\0alice\0{secrets.passwords['alice']}".encode()
        assert waiting[0].call(SaslAuthenticateRequest(auth_bytes=token)).error_code == 0
        with RawClient(k.address) as fifth:
            assert fifth.call(ApiVersionsRequest(client_software_name="f", client_software_version="1")).error_code == 0


def test_unauthenticated_bytes_do_not_stall_logged_in_clients(cluster: MockCluster, secrets: KfanSecrets, tmp_path: Path) -> None:
    """Six connections not logged in each send 400 KiB of a declared 500 KiB frame, more than the pool that
    logged-in clients share (1 MiB here): that pool is not theirs, so a logged-in client's 600 KiB request is
    read and answered while they still hold their bytes."""
    flags = [
        "--max-buffered-bytes",
        str(MiB),
        "--max-unauthenticated-bytes",
        str(MiB),
        "--frame-timeout",
        "120",
        "--client-auth-timeout",
        "120",
    ]
    with sasl_kfan(cluster, secrets, *flags) as k, ExitStack() as stack:
        sent = [0] * 6
        done = [threading.Event() for _ in range(6)]
        stop = threading.Event()

        def attacker(i: int) -> None:
            with socket.create_connection(k.address) as s:
                s.sendall(struct.pack(">i", 500 * KiB))
                s.settimeout(2)  # kfan stops reading: the send blocks, and this attacker stops there
                try:
                    for _ in range(400):
                        s.sendall(b"\x07" * KiB)
                        sent[i] += KiB
                except (TimeoutError, OSError):
                    pass
                done[i].set()
                stop.wait(60)

        threads = [threading.Thread(target=attacker, args=(i,), daemon=True) for i in range(6)]
        for t in threads:
            t.start()
        stack.callback(lambda: [t.join(10) for t in threads])
        stack.callback(stop.set)
        wait_for("every attacker sent what kfan would read", lambda: all(d.is_set() for d in done), 60, seen=lambda: sent)
        assert sum(sent) > MiB, "the attackers hold more than the shared pool"
        with logged_in(k, secrets) as client:
            answer = client.call(big_metadata(600 * KiB))
            assert all(t.error_code == 3 for t in answer.topics)
        closed = lines_with(k, "a frame was not completed") + lines_with(k, "not logged in within")
        assert closed == 0, "the answer came while every attacker still held its bytes"
