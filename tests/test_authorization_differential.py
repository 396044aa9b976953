"""kfan's authorizer against Kafka's own, request for request: the same ACLs, the same answers (issue: governance).

The same bindings (tests/support/authorization_cases.py: a fixed core and a seeded random rest, ``KFAN_ACL_SEED``
to repeat a run) go to two places: into kfan A's ACL file (``--authorizer acls``; the brokers see kfan's own
principal, a super user, and let it do everything), and into the brokers themselves (CreateAcls), which judge the
clients through kfan B (``--broker-identity client``: B carries each client's PLAIN login to the brokers, and
decides nothing). alice, bob and carol each send the same requests through A and through B, one per routed API
that Kafka checks; the answers' error codes, the names they are given for, and the authorized-operations fields
must agree, entry by entry. Listings are compared on the test's own resources.
"""

from __future__ import annotations

import os
import random
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.core.acls import AclBinding, Acls
from proxy.core.answers import error_codes
from proxy.kafka import apis
from proxy.kafka.headers import decode_response
from proxy.security.users import add_user
from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.security import kfan_to_brokers
from tests.support.authorization_cases import PRINCIPALS, Names, bindings, cases
from tests.support.golden import request_payload
from tests.support.kfan import Kfan, kfan_at
from tests.support.rawclient import RawClient
from tests.support.waiting import wait_for

# Entries of an answer that may name what the client asked, or what its ACLs let it see.
KEYS = frozenset(
    {
        "name",
        "topic",
        "topic_name",
        "partition_index",
        "partition",
        "index",
        "partition_id",
        "group_id",
        "key",
        "transactional_id",
        "resource_type",
        "resource_name",
        "user",
        "entity_type",
        "entity_name",
    }
)
# Where an answer names brokers (kfan's identity, rewritten): not a decision.
BROKERS = frozenset({"brokers", "node_endpoints", "current_leader"})
NAMING = ("name", "topic", "topic_name", "group_id", "transactional_id")
RETRIABLE = {6, 7, 13, 14, 15, 16, 51}  # moved leaders, timeouts, coordinators loading or moved, rebalancing
# Where kfan and Kafka answer differently on purpose: (case label) -> why. None today.
KNOWN_DIFFERENCES: dict[str, str] = {}


