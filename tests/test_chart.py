"""The Helm chart in charts/kfan: rendered and linted by real Helm, validated
against Kubernetes' schemas, and held to kfan's real options.

Helm is Helm's own Go SDK (v4), which the helm-python-sdk wheel bundles as a
shared library (no helm binary, no download at run time). Kubernetes' schemas
come from kubernetes-validate; the ServiceMonitor's from the prometheus-operator
CRD kept in charts/kfan/ci/.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from proxy.cli import build_parser
from proxy.runtime.telemetry import load_subscriptions
from proxy.server.config import OPTIONS, resolve
from proxy.server.governance import read_acls
from proxy.server.quotas import read_quotas
from tests.support.certs import Authority
from tests.support.chart import BASE, CHART, NAMESPACE, ROOT, container, kfan_env, notes, one, probe_status, render, start_rendered
from tests.support.processes import stop_process
from tests.support.secure_cluster import SecureCluster
from tests.support.waiting import wait_for, wait_for_line

# Oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest
# kubernetes-validate knows.
K8S_VERSIONS = ("1.25.0", latest_version())

# Every KFAN_* variable kfan reads: one per option, and the config file.
KFAN_ENV = {o.env for o in OPTIONS} | {"KFAN_CONFIG"}
OPTION_NAMES = {o.name for o in OPTIONS}

# Every value the chart takes, switched away from its default where that
# renders something more.
EVERYTHING: dict[str, Any] = {
    "kafka": {"bootstrap": ["kafka-0.kafka:9092", "kafka-1.kafka:9092"]},
    "replicaCount": 3,
    "image": {"repository": "registry.example/kfan", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "advertise": "kfan.example.com:19092",
    "nodeId": 7,
    "brokerIds": "cluster",
    "brokerPortBase": 30000,
    "brokerPortIds": [1, 2, 3],
    "rack": "us-east-1b",
    "workers": 2,
    "logLevel": "DEBUG",
    "logJson": True,
    "shutdownTimeoutSeconds": 12.5,
    "preStopSleepSeconds": 3,
    "terminationGracePeriodSeconds": 60,
    "readReplicaMaxAgeSeconds": 60,
    # Every limit but those the config file and extraEnv set below, as releases from before these values do.
    "limits": {
        "maxConnectionBytes": 33554432,
        "maxBufferedBytes": 268435456,
        "fetchAheadBytes": 8388608,
        "maxConnections": 4000,
        "maxUnauthenticatedPerAddress": 8,
        "maxUnauthenticatedBytes": 16777216,
        "requestTimeoutSeconds": 20,
        "maxHoldSeconds": 120,
        "idleTimeoutSeconds": 300,
        "frameTimeoutSeconds": 15.5,
    },
    "configFile": "max-inflight = 512\nmetadata-refresh = 10.0\n",
    "extraEnv": {"KFAN_MAX_FRAME_BYTES": "52428800", "KFAN_CAPTURE": "/capture", "TZ": "UTC"},
    "extraEnvFrom": [{"secretRef": {"name": "kfan-extra"}}],
    "extraVolumes": [{"name": "capture", "emptyDir": {"sizeLimit": "1Gi"}}],
    "extraVolumeMounts": [{"name": "capture", "mountPath": "/capture"}],
    "tls": {
        "enabled": True,
        "secretName": "kfan-tls",
        "mountPath": "/etc/kfan/tls",
        "certFile": "server.pem",
        "keyFile": "server-key.pem",
        "clientCA": {"enabled": True, "secretName": "apps-ca", "file": "ca.pem", "mountPath": "/etc/kfan/apps-ca"},
    },
    "brokerTls": {
        "enabled": True,
        "serverName": "kafka.internal",
        "ca": {"secretName": "kafka-ca", "file": "ca.crt", "mountPath": "/etc/kfan/kafka-ca"},
        "clientCert": {"secretName": "kfan-kafka-cert", "certFile": "tls.crt", "keyFile": "tls.key", "mountPath": "/etc/kfan/kafka-cert"},
    },
    "brokerSasl": {
        "mechanism": "SCRAM-SHA-512",
        "username": "kfan",
        "password": {"secretName": "kfan-kafka-sasl", "file": "pw", "mountPath": "/etc/kfan/kafka-sasl"},
        "token": {"secretName": "", "file": "token", "mountPath": "/etc/kfan/kafka-token"},
        "identity": "kfan",
    },
    "clientAuth": {
        "mode": "sasl",
        "mechanisms": ["SCRAM-SHA-512", "OAUTHBEARER"],
        "users": {"secretName": "kfan-users", "file": "users.json", "mountPath": "/etc/kfan/users"},
        "oauth": {
            "jwks": {"secretName": "idp-jwks", "file": "jwks.json", "mountPath": "/etc/kfan/jwks"},
            "issuer": "https://idp.example.com/",
            "audience": "kafka",
            "clockSkewSeconds": 10,
        },
        "sessionLifetimeSeconds": 3600,
        "failureDelaySeconds": 0.5,
    },
    "service": {"type": "LoadBalancer", "port": 19092, "metricsPort": 19100, "annotations": {"a": "b"}},
    "containerPorts": {"kafka": 9192, "metrics": 9300},
    "serviceAccount": {"create": True, "name": "kfan-sa", "annotations": {"a": "b"}},
    "podAnnotations": {"a": "b"},
    "podLabels": {"team": "streaming"},
    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    "livenessProbe": {"periodSeconds": 20},
    "readinessProbe": {"periodSeconds": 3},
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": "25%"},
    "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 12, "targetMemoryUtilizationPercentage": 80},
    "serviceMonitor": {"enabled": True, "namespace": "monitoring", "labels": {"release": "prom"}, "interval": "15s"},
    "podAntiAffinity": "hard",
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}],
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}],
    "priorityClassName": "high",
}


def port_number(c: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    return next(p["containerPort"] for p in c["ports"] if p["name"] == port)


# ---- schema validation ----


def _strict(schema: Any) -> Any:
    """A CRD's structural schema as JSON Schema that, like the API server, refuses unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _crd_schema(path: Path, version: str) -> dict[str, Any]:
    crd = next(d for d in yaml.safe_load_all(path.read_text()) if d)
    schema = next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"] if v["name"] == version)
    return _strict(schema)


SERVICEMONITOR_SCHEMA = _crd_schema(CHART / "ci" / "servicemonitor-crd.yaml", "v1")


def validate(doc: dict[str, Any]) -> None:
    """Raise unless the object is valid for every Kubernetes version the chart supports."""
    meta = doc["metadata"]
    # Object names: DNS-1123 labels (Services are the strictest: 63 characters, a letter first).
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", meta["name"]), meta["name"]
    assert meta["namespace"]
    if doc["kind"] == "ServiceMonitor":
        jsonschema.Draft7Validator(SERVICEMONITOR_SCHEMA).validate(doc)
        return
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


# ---- the tests ----


def test_default_render_is_valid_and_advertises_the_service() -> None:
    docs = render(BASE)
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"]
    for doc in docs:
        validate(doc)
    service = one(docs, "Service")
    kafka_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "kafka")
    env = kfan_env(docs)
    assert env["KFAN_ADVERTISE"] == f"{service['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{kafka_port}"
    assert env["KFAN_ADVERTISE"] == "prod-kfan.streaming.svc.cluster.local:9092"
    assert env["KFAN_BOOTSTRAP"] == BASE["kafka"]["bootstrap"]
    # The Service sends clients to the kfan pods.
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert f"    {env['KFAN_ADVERTISE']}\n" in notes(BASE)


