"""Kafka 4's administration through kfan gives what it gives straight to Apache Kafka.

Kafka's own tools, pointed at kfan and at the brokers: ``kafka-features`` (ApiVersions' features, UpdateFeatures),
``kafka-metadata-quorum`` (DescribeQuorum, RemoveRaftVoter), ``kafka-configs`` on SCRAM credentials
(AlterUserScramCredentials) and ``kafka-client-metrics`` (client-metrics resources, ListConfigResources).
"""

from __future__ import annotations

import re
import uuid

from tests.support.apache_kafka.cluster import KafkaCluster
from tests.support.apache_kafka.tools import run_tool, run_tools
from tests.support.kfan import Kfan


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_kafka_features_describes_the_clusters_features_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    through, direct = run_tools(
        ("kafka-features", "--bootstrap-server", kfan_kafka.bootstrap, "describe"),
        ("kafka-features", "--bootstrap-server", apache_kafka.bootstrap, "describe"),
    )
    assert "Feature: metadata.version" in direct.out
    assert "Feature: transaction.version" in direct.out
    # The epoch is the metadata log's, which moves on while a cluster settles; kfan reads it at each refresh.
    assert re.sub(r"Epoch: \d+", "", through.out) == re.sub(r"Epoch: \d+", "", direct.out)


def test_kafka_features_dry_run_upgrade_goes_to_the_controller_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    level = re.search(
        r"Feature: transaction.version\s+SupportedMinVersion: \d+\s+SupportedMaxVersion: (\d+)",
        run_tool("kafka-features", "--bootstrap-server", apache_kafka.bootstrap, "describe").out,
    )
    assert level is not None
    args = ("upgrade", "--feature", f"transaction.version={level.group(1)}", "--dry-run")
    through, direct = run_tools(
        ("kafka-features", "--bootstrap-server", kfan_kafka.bootstrap, *args),
        ("kafka-features", "--bootstrap-server", apache_kafka.bootstrap, *args),
    )
    assert through.out == direct.out and "transaction.version" in direct.out


def _status(bootstrap: str) -> dict[str, str]:
    out = run_tool("kafka-metadata-quorum", "--bootstrap-server", bootstrap, "describe", "--status").out
    return dict(line.split(":", 1) for line in out.strip().splitlines() if ":" in line)


def test_kafka_metadata_quorum_describes_the_quorum_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    through, direct = _status(kfan_kafka.bootstrap), _status(apache_kafka.bootstrap)
    for key in ("ClusterId", "LeaderId", "CurrentVoters"):
        assert through[key] == direct[key], key
    assert int(through["LeaderId"]) == apache_kafka.active_controller()


def test_a_raft_voter_change_is_answered_as_directly(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    """A static quorum refuses it: the refusal reaches the tool through kfan as it does directly."""
    args = ("remove-controller", "--controller-id", "9999", "--controller-directory-id", "AAAAAAAAAAAAAAAAAAAAAA")
    through, direct = run_tools(
        ("kafka-metadata-quorum", "--bootstrap-server", kfan_kafka.bootstrap, *args),
        ("kafka-metadata-quorum", "--bootstrap-server", apache_kafka.bootstrap, *args),
        check=False,
    )
    assert direct.code != 0
    assert through.code == direct.code
    error = [line for line in direct.err.splitlines() if "Exception" in line][:1]
    assert error and error[0] in through.err, (direct.err[-1500:], through.err[-1500:])


def _scram(bootstrap: str, user: str) -> str:
    return run_tool("kafka-configs", "--bootstrap-server", bootstrap, "--describe", "--entity-type", "users", "--entity-name", user).out


def test_scram_credentials_are_set_and_removed_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    user = _name("alice")
    base = ("kafka-configs", "--bootstrap-server", kfan_kafka.bootstrap, "--entity-type", "users", "--entity-name", user, "--alter")
    run_tool(*base, "--add-config", "SCRAM-SHA-512=[iterations=8192,password=alice-secret]")
    assert "SCRAM-SHA-512=iterations=8192" in _scram(apache_kafka.bootstrap, user)
    assert _scram(kfan_kafka.bootstrap, user) == _scram(apache_kafka.bootstrap, user)
    run_tool(*base, "--delete-config", "SCRAM-SHA-512")
    assert "SCRAM-SHA-512" not in _scram(apache_kafka.bootstrap, user)


def test_client_metrics_resources_are_made_listed_and_described_through_kfan(apache_kafka: KafkaCluster, kfan_kafka: Kfan) -> None:
    name = _name("metrics")
    tool = ("kafka-client-metrics", "--bootstrap-server")
    run_tool(*tool, kfan_kafka.bootstrap, "--alter", "--name", name, "--metrics", "org.apache.kafka.producer.", "--interval", "10000")
    through, direct = run_tools((*tool, kfan_kafka.bootstrap, "--list"), (*tool, apache_kafka.bootstrap, "--list"))
    assert name in direct.out.split()
    assert sorted(through.out.split()) == sorted(direct.out.split())
    described = run_tool(*tool, kfan_kafka.bootstrap, "--describe", "--name", name).out
    assert "org.apache.kafka.producer." in described and "10000" in described
    run_tool(*tool, kfan_kafka.bootstrap, "--delete", "--name", name)
    assert name not in run_tool(*tool, apache_kafka.bootstrap, "--list").out.split()