def skeleton(value: Any, prefix: str) -> Any:
    """What an answer decides: error codes and authorized operations, keyed by the names they are given for (in
    any order); entries naming other tests' topics, groups or transactions are left out of listings."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k.endswith("error_code") or k in KEYS or k.endswith("authorized_operations"):
                if v is None or isinstance(v, int | str):
                    out[k] = v
            elif isinstance(v, list) and v and isinstance(v[0], dict) and k not in BROKERS:
                entries = [skeleton(e, prefix) for e in v]
                entries = [e for e in entries if _ours(e, prefix)]
                out[k] = sorted(entries, key=repr)
            elif isinstance(v, dict) and k not in BROKERS:
                out[k] = skeleton(v, prefix)
        return out
    return value


def _ours(entry: dict[str, Any], prefix: str) -> bool:
    for key in NAMING:
        name = entry.get(key)
        if isinstance(name, str) and name and not name.startswith(prefix) and name != "__cluster_metadata":
            return False
    return True


class Session:
    """A client logged in to a kfan with PLAIN, sending kfan-encoded requests and reading decoded answers."""

    def __init__(self, address: tuple[str, int], user: str, password: str) -> None:
        self.client = RawClient(address, timeout=30)
        self.cid = 0
        handshake = self.call(apis.SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert handshake["error_code"] == 0, handshake
        login = self.call(apis.SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{user}\0{password}".encode()})
        assert login["error_code"] == 0, login

    def call(self, api: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.cid += 1
        payload = request_payload(api, version, body, correlation_id=self.cid)
        self.client.send_bytes(struct.pack(">i", len(payload)) + payload)
        answer = self.client.receive(timeout=60)
        assert answer is not None, f"kfan closed the connection on api_key {api} v{version}"
        assert struct.unpack_from(">i", answer)[0] == self.cid
        return decode_response(answer, api, version)

    def close(self) -> None:
        self.client.close()


@dataclass
class World:
    names: Names
    acls: Acls
    seed: int
    topic_ids: dict[str, uuid.UUID]
    judged_by_kfan: Kfan
    judged_by_kafka: Kfan
    passwords: dict[str, str]


def _broker_call(address: tuple[str, int], api: int, version: int, body: dict[str, Any]) -> dict[str, Any]:
    """A request to one broker's PLAINTEXT listener (ANONYMOUS, a super user of the session's cluster)."""
    with RawClient(address, timeout=30) as c:
        payload = request_payload(api, version, body)
        c.send_bytes(struct.pack(">i", len(payload)) + payload)
        answer = c.receive(timeout=60)
        assert answer is not None
        return decode_response(answer, api, version)


def _acl_filter(b: AclBinding) -> dict[str, Any]:
    return {
        "resource_type_filter": int(b.resource_type),
        "resource_name_filter": b.resource_name,
        "pattern_type_filter": int(b.pattern_type),
        "principal_filter": b.principal,
        "host_filter": b.host,
        "operation": int(b.operation),
        "permission_type": int(b.permission),
    }


def _has_all(address: tuple[str, int], wanted: list[AclBinding]) -> bool:
    found = _broker_call(
        address,
        apis.DESCRIBE_ACLS,
        3,
        {
            "resource_type_filter": 1,
            "resource_name_filter": None,
            "pattern_type_filter": 1,
            "principal_filter": None,
            "host_filter": None,
            "operation": 1,
            "permission_type": 1,
        },
    )
    have = {
        (r["resource_type"], r["resource_name"], r["pattern_type"], a["principal"], a["host"], a["operation"], a["permission_type"])
        for r in found["resources"]
        for a in r["acls"]
    }
    return all(
        (int(b.resource_type), b.resource_name, int(b.pattern_type), b.principal, b.host, int(b.operation), int(b.permission)) in have
        for b in wanted
    )


def _acl_file(path: Path, acls: list[AclBinding]) -> None:
    lines = []
    for b in acls:
        lines += [
            "[[acls]]",
            f'principal = "{b.principal}"',
            f'host = "{b.host}"',
            f'resource_type = "{b.resource_type.name}"',
            f'resource_name = "{b.resource_name}"',
            f'pattern_type = "{b.pattern_type.name}"',
            f'operation = "{b.operation.name}"',
            f'permission = "{b.permission.name}"',
            "",
        ]
    path.write_text("\n".join(lines))


@pytest.fixture(scope="module")
def world(apache_kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    assert apache_kafka.secured is not None
    names = Names(f"dz{uuid.uuid4().hex[:6]}")
    seed = int(os.environ.get("KFAN_ACL_SEED", random.randrange(1 << 30)))
    print(f"authorization differential: prefix {names.prefix}, KFAN_ACL_SEED={seed}")
    apache_kafka.create_topic(names.orders, 3, replicas=[[1, 2, 3], [2, 3, 1], [3, 1, 2]])
    apache_kafka.create_topic(names.pay, 3, replicas=[[2, 3, 1], [3, 1, 2], [1, 2, 3]])
    apache_kafka.create_topic(names.logs, 1)
    brokers = list(apache_kafka.brokers.values())
    listed = _broker_call(brokers[0], apis.METADATA, 12, {"topics": [{"name": t} for t in (names.orders, names.pay, names.logs)]})
    topic_ids = {t["name"]: t["topic_id"] for t in listed["topics"]}
    acl_list = bindings(names, seed)
    created = _broker_call(
        brokers[0],
        apis.CREATE_ACLS,
        3,
        {
            "creations": [
                {
                    "resource_type": int(b.resource_type),
                    "resource_name": b.resource_name,
                    "resource_pattern_type": int(b.pattern_type),
                    "principal": b.principal,
                    "host": b.host,
                    "operation": int(b.operation),
                    "permission_type": int(b.permission),
                }
                for b in acl_list
            ]
        },
    )
    assert all(r["error_code"] == 0 for r in created["results"]), created
    try:
        for address in brokers:  # every broker's authorizer has them all before anything is judged
            wait_for("the ACLs at every broker", lambda a=address: _has_all(a, acl_list), 60)
        secrets = tmp_path_factory.mktemp("authz-diff")
        users = secrets / "users.toml"
        passwords = {p: apache_kafka.secured.users[p] for p in PRINCIPALS}
        for p, password in passwords.items():
            add_user(users, p, password, ("SCRAM-SHA-512",))  # PLAIN logins are checked against it
        acl_path = secrets / "acls.toml"
        _acl_file(acl_path, acl_list)
        to_brokers = kfan_to_brokers(apache_kafka.secured, secrets)
        clients = ["--client-auth", "sasl", "--client-users", str(users), "--client-sasl-mechanisms", "PLAIN"]
        with (
            kfan_at(
                apache_kafka.secure_bootstrap, *to_brokers, *clients, "--authorizer", "acls", "--acl-file", str(acl_path)
            ) as judged_by_kfan,
            kfan_at(apache_kafka.secure_bootstrap, *to_brokers, *clients, "--broker-identity", "client") as judged_by_kafka,
        ):
            yield World(names, Acls(acl_list), seed, topic_ids, judged_by_kfan, judged_by_kafka, passwords)
    finally:
        _broker_call(brokers[0], apis.DELETE_ACLS, 3, {"filters": [_acl_filter(b) for b in acl_list]})


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_kfan_and_kafkas_authorizer_answer_alike(world: World, principal: str) -> None:
    n = world.names
    share_member = str(uuid.uuid4())
    by_kfan = Session(world.judged_by_kfan.address, principal, world.passwords[principal])
    by_kafka = Session(world.judged_by_kafka.address, principal, world.passwords[principal])
    differences = []
    compared = 0
    try:
        for case in cases(n, principal, world.acls, world.topic_ids, share_member):
            for attempt in range(6):
                raw_a = by_kfan.call(case.api, case.version, case.body)
                raw_b = by_kafka.call(case.api, case.version, case.body)
                a, b = skeleton(raw_a, n.prefix), skeleton(raw_b, n.prefix)
                if a == b or not (_codes(a) | _codes(b)) & RETRIABLE or attempt == 5:
                    break
                time.sleep(0.5 * (attempt + 1))  # a coordinator loading, a leader moving: as a client retries
            compared += 1
            if a != b and case.label not in KNOWN_DIFFERENCES:
                differences.append(
                    f"{case.label} (api {case.api} v{case.version}):\n  kfan:  {a}\n  Kafka: {b}\n"
                    f"  as answered, kfan: {str(raw_a)[:1500]}\n  Kafka: {str(raw_b)[:1500]}"
                )
    finally:
        by_kfan.close()
        by_kafka.close()
    print(f"{principal}: {compared} requests compared, {len(world.acls)} bindings, seed {world.seed}")
    assert not differences, f"{len(differences)} of {compared} answers differ (KFAN_ACL_SEED={world.seed}):\n" + "\n".join(differences)


def _codes(value: Any) -> set[int]:
    return set(error_codes(value))