def test_advertise_follows_service_port_and_cluster_domain_or_is_taken_as_given() -> None:
    env = kfan_env(render(BASE | {"service": {"port": 19092}, "clusterDomain": "corp.internal", "fullnameOverride": "edge"}))
    assert env["KFAN_ADVERTISE"] == "edge.streaming.svc.corp.internal:19092"
    env = kfan_env(render(BASE | {"advertise": "kafka.example.com:443"}))
    assert env["KFAN_ADVERTISE"] == "kafka.example.com:443"


def test_everything_switched_on_is_valid() -> None:
    docs = render(EVERYTHING)
    assert {d["kind"] for d in docs} == {
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    }
    for doc in docs:
        validate(doc)
    # The longest release name Helm allows still makes valid object names.
    for doc in render(BASE, name="r" * 53):
        validate(doc)


def test_tls_secret_is_mounted_read_only_only_when_enabled() -> None:
    def pod(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        docs = render(values)
        return one(docs, "Deployment")["spec"]["template"]["spec"], container(docs)

    spec, kfan = pod(BASE)
    assert all("secret" not in v for v in spec["volumes"])
    assert all(m["name"] != "tls" for m in kfan["volumeMounts"])
    spec, kfan = pod(BASE | {"tls": {"enabled": True, "secretName": "kfan-tls", "mountPath": "/certs"}})
    volume = next(v for v in spec["volumes"] if v["name"] == "tls")
    assert volume["secret"]["secretName"] == "kfan-tls"
    mount = next(m for m in kfan["volumeMounts"] if m["name"] == "tls")
    assert mount == {"name": "tls", "mountPath": "/certs", "readOnly": True}


# The kfan options that name a file, and the Secret volume each is read from in SECURE.
SECRET_FILES = {
    "KFAN_TLS_CERT": "tls",
    "KFAN_TLS_KEY": "tls",
    "KFAN_TLS_CLIENT_CA": "client-ca",
    "KFAN_BROKER_TLS_CA": "broker-ca",
    "KFAN_BROKER_TLS_CERT": "broker-tls",
    "KFAN_BROKER_TLS_KEY": "broker-tls",
    "KFAN_BROKER_SASL_PASSWORD_FILE": "broker-sasl-password",
    "KFAN_BROKER_SASL_TOKEN_FILE": "broker-sasl-token",
    "KFAN_CLIENT_USERS": "client-users",
    "KFAN_CLIENT_OAUTH_JWKS": "client-oauth-jwks",
}

# Every security value on, kfan's defaults for the paths and file names.
SECURE: dict[str, Any] = BASE | {
    "tls": {"enabled": True, "secretName": "kfan-tls", "clientCA": {"enabled": True}},
    "brokerTls": {"enabled": True, "ca": {"secretName": "kafka-ca"}, "clientCert": {"secretName": "kfan-kafka-cert"}},
    "brokerSasl": {"mechanism": "SCRAM-SHA-512", "username": "kfan", "password": {"secretName": "kfan-kafka-sasl"}},
    "clientAuth": {"mode": "sasl", "users": {"secretName": "kfan-users"}, "oauth": {"jwks": {"secretName": "idp-jwks"}}},
}


def secret_files(docs: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each file the pod gets from a Secret: path -> (volume name, Secret name), checked to be read-only, whole-volume mounts."""
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    out = {}
    for mount in container(docs)["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "secret" not in volume:
            continue
        assert mount.get("readOnly") is True, mount
        assert "subPath" not in mount and "subPathExpr" not in mount, "a subPath mount never sees a rotated Secret"
        secret = volume["secret"]
        assert secret["defaultMode"] == 0o440, secret
        for item in secret["items"]:
            assert item["key"] == item["path"]
            out[f"{mount['mountPath']}/{item['path']}"] = (volume["name"], secret["secretName"])
    return out


def test_security_files_come_from_read_only_secret_mounts_and_the_configmap_holds_only_paths() -> None:
    for values, expected in (
        (
            SECURE,
            {
                "/etc/kfan/tls/tls.crt": ("tls", "kfan-tls"),
                "/etc/kfan/tls/tls.key": ("tls", "kfan-tls"),
                "/etc/kfan/client-ca/ca.crt": ("client-ca", "kfan-tls"),  # the CA beside the server certificate, by default
                "/etc/kfan/broker-ca/ca.crt": ("broker-ca", "kafka-ca"),
                "/etc/kfan/broker-tls/tls.crt": ("broker-tls", "kfan-kafka-cert"),
                "/etc/kfan/broker-tls/tls.key": ("broker-tls", "kfan-kafka-cert"),
                "/etc/kfan/broker-sasl/password": ("broker-sasl-password", "kfan-kafka-sasl"),
                "/etc/kfan/users/users.json": ("client-users", "kfan-users"),
                "/etc/kfan/oauth/jwks.json": ("client-oauth-jwks", "idp-jwks"),
            },
        ),
        (
            BASE | {"brokerTls": {"enabled": True}, "brokerSasl": {"mechanism": "OAUTHBEARER", "token": {"secretName": "kfan-token"}}},
            {"/etc/kfan/broker-token/token": ("broker-sasl-token", "kfan-token")},
        ),
        (EVERYTHING, None),
    ):
        docs = render(values)
        for doc in docs:
            validate(doc)
        files = secret_files(docs)
        if expected is not None:
            assert files == expected
        env = kfan_env(docs)
        # Each file option points at a file mounted from the Secret it belongs to, and every mounted file is used.
        used = {name: path for name, path in env.items() if name in SECRET_FILES}
        assert {files[path][0] for path in used.values()} <= set(SECRET_FILES.values())
        assert all(files[path][0] == SECRET_FILES[name] for name, path in used.items()), used
        assert set(used.values()) == set(files)
        # The ConfigMap holds settings and paths, no secret: no password variable, and only the chart's own keys.
        assert "KFAN_BROKER_SASL_PASSWORD" not in env
        for configmap in (d for d in docs if d["kind"] == "ConfigMap"):
            secret_like = {k for k in configmap["data"] if "PASSWORD" in k or "TOKEN" in k}
            assert secret_like <= {"KFAN_BROKER_SASL_PASSWORD_FILE", "KFAN_BROKER_SASL_TOKEN_FILE"}
        assert not [c for c in container(docs).get("env", []) if "valueFrom" in c], "secrets arrive as files, not variables"
        # kfan's own parser takes the values.
        env.pop("KFAN_CONFIG", None)  # tested above; its file is not here
        options = resolve(vars(build_parser().parse_args(container(docs)["args"])), env)
        assert options["broker_tls"] is True
    # Without security values nothing is mounted or set.
    assert secret_files(render(BASE)) == {}
    assert not set(kfan_env(render(BASE))) & set(SECRET_FILES)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"tls": {"clientCA": {"enabled": True}}}, "tls.clientCA.enabled needs tls.enabled"),
        (
            {"brokerTls": {"ca": {"secretName": "kafka-ca"}}},
            "brokerTls.ca, brokerTls.clientCert and brokerTls.serverName need brokerTls.enabled",
        ),
        ({"brokerSasl": {"username": "kfan"}}, "brokerSasl.username, brokerSasl.password and brokerSasl.token need brokerSasl.mechanism"),
        (
            {"brokerSasl": {"mechanism": "OAUTHBEARER", "token": {"secretName": "t"}, "password": {"secretName": "p"}}},
            "brokerSasl.password is for PLAIN and SCRAM",
        ),
        (
            {"brokerSasl": {"mechanism": "PLAIN", "username": "kfan", "password": {"secretName": "p"}, "token": {"secretName": "t"}}},
            "brokerSasl.token is for OAUTHBEARER",
        ),
        ({"clientAuth": {"mode": "mtls"}}, "clientAuth.mode mtls needs tls.enabled and tls.clientCA.enabled"),
        ({"clientAuth": {"mode": "sasl"}}, "clientAuth.mode sasl needs clientAuth.users (PLAIN, SCRAM) or clientAuth.oauth.jwks"),
        (
            {"clientAuth": {"users": {"secretName": "u"}}},
            "clientAuth.users, clientAuth.oauth.jwks and clientAuth.mechanisms need clientAuth.mode sasl",
        ),
        (
            {"clientAuth": {"mode": "sasl", "users": {"secretName": "u"}, "mechanisms": ["OAUTHBEARER"]}},
            "clientAuth.mechanisms: OAUTHBEARER needs clientAuth.oauth.jwks",
        ),
        (
            {"clientAuth": {"mode": "sasl", "users": {"secretName": "u"}, "oauth": {"issuer": "x"}}},
            "issuer and clientAuth.oauth.audience need",
        ),
        ({"brokerSasl": {"identity": "client"}}, "brokerSasl.identity client needs clientAuth.mode sasl"),
        ({"brokerSasl": {"identity": "client"}, "clientAuth": {"mode": "sasl"}}, "brokerSasl.identity client needs brokerSasl.mechanism"),
        (
            {
                "brokerSasl": {"identity": "client", "mechanism": "PLAIN", "username": "kfan", "password": {"secretName": "p"}},
                "clientAuth": {"mode": "sasl", "users": {"secretName": "u"}, "mechanisms": ["PLAIN", "SCRAM-SHA-512"]},
            },
            "SCRAM-SHA-512 cannot be offered with brokerSasl.identity client",
        ),
        (
            {
                "tls": {"enabled": True, "secretName": "t"},
                "brokerTls": {"enabled": True, "ca": {"secretName": "c", "mountPath": "/etc/kfan/tls"}},
            },
            "the Secrets of tls and broker-ca are both mounted at /etc/kfan/tls",
        ),
    ],
)
def test_security_values_that_do_not_fit_together_are_refused(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(BASE | values)
    assert complaint in str(caught.value)


def test_broker_identity_client_offers_only_replayable_mechanisms() -> None:
    values = BASE | {
        "brokerSasl": {"identity": "client", "mechanism": "PLAIN", "username": "kfan", "password": {"secretName": "p"}},
        "clientAuth": {"mode": "sasl"},
    }
    env = kfan_env(render(values))
    assert (env["KFAN_BROKER_IDENTITY"], env["KFAN_CLIENT_AUTH"]) == ("client", "sasl")
    assert "KFAN_CLIENT_USERS" not in env  # the brokers check PLAIN passwords
    text = notes(values)
    assert "security.protocol=SASL_PLAINTEXT" in text and "sasl.mechanisms one of PLAIN." in text
    assert "WARNING: clientAuth.mode is sasl but tls is not enabled" in text
    text = notes(SECURE)
    assert "security.protocol=SASL_SSL" in text and "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER" in text
    assert "SASL SCRAM-SHA-512 as User:kfan over TLS" in text and "WARNING" not in text
    assert "security.protocol=PLAINTEXT." in notes(BASE)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({}, "at '/kafka/bootstrap': minLength"),
        ({"kafka": {"bootstrap": ""}}, "at '/kafka/bootstrap': minLength"),
        ({"kafka": {"bootstrap": []}}, "at '/kafka/bootstrap': minItems"),
        ({"kafka": {"bootstrap": "kafka-0"}}, "at '/kafka/bootstrap': 'kafka-0' does not match pattern"),
        ({"kafka": {"bootstrap": "a:9092"}, "workers": 0}, "at '/workers': minimum"),
        ({"kafka": {"bootstrap": "a:9092"}, "logLevel": "TRACE"}, "at '/logLevel'"),
        ({"kafka": {"bootstrap": "a:9092"}, "replicas": 3}, "additional properties 'replicas' not allowed"),
        ({"kafka": {"bootstrap": "a:9092"}, "tls": {"enabled": True}}, "at '/tls/secretName'"),
        (
            {"kafka": {"bootstrap": "a:9092"}, "clientAuth": {"mode": "ldap"}},
            "at '/clientAuth/mode': value must be one of 'none', 'mtls', 'sasl'",
        ),
        (
            {"kafka": {"bootstrap": "a:9092"}, "clientAuth": {"mechanisms": ["GSSAPI"]}},
            "at '/clientAuth/mechanisms/0': value must be one of",
        ),
        ({"kafka": {"bootstrap": "a:9092"}, "clientAuth": {"mechanisms": ["PLAIN", "PLAIN"]}}, "at '/clientAuth/mechanisms'"),
        (
            {"kafka": {"bootstrap": "a:9092"}, "clientAuth": {"sessionLifetimeSeconds": -1}},
            "at '/clientAuth/sessionLifetimeSeconds': minimum",
        ),
        ({"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"mechanism": "GSSAPI"}}, "at '/brokerSasl/mechanism'"),
        (
            {"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"identity": "user"}},
            "at '/brokerSasl/identity': value must be one of 'kfan', 'client'",
        ),
        ({"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"mechanism": "SCRAM-SHA-512"}}, "at '/brokerSasl/username': minLength"),
        (
            {"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"mechanism": "PLAIN", "username": "kfan"}},
            "at '/brokerSasl/password/secretName': minLength",
        ),
        ({"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"mechanism": "OAUTHBEARER"}}, "at '/brokerSasl/token/secretName': minLength"),
        # A password is a Secret's name and key, never the password itself.
        ({"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"password": "hunter2"}}, "at '/brokerSasl/password': got string, want object"),
        (
            {"kafka": {"bootstrap": "a:9092"}, "brokerSasl": {"passwordValue": "hunter2"}},
            "additional properties 'passwordValue' not allowed",
        ),
        ({"kafka": {"bootstrap": "a:9092"}, "tls": {"certFile": "../tls.crt"}}, "at '/tls/certFile'"),
        ({"kafka": {"bootstrap": "a:9092"}, "brokerTls": {"ca": {"mountPath": "etc/ca"}}}, "at '/brokerTls/ca/mountPath'"),
        ({"kafka": {"bootstrap": "a:9092"}, "clientAuth": {"users": {"secretName": "Users_File"}}}, "at '/clientAuth/users/secretName'"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(values)
    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert complaint in str(caught.value)


def test_probes_hit_healthz_and_readyz_on_the_metrics_listener() -> None:
    for values in (BASE, BASE | {"containerPorts": {"metrics": 9300}}):
        docs = render(values)
        c = container(docs)
        metrics_port = values.get("containerPorts", {}).get("metrics", 9100)
        live, ready = c["livenessProbe"]["httpGet"], c["readinessProbe"]["httpGet"]
        assert live["path"] == "/healthz" and ready["path"] == "/readyz"
        assert port_number(c, live["port"]) == port_number(c, ready["port"]) == metrics_port
        # ... which is where kfan serves them.
        options = resolve(vars(build_parser().parse_args(c["args"])), kfan_env(docs))
        assert options["metrics_listen"] == ("0.0.0.0", metrics_port)
        service_port = next(p for p in one(docs, "Service")["spec"]["ports"] if p["name"] == "metrics")
        assert port_number(c, service_port["targetPort"]) == metrics_port


def test_every_kfan_variable_and_flag_is_a_real_kfan_option(tmp_path: Path) -> None:
    for values, bootstrap in (
        (BASE, [("kafka-0.kafka-headless.kafka.svc", 9092), ("kafka-1.kafka-headless.kafka.svc", 9092)]),
        (EVERYTHING, [("kafka-0.kafka", 9092), ("kafka-1.kafka", 9092)]),
    ):
        docs = render(values)
        env = kfan_env(docs)
        assert {k for k in env if k.startswith("KFAN_")} <= KFAN_ENV
        c = container(docs)
        flags = {a[2:].split("=")[0] for a in c["args"] if a.startswith("--")}
        assert flags <= OPTION_NAMES
        # kfan's own parsers take every value the chart hands it.
        if "KFAN_CONFIG" in env:
            config_file = tmp_path / "kfan.toml"
            config_file.write_text(values["configFile"])
            env["KFAN_CONFIG"] = str(config_file)
        options = resolve(vars(build_parser().parse_args(c["args"])), env)
        assert options["bootstrap"] == bootstrap
    assert options["advertise"] == ("kfan.example.com", 19092)
    assert options["listen"] == ("0.0.0.0", 9192)
    assert (options["node_id"], options["workers"], options["log_level"], options["log_json"]) == (7, 2, "DEBUG", True)
    assert (options["broker_ids"], options["broker_port_base"]) == ("cluster", 30000)
    assert options["rack"] == "us-east-1b"
    assert (options["shutdown_timeout"], options["max_inflight"], options["max_frame_bytes"]) == (12.5, 512, 52428800)
    assert {k: options[k] for k in ("max_connection_bytes", "max_buffered_bytes", "fetch_ahead_bytes")} == {
        "max_connection_bytes": 33554432,
        "max_buffered_bytes": 268435456,
        "fetch_ahead_bytes": 8388608,
    }
    assert (options["max_connections"], options["max_unauthenticated_per_address"], options["max_unauthenticated_bytes"]) == (
        4000,
        8,
        16777216,
    )
    assert (options["request_timeout"], options["max_hold"], options["idle_timeout"], options["frame_timeout"]) == (20, 120, 300, 15.5)
    assert (options["metadata_refresh"], options["read_replica_max_age"]) == (10.0, 60)
    assert str(options["capture"]) == "/capture"
    assert {k: str(options[k]) for k in ("tls_cert", "tls_key", "tls_client_ca", "client_users", "client_oauth_jwks")} == {
        "tls_cert": "/etc/kfan/tls/server.pem",
        "tls_key": "/etc/kfan/tls/server-key.pem",
        "tls_client_ca": "/etc/kfan/apps-ca/ca.pem",
        "client_users": "/etc/kfan/users/users.json",
        "client_oauth_jwks": "/etc/kfan/jwks/jwks.json",
    }
    assert (options["broker_tls"], options["broker_tls_server_name"], str(options["broker_tls_ca"])) == (
        True,
        "kafka.internal",
        "/etc/kfan/kafka-ca/ca.crt",
    )
    assert (str(options["broker_tls_cert"]), str(options["broker_tls_key"])) == (
        "/etc/kfan/kafka-cert/tls.crt",
        "/etc/kfan/kafka-cert/tls.key",
    )
    assert (options["broker_sasl_mechanism"], options["broker_sasl_username"], str(options["broker_sasl_password_file"])) == (
        "SCRAM-SHA-512",
        "kfan",
        "/etc/kfan/kafka-sasl/pw",
    )
    assert options["broker_sasl_password"] is None and options["broker_sasl_token_file"] is None
    assert (options["broker_identity"], options["client_auth"], options["client_sasl_mechanisms"]) == (
        "kfan",
        "sasl",
        ("SCRAM-SHA-512", "OAUTHBEARER"),
    )
    assert (options["client_oauth_issuer"], options["client_oauth_audience"], options["client_oauth_clock_skew"]) == (
        "https://idp.example.com/",
        "kafka",
        10,
    )
    assert (options["client_session_lifetime"], options["client_auth_failure_delay"]) == (3600, 0.5)


def test_extra_env_takes_kfan_options_the_chart_does_not_set_and_nothing_else() -> None:
    accepted, owned = set(), set()
    for o in OPTIONS:
        try:
            env = kfan_env(render(BASE | {"extraEnv": {o.env: "1"}}))
        except helm.HelmRenderError as e:
            assert f"extraEnv.{o.env}: the chart sets {o.env} from the value" in str(e)
            owned.add(o.env)
        else:
            assert env[o.env] == "1"
            accepted.add(o.env)
    # Every option of kfan can be set one way or the other.
    assert accepted | owned == {o.env for o in OPTIONS}
    assert {"KFAN_BOOTSTRAP", "KFAN_LISTEN", "KFAN_METRICS_LISTEN", "KFAN_SHUTDOWN_TIMEOUT"} <= owned
    with pytest.raises(helm.HelmRenderError, match="extraEnv.KFAN_BOOTSTRAP_SERVERS: not an option of kfan serve"):
        render(BASE | {"extraEnv": {"KFAN_BOOTSTRAP_SERVERS": "a:9092"}})
    with pytest.raises(helm.HelmRenderError, match='configFile: "metrics-listen" is set by the chart'):
        render(BASE | {"configFile": 'max-inflight = 5\nmetrics-listen = "0.0.0.0:1"\n'})
    # Every security option comes from the chart's values and Secrets: a password never lands in a ConfigMap.
    assert {o.env for o in OPTIONS if o.name.startswith(("tls-", "broker-", "client-"))} <= owned
    with pytest.raises(
        helm.HelmRenderError, match="extraEnv.KFAN_BROKER_SASL_PASSWORD: the chart sets .* a password never goes into the ConfigMap"
    ):
        render(BASE | {"extraEnv": {"KFAN_BROKER_SASL_PASSWORD": "hunter2"}})
    for line in ('broker-sasl-password = "hunter2"', '  "broker_sasl_password"="hunter2"', "client-auth = 'sasl'"):
        with pytest.raises(helm.HelmRenderError, match=r'configFile: "(broker[-_]sasl[-_]password|client-auth)" is set by the chart'):
            render(BASE | {"configFile": f"max-inflight = 5\n{line}\n"})


def test_the_rack_is_a_fixed_zone_or_the_pods_own_zone_label_never_both() -> None:
    assert "KFAN_RACK" not in kfan_env(render(BASE)), "kfan has a rack by default"
    assert kfan_env(render(BASE | {"rack": "us-east-1a"}))["KFAN_RACK"] == "us-east-1a"
    c = container(render(BASE | {"rackFromNodeZone": True}))
    (entry,) = [e for e in c["env"] if e["name"] == "KFAN_RACK"]
    assert entry["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}
    with pytest.raises(helm.HelmRenderError, match="rack and rackFromNodeZone: set one"):
        render(BASE | {"rack": "us-east-1a", "rackFromNodeZone": True})


# Each chart value that sets one of kfan's limits or timeouts: its name, the variable it sets, a value to
# set, and that value as the variable holds it (bytes as integers, never 4.294967296e+09).
LIMITS: tuple[tuple[str, str, int | float, str], ...] = (
    ("limits.maxFrameBytes", "KFAN_MAX_FRAME_BYTES", 52428800, "52428800"),
    ("limits.maxInflight", "KFAN_MAX_INFLIGHT", 64, "64"),
    ("limits.maxConnectionBytes", "KFAN_MAX_CONNECTION_BYTES", 134217728, "134217728"),
    ("limits.maxBufferedBytes", "KFAN_MAX_BUFFERED_BYTES", 4294967296, "4294967296"),
    ("limits.fetchAheadBytes", "KFAN_FETCH_AHEAD_BYTES", 0, "0"),
    ("limits.maxConnections", "KFAN_MAX_CONNECTIONS", 2500, "2500"),
    ("limits.maxUnauthenticatedPerAddress", "KFAN_MAX_UNAUTHENTICATED_PER_ADDRESS", 16, "16"),
    ("limits.maxUnauthenticatedBytes", "KFAN_MAX_UNAUTHENTICATED_BYTES", 8388608, "8388608"),
    ("limits.requestTimeoutSeconds", "KFAN_REQUEST_TIMEOUT", 45, "45"),
    ("limits.maxHoldSeconds", "KFAN_MAX_HOLD", 0, "0"),
    ("limits.idleTimeoutSeconds", "KFAN_IDLE_TIMEOUT", 540.5, "540.5"),
    ("limits.frameTimeoutSeconds", "KFAN_FRAME_TIMEOUT", 12, "12"),
    ("limits.connectionMaxAgeSeconds", "KFAN_CONNECTION_MAX_AGE", 3600, "3600"),
    ("limits.connectionMaxAgeJitterSeconds", "KFAN_CONNECTION_MAX_AGE_JITTER", 300, "300"),
    ("kafka.metadataRefreshSeconds", "KFAN_METADATA_REFRESH", 10, "10"),
    ("readReplicaMaxAgeSeconds", "KFAN_READ_REPLICA_MAX_AGE", 0.25, "0.25"),
    ("telemetry.maxBytes", "KFAN_TELEMETRY_MAX_BYTES", 65536, "65536"),
    ("telemetry.maxClientInstances", "KFAN_TELEMETRY_MAX_CLIENT_INSTANCES", 200, "200"),
    ("authorization.checkSeconds", "KFAN_ACL_FILE_CHECK", 5, "5"),
    ("audit.queueEvents", "KFAN_AUDIT_QUEUE_EVENTS", 500, "500"),
)
LIMIT_ENV = {env for _, env, _, _ in LIMITS}


def with_value(path: str, value: Any, values: dict[str, Any] = BASE) -> dict[str, Any]:
    """``values`` with the dotted ``path`` set to ``value`` (the maps on the way merged, not replaced)."""
    out = json.loads(json.dumps(values))
    *parents, leaf = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return out


def _option(env: str) -> Any:
    return next(o for o in OPTIONS if o.env == env)


def test_limits_unset_leave_kfans_own_defaults() -> None:
    docs = render(BASE)
    env = kfan_env(docs)
    assert not LIMIT_ENV & set(env), "the chart restates a default kfan keeps itself"
    options = resolve(vars(build_parser().parse_args(container(docs)["args"])), env)
    for _, var, _, _ in LIMITS:
        assert options[_option(var).dest] == _option(var).default
    # What the chart's README says kfan's default is, kfan's default is.
    readme = (CHART / "README.md").read_text()
    for path, var, _, _ in LIMITS:
        row = re.search(rf"^\| `{re.escape(path)}` \| `null` \|.*\(`{var}`\).*null: kfan's default, `([0-9.]+)`", readme, re.M)
        assert row, f"README: no row for {path} naming {var} and kfan's default"
        assert float(row.group(1)) == _option(var).default, path


@pytest.mark.parametrize(("path", "var", "value", "written"), LIMITS, ids=[p for p, *_ in LIMITS])
def test_each_limit_value_sets_its_kfan_option_in_the_pod(path: str, var: str, value: int | float, written: str) -> None:
    base = render(BASE)
    docs = render(with_value(path, value))
    for doc in docs:
        validate(doc)
    env = kfan_env(docs)
    assert env[var] == written
    assert LIMIT_ENV & set(env) == {var}, "one value sets one option"
    # kfan's own parser reads it as the value given.
    options = resolve(vars(build_parser().parse_args(container(docs)["args"])), env)
    assert options[_option(var).dest] == value
    # A changed limit rolls the pods: they read their environment when they start.
    checksum = "checksum/config"
    template = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert template[checksum] != one(base, "Deployment")["spec"]["template"]["metadata"]["annotations"][checksum]


def test_limit_values_all_at_once_are_valid_and_lint() -> None:
    values = BASE
    for path, _, value, _ in LIMITS:
        values = with_value(path, value, values)
    docs = render(values)
    for doc in docs:
        validate(doc)
    assert {k: v for k, v in kfan_env(docs).items() if k in LIMIT_ENV} == {var: written for _, var, _, written in LIMITS}
    report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_a_limit_given_a_value_is_set_in_one_place_only() -> None:
    for path, var, value, _ in LIMITS:
        with pytest.raises(helm.HelmRenderError, match=f"extraEnv.{var}: the value {re.escape(path)} sets {var} already"):
            render(with_value(path, value, BASE | {"extraEnv": {var: "1"}}))
        key = _option(var).name
        with pytest.raises(helm.HelmRenderError, match=f'configFile: "{key}" is set by the chart'):
            render(with_value(path, value, BASE | {"configFile": f"{key} = 1\n"}))
    # Unset, extraEnv and configFile still take them: releases made before these values keep rendering.
    assert kfan_env(render(BASE | {"extraEnv": {"KFAN_MAX_FRAME_BYTES": "52428800"}}))["KFAN_MAX_FRAME_BYTES"] == "52428800"
    assert kfan_env(render(BASE | {"configFile": "max-inflight = 512\n"}))["KFAN_CONFIG"]


def _bad_limit_values() -> list[tuple[str, Any, str]]:
    """(value's name, a bad value, a regular expression of Helm's complaint)."""
    cases = []
    for path, *_ in LIMITS:
        at = re.escape(f"at '/{path.replace('.', '/')}': ")
        cases.append((path, -1, at + "(exclusiveM|m)inimum: got -1"))
        cases.append((path, "64Mi" if "Bytes" in path else "10s", at + "got string, want null or"))
        cases.append((path, True, at + "got boolean"))
        if "Seconds" not in path:
            cases.append((path, 1.5, at + "got number, want null or integer"))
    # Zero where kfan would misbehave: every frame or idle connection timed out at once, a refresh loop, no request at all.
    for path in ("limits.idleTimeoutSeconds", "limits.frameTimeoutSeconds", "limits.requestTimeoutSeconds", "kafka.metadataRefreshSeconds"):
        cases.append((path, 0, re.escape(f"at '/{path.replace('.', '/')}': exclusiveMinimum")))
    for path in ("limits.maxInflight", "limits.maxConnections", "limits.maxUnauthenticatedPerAddress"):
        cases.append((path, 0, re.escape(f"at '/{path.replace('.', '/')}': minimum")))
    cases.append(("limits.maxFrameBytes", 1000, re.escape("at '/limits/maxFrameBytes': minimum")))
    cases.append(("limits.maxBufferedBytes", 2**60, re.escape("at '/limits/maxBufferedBytes': maximum")))  # past float64's exact integers
    cases.append(("limits.maxFrameByte", 1, re.escape("at '/limits': additional properties 'maxFrameByte' not allowed")))
    return cases


@pytest.mark.parametrize(("path", "value", "complaint"), _bad_limit_values())
def test_schema_refuses_bad_limit_values(path: str, value: Any, complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(with_value(path, value))
    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert re.search(complaint, str(caught.value)), str(caught.value)


def test_every_kfan_limit_and_timeout_has_a_chart_value() -> None:
    """A kfan option counted in bytes, seconds or N is a chart value: one of LIMITS, or one the chart
    sets from a value of its own (extraEnv refuses it); a new kfan limit fails here until the chart has it."""
    for o in OPTIONS:
        if o.metavar not in ("BYTES", "SECONDS", "N") or o.env in LIMIT_ENV:
            continue
        with pytest.raises(helm.HelmRenderError, match=f"extraEnv.{o.env}: the chart sets {o.env} from the value"):
            render(BASE | {"extraEnv": {o.env: "1"}})
    assert LIMIT_ENV <= {o.env for o in OPTIONS}


def test_pdb_hpa_and_servicemonitor_render_only_when_enabled_and_validate() -> None:
    off = render(BASE | {"podDisruptionBudget": {"enabled": False}})
    assert not {d["kind"] for d in off} & {"PodDisruptionBudget", "HorizontalPodAutoscaler", "ServiceMonitor"}

    docs = render(BASE)
    pdb, deployment = one(docs, "PodDisruptionBudget"), one(docs, "Deployment")
    assert pdb["spec"] == {"minAvailable": 1, "selector": deployment["spec"]["selector"]}
    # One replica: a budget that could never be met would block node drains.
    assert one(render(BASE | {"replicaCount": 1}), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    with pytest.raises(helm.HelmRenderError, match="not both"):
        render(BASE | {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}})

    docs = render(BASE | {"autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 9}})
    hpa, deployment = one(docs, "HorizontalPodAutoscaler"), one(docs, "Deployment")
    validate(hpa)
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 9)
    assert hpa["spec"]["metrics"][0]["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    assert "replicas" not in deployment["spec"]  # the HPA owns it
    with pytest.raises(helm.HelmRenderError, match="minReplicas"):
        render(BASE | {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}})

    docs = render(BASE | {"serviceMonitor": {"enabled": True}})
    monitor, service = one(docs, "ServiceMonitor"), one(docs, "Service")
    validate(monitor)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # The CRD's schema does bite: a typo is refused.
    monitor["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)


def test_helm_lint_passes() -> None:
    for values in (BASE, EVERYTHING):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report
    # Lint does report a chart that cannot be installed as it is.
    report = helm.lint(CHART, None, namespace=NAMESPACE)
    assert any("/kafka/bootstrap" in e for e in report["errors"]), report


def test_container_runs_kfan_serve_as_the_dockerfile_builds_it() -> None:
    docs = render(BASE)
    c = container(docs)
    assert c["command"] == ["kfan"]
    assert c["args"][0] == "serve"
    # `kfan` is kfan's console script, and the real CLI accepts these arguments.
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kfan"] == "proxy.__main__:main"
    assert build_parser().parse_args(c["args"]).command == "serve"
    done = subprocess.run([sys.executable, "-m", "proxy", *c["args"], "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    dockerfile = (ROOT / "Dockerfile").read_text()
    runtime = dockerfile.rsplit("\nFROM ", 1)[1]
    assert json.loads(re.search(r"^ENTRYPOINT (.+)$", runtime, re.M).group(1)) == c["command"]
    assert json.loads(re.search(r"^CMD (.+)$", runtime, re.M).group(1)) == c["args"][:1]
    user, group = re.search(r"^USER (\d+):(\d+)$", runtime, re.M).groups()
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(user), int(group))
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", runtime, re.M).group(1).split()}
    assert {p["containerPort"] for p in c["ports"]} == exposed
    # The build context holds every package pyproject.toml installs.
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert not ignored & {*packages, "pyproject.toml", "README.md"}


def test_security_context_is_non_root_with_a_read_only_root() -> None:
    docs = render(BASE)
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    c = container(docs)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])


def test_grace_period_covers_the_prestop_sleep_and_kfans_drain() -> None:
    for values, grace in (
        (BASE, 5 + 25 + 5),
        (BASE | {"shutdownTimeoutSeconds": 60}, 5 + 60 + 5),
        (BASE | {"shutdownTimeoutSeconds": 9.2, "preStopSleepSeconds": 0}, 0 + 10 + 5),
        (BASE | {"terminationGracePeriodSeconds": 120}, 120),
        (BASE | {"drainPeriodSeconds": 9.5}, 5 + 11 + 25 + 5),
    ):
        docs = render(values)
        pod = one(docs, "Deployment")["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        drain = float(kfan_env(docs)["KFAN_SHUTDOWN_TIMEOUT"])
        assert drain == values.get("shutdownTimeoutSeconds", 25)
        sleep = values.get("preStopSleepSeconds", 5)
        hook = pod["containers"][0].get("lifecycle", {}).get("preStop")
        assert (hook["exec"]["command"] == ["sleep", str(sleep)]) if sleep else hook is None
        assert float(kfan_env(docs)["KFAN_DRAIN_PERIOD"]) == values.get("drainPeriodSeconds", 0)
        assert grace >= sleep + values.get("drainPeriodSeconds", 0) + drain + 5
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds 30 is shorter than kfan's shutdown"):
        render(BASE | {"terminationGracePeriodSeconds": 30})


def test_a_rolling_update_keeps_every_replica_ready() -> None:
    """By default a new pod is ready before an old one goes (maxUnavailable 0, maxSurge 1); both are values."""
    strategy = one(render(BASE), "Deployment")["spec"]["strategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    custom = one(render(BASE | {"rollingUpdate": {"maxUnavailable": "25%", "maxSurge": 2}}), "Deployment")["spec"]["strategy"]
    assert custom["rollingUpdate"] == {"maxUnavailable": "25%", "maxSurge": 2}
    with pytest.raises(helm.HelmValuesError):
        render(BASE | {"rollingUpdate": {"maxUnavailable": "most"}})


def test_anti_affinity_and_topology_spread() -> None:
    def pod(values: dict[str, Any]) -> dict[str, Any]:
        return one(render(BASE | values), "Deployment")["spec"]["template"]["spec"]

    selector = one(render(BASE), "Deployment")["spec"]["selector"]
    soft = pod({})["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert soft["labelSelector"] == selector and soft["topologyKey"] == "kubernetes.io/hostname"
    hard = pod({"podAntiAffinity": "hard"})["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert hard["labelSelector"] == selector
    assert "affinity" not in pod({"podAntiAffinity": ""})
    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    assert pod({"affinity": custom})["affinity"] == custom
    zone = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}
    own = {"matchLabels": {"tier": "edge"}}
    spread = pod({"topologySpreadConstraints": [zone, zone | {"labelSelector": own}]})["topologySpreadConstraints"]
    assert spread == [zone | {"labelSelector": selector}, zone | {"labelSelector": own}]


def _leaves(values: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for k, v in values.items():
        if isinstance(v, dict) and v and k not in ("podSecurityContext", "securityContext", "resources", "livenessProbe", "readinessProbe"):
            out += _leaves(v, f"{prefix}{k}.")
        else:
            out.append(prefix + k)
    return out


def test_docs_cover_every_value_and_name_only_real_options() -> None:
    readme = (CHART / "README.md").read_text()
    sidecar = (CHART / "SIDECAR.md").read_text()
    values_yaml = (CHART / "values.yaml").read_text()
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    defaults = yaml.safe_load(values_yaml)
    assert set(_leaves(defaults)) <= documented
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]) - {"global"} == set(defaults)
    for text in (readme, sidecar, values_yaml, (CHART / "templates" / "NOTES.txt").read_text()):
        assert set(re.findall(r"\bKFAN_[A-Z_]+[A-Z]\b", text)) <= KFAN_ENV
    # Every kfan command line in the recipes is one kfan's own parser takes.
    for text in (readme, sidecar):
        shell = "\n".join(re.findall(r"^```sh\n(.*?)^```", text, re.M | re.S))
        commands = [shlex.split(m, comments=True) for m in re.findall(r"^(?:\S+=\S+ )*(kfan .*)$", shell, re.M)]
        args = [m for m in re.findall(r"^ *- (--[a-z-]+=\S+)$", text, re.M)]
        if args:
            commands.append(["kfan", "serve", *args])
        assert commands or text is readme
        for command in commands:
            build_parser().parse_args(command[1:])


@pytest.mark.parametrize("workers", [1, 2])
def test_rendered_configuration_runs_a_real_kfan(cluster: Any, workers: int) -> None:
    """The Deployment's command, args and ConfigMap start kfan: ready on /readyz, and SIGTERM
    ends it cleanly, draining within the shutdown timeout the pod's grace period is sized for
    (test_grace_period_covers_the_prestop_sleep_and_kfans_drain checks that sizing)."""
    shutdown_timeout = 5
    kfan = start_rendered(
        lambda kafka_port, metrics_port: (
            BASE
            | {
                "kafka": {"bootstrap": cluster.bootstrap},
                "containerPorts": {"kafka": kafka_port, "metrics": metrics_port},
                "advertise": f"127.0.0.1:{kafka_port}",
                "workers": workers,
                "shutdownTimeoutSeconds": shutdown_timeout,
            }
        )
    )
    c = container(kfan.docs)
    assert c["command"] == ["kfan"]  # the console script; `python -m proxy` is the same command
    process = kfan.process
    try:
        metrics = f"http://127.0.0.1:{kfan.metrics_port}"
        assert probe_status(metrics + c["livenessProbe"]["httpGet"]["path"]) == 200
        with socket.create_connection(("127.0.0.1", kfan.kafka_port), timeout=5):
            pass
        pod = one(kfan.docs, "Deployment")["spec"]["template"]["spec"]
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)  # against a hang only: how long it took is reported, never judged
        print(
            f"kfan (workers={workers}) exited {time.monotonic() - started:.1f} s after SIGTERM; grace period {pod['terminationGracePeriodSeconds']} s"
        )
        assert code == 0, kfan.output()

        # Each serving process drained bounded by the chart's shutdownTimeoutSeconds, and ended with
        # nothing left to close (its other ending says "still busy after", and closes connections).
        def said(pattern: str) -> int:
            return sum(1 for line in list(kfan.log) if re.search(pattern, line))

        drain = rf"stopping: \d+ client connections to drain \(up to {shutdown_timeout} s\)"
        wait_for(f"{workers} process(es) to say how long they drain", lambda: said(drain) >= workers, seen=kfan.output)
        wait_for(
            f"{workers} process(es) to say they drained", lambda: said(r"stopping: every connection drained") >= workers, seen=kfan.output
        )
    finally:
        stop_process(process, 5)


def _kubelet(docs: list[dict[str, Any]], secrets: dict[str, dict[str, bytes]]) -> None:
    """Write each Secret volume's files where the pod would see them, as the kubelet does."""
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    for volume in spec["volumes"]:
        if "secret" not in volume:
            continue
        directory = Path(mounts[volume["name"]]["mountPath"])
        directory.mkdir(parents=True, exist_ok=True)
        for item in volume["secret"]["items"]:
            path = directory / item["path"]
            path.write_bytes(secrets[volume["secret"]["secretName"]][item["key"]])
            path.chmod(volume["secret"]["defaultMode"])


def test_rendered_security_configuration_runs_kfan_against_a_tls_sasl_cluster(tmp_path_factory: pytest.TempPathFactory) -> None:
    """TLS and SASL on both sides, from the chart's values and Secrets: kfan gets ready, and a
    SASL_SSL client with a certificate (mTLS) produces and consumes through it."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    work = tmp_path_factory.mktemp("chart-secure")
    pod = work / "pod"  # the mount paths of the pod, here
    with SecureCluster(work / "cluster", mtls=True, client_cn="kfan") as sc:

        def values_for(kafka_port: int, metrics_port: int) -> dict[str, Any]:
            return BASE | {
                "kafka": {"bootstrap": sc.bootstrap},
                "containerPorts": {"kafka": kafka_port, "metrics": metrics_port},
                "advertise": f"localhost:{kafka_port}",
                "shutdownTimeoutSeconds": 5,
                "tls": {
                    "enabled": True,
                    "secretName": "kfan-tls",
                    "mountPath": str(pod / "tls"),
                    "clientCA": {"enabled": True, "secretName": "apps-ca", "mountPath": str(pod / "client-ca")},
                },
                "brokerTls": {
                    "enabled": True,
                    "ca": {"secretName": "kafka-ca", "mountPath": str(pod / "broker-ca")},
                    "clientCert": {"secretName": "kfan-kafka-cert", "mountPath": str(pod / "broker-tls")},
                },
                "brokerSasl": {
                    "mechanism": "SCRAM-SHA-512",
                    "username": "kfan",
                    "password": {"secretName": "kfan-kafka-sasl", "mountPath": str(pod / "broker-sasl")},
                },
                "clientAuth": {
                    "mode": "sasl",
                    "mechanisms": ["SCRAM-SHA-512"],
                    "users": {"secretName": "kfan-users", "mountPath": str(pod / "users")},
                },
            }

        # Where the Secrets go and what the objects hold of them does not depend on the ports.
        docs = render(values_for(9092, 9100))

        # The Secrets an operator would create: kfan's server certificate, the CA of the applications'
        # client certificates, the brokers' CA, kfan's broker client certificate, its password, the users file.
        certs = work / "certs"
        server = Authority("kfan").server(certs, "localhost", "127.0.0.1")
        apps = Authority("apps")
        app = apps.client(certs, "orders-app")
        users = work / "users.json"
        added = subprocess.run(
            [sys.executable, "-m", "proxy", "users", "add", "alice", "--mechanism", "SCRAM-SHA-512", "--client-users", str(users)],
            cwd=ROOT,
            input="alice-password\n",
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert added.returncode == 0, added.stderr
        secrets = {
            "kfan-tls": {"tls.crt": server.cert.read_bytes(), "tls.key": server.key.read_bytes(), "ca.crt": server.ca.read_bytes()},
            "apps-ca": {"ca.crt": app.ca.read_bytes()},
            "kafka-ca": {"ca.crt": sc.ca_file.read_bytes()},
            "kfan-kafka-cert": {"tls.crt": sc.client_cert_file.read_bytes(), "tls.key": sc.client_key_file.read_bytes()},
            "kfan-kafka-sasl": {"password": (sc.users["kfan"] + "\n").encode()},  # as `kubectl create secret --from-file` keeps it
            "kfan-users": {"users.json": users.read_bytes()},
        }
        rendered = "\n".join(yaml.safe_dump(d) for d in docs)
        for secret in secrets.values():
            for content in secret.values():
                assert content.strip().decode() not in rendered
        assert sc.users["kfan"] not in rendered
        _kubelet(docs, secrets)

        kfan = start_rendered(values_for)
        try:
            metrics = f"http://127.0.0.1:{kfan.metrics_port}"

            topic = f"chart-secure-{uuid.uuid4().hex[:8]}"
            sc.mock.create_topic(topic, 6)
            conf = {
                "bootstrap.servers": f"localhost:{kfan.kafka_port}",
                "security.protocol": "SASL_SSL",
                "ssl.ca.location": str(server.ca),
                "ssl.certificate.location": str(app.cert),
                "ssl.key.location": str(app.key),
                "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": "alice",
                "sasl.password": "alice-password",
            }
            errors: list[Any] = []
            producer = Producer({**conf, "linger.ms": 5, "error_cb": errors.append})
            values_sent = [f"secure-{i}".encode() for i in range(30)]
            for i, value in enumerate(values_sent):
                producer.produce(topic, value=value, key=str(i).encode(), on_delivery=lambda err, _msg: err and errors.append(err))
            assert producer.flush(60) == 0 and errors == [], errors
            consumer = Consumer({**conf, "group.id": f"g-{topic}", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
            try:
                consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
                got: list[bytes] = []

                def consumed_all() -> bool:
                    msg = consumer.poll(0.2)
                    if msg is not None:
                        assert msg.error() is None, msg.error()
                        got.append(msg.value())
                    return len(got) >= len(values_sent)

                wait_for("every record produced to be consumed", consumed_all, 60, seen=lambda: f"{len(got)} of {len(values_sent)}")
            finally:
                consumer.close()
            assert sorted(got) == sorted(values_sent)

            # kfan logged in to every broker as itself, over mTLS; and it authenticated the application.
            expected = {("kfan", "SCRAM-SHA-512", b) for b in sc.brokers}

            def logins() -> set[tuple[Any, Any, Any]]:
                return {(e["principal"], e["mechanism"], e["broker"]) for e in sc.front_events("authenticated")}

            wait_for("kfan's login at every broker's front", lambda: logins() >= expected, 30, seen=logins)
            assert logins() == expected
            wait_for("stunnel to log kfan's client certificate", lambda: "CN=kfan" in sc.stunnel_output(), 30, seen=sc.stunnel_output)

            def scrape() -> str:
                with urllib.request.urlopen(metrics + "/metrics", timeout=5) as answer:
                    return answer.read().decode()

            counted = (
                r'^kfan_authentications_total\{mechanism="SCRAM-SHA-512",result="ok"\} [1-9]',
                r'^kfan_authentications_total\{mechanism="mTLS",result="ok"\} [1-9]',
            )

            def scrape_counted() -> str | None:
                text = scrape()
                return text if all(re.search(c, text, re.M) for c in counted) else None

            scraped = wait_for("the application's logins in kfan's metrics", scrape_counted, 30, seen=scrape)
            assert not re.search(r'^kfan_broker_authentications_total\{.*result="failed"\}', scraped, re.M)
            wait_for_line(kfan.log, re.escape("authenticated as User:alice (SCRAM-SHA-512)"))
            wait_for_line(kfan.log, re.escape("TLS client certificate of CN=orders-app"))
            wait_for_line(kfan.log, re.escape("security: brokers: TLS, SASL SCRAM-SHA-512 as kfan"))
        finally:
            stop_process(kfan.process, 15)


def test_acls_are_a_file_in_the_pod_that_kfan_reads_and_the_audit_log_is_configured(tmp_path: Path) -> None:
    acls = '[[acls]]\nprincipal = "User:app"\nresource_type = "TOPIC"\nresource_name = "orders"\noperation = "READ"\n'
    values = {
        "authorization": {"authorizer": "acls", "acls": acls, "log": "all"},
        "audit": {"log": "-", "apis": ["CreateTopics", "DeleteTopics"], "queueEvents": 500, "overflow": "block"},
    }
    docs = render(BASE | values)
    env = kfan_env(docs)
    assert env["KFAN_AUTHORIZER"] == "acls" and env["KFAN_AUTHORIZER_LOG"] == "all"
    assert env["KFAN_ACL_FILE"] == "/etc/kfan/config/acls.toml"
    assert (env["KFAN_AUDIT_LOG"], env["KFAN_AUDIT_APIS"], env["KFAN_AUDIT_QUEUE_EVENTS"], env["KFAN_AUDIT_OVERFLOW"]) == (
        "-",
        "CreateTopics,DeleteTopics",
        "500",
        "block",
    )
    (files,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-file")]
    assert files["data"] == {"acls.toml": acls}
    (tmp_path / "acls.toml").write_text(files["data"]["acls.toml"])
    assert len(read_acls(tmp_path / "acls.toml")) == 1  # what kfan reads, it takes
    # From a Secret instead: mounted whole (no subPath), so that an update reaches kfan.
    docs = render(BASE | {"authorization": {"authorizer": "acls", "aclSecret": {"secretName": "kfan-acls"}}})
    assert kfan_env(docs)["KFAN_ACL_FILE"] == "/etc/kfan/acls/acls.toml"
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "acls")
    assert mount["mountPath"] == "/etc/kfan/acls" and "subPath" not in mount
    # Nothing set: kfan authorizes nothing and audits nothing.
    env = kfan_env(render(BASE))
    assert not {"KFAN_AUTHORIZER", "KFAN_ACL_FILE", "KFAN_AUDIT_LOG", "KFAN_AUDIT_TOPIC"} & set(env)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"authorization": {"authorizer": "acls"}}, "needs the ACLs"),
        ({"authorization": {"authorizer": "acls", "acls": "x", "aclSecret": {"secretName": "s"}}}, "not both"),
        ({"audit": {"log": "-", "topic": "audit"}}, "not both"),
    ],
)
def test_governance_values_that_do_not_fit_together_are_refused(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(Exception, match=complaint):
        render(BASE | values)


def test_telemetry_subscriptions_are_a_file_in_the_pod_that_kfan_reads(tmp_path: Path) -> None:
    toml = '[[subscription]]\nname = "all"\nmetrics = ["*"]\ninterval-ms = 60000\n'
    docs = render(BASE | {"telemetry": {"subscriptions": toml, "maxBytes": 65536}})
    env = kfan_env(docs)
    assert env["KFAN_TELEMETRY_SUBSCRIPTIONS"] == "/etc/kfan/config/telemetry.toml"
    assert env["KFAN_TELEMETRY_MAX_BYTES"] == "65536"
    (files,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-file")]
    assert files["data"] == {"telemetry.toml": toml}
    mount = next(m for m in container(docs)["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/kfan/config"
    (tmp_path / "telemetry.toml").write_text(files["data"]["telemetry.toml"])
    assert load_subscriptions(tmp_path / "telemetry.toml")[0].metrics == ("*",)
    # Without subscriptions, kfan does not serve client telemetry.
    assert "KFAN_TELEMETRY_SUBSCRIPTIONS" not in kfan_env(render(BASE))


def test_quotas_are_a_file_in_the_pod_that_kfan_reads(tmp_path: Path) -> None:
    quotas = '[[quotas]]\nuser = "<default>"\nproducer_byte_rate = 1048576\n'
    docs = render(BASE | {"quotas": quotas})
    assert kfan_env(docs)["KFAN_QUOTA_FILE"] == "/etc/kfan/config/quotas.toml"
    (files,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-file")]
    assert files["data"] == {"quotas.toml": quotas}
    assert any(m["name"] == "config" and m["mountPath"] == "/etc/kfan/config" for m in container(docs)["volumeMounts"])
    (tmp_path / "quotas.toml").write_text(files["data"]["quotas.toml"])
    assert len(read_quotas(tmp_path / "quotas.toml")) == 1  # what kfan reads, it takes
    # No quotas: no file, no option.
    docs = render(BASE)
    assert "KFAN_QUOTA_FILE" not in kfan_env(docs)
    assert not [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-file")]
