"""The chart's Grafana dashboard and Prometheus alerts, held to the metrics kfan really exports.

Every metric name, label name and label value the dashboard's and the alerts' PromQL uses is checked
against what a real kfan serves on /metrics (its ``# TYPE`` lines name every family, labelled ones
included, before any sample) and against kfan's metric families in-process (their label names); a
metric kfan does not export (``up``, kube-state-metrics', cAdvisor's) must be allowed by name below.
Expressions are parsed by promql-parser (the Rust parser of GreptimeDB, its functions Prometheus's),
so a typo, an unknown function or an unbalanced parenthesis fails here rather than in Prometheus.
The PrometheusRule is checked against the fields of prometheus-operator's CRD (kubernetes-validate
knows only Kubernetes' own kinds), the ConfigMap against Kubernetes' schemas.
"""

from __future__ import annotations

import importlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import promql_parser
import pytest
from kubernetes_validate.utils import latest_version

from proxy.server.config import OPTIONS
from proxy.tools.mock_cluster import MockCluster
from tests.support.chart import BASE, CHART, NAMESPACE, ROOT, one, render
from tests.support.kfan import start_kfan
from tests.support.metrics import http_get, metrics_port_in, parse_samples

DASHBOARD_FILE = CHART / "dashboards" / "kfan.json"
ON: dict[str, Any] = BASE | {"grafana": {"dashboard": {"enabled": True}}, "prometheusRule": {"enabled": True}}

# Labels Prometheus gives every series it scrapes through the chart's ServiceMonitor (the target's).
TARGET_LABELS = {"namespace", "job", "pod", "instance", "service", "endpoint", "container"}
# Metrics the dashboard and alerts use that kfan does not export, each with its labels and who exports it.
FOREIGN: dict[str, set[str]] = {
    "up": TARGET_LABELS,  # Prometheus itself, one per scraped target
    "kube_pod_status_ready": {"namespace", "pod", "uid", "condition"},  # kube-state-metrics
    "container_memory_working_set_bytes": {"namespace", "pod", "container", "id", "image", "name"},  # the kubelet's cAdvisor
}
# kfan's labels whose values are numbers (API keys, error codes, broker ids), not names the README lists.
NUMERIC_LABELS = {"api_key", "api_version", "error_code", "broker"}


def dashboard_of(docs: list[dict[str, Any]]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The dashboard's ConfigMap, its data key, and the dashboard."""
    configmap = one(docs, "ConfigMap", "-dashboard")
    ((key, text),) = configmap["data"].items()
    return configmap, key, json.loads(text)


def rules_of(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (group,) = one(docs, "PrometheusRule")["spec"]["groups"]
    return group["rules"]


def _option_default(name: str) -> Any:
    return next(o.default for o in OPTIONS if o.name == name)


# ---- what kfan exports ----


@dataclass
class Exported:
    families: dict[str, str]  # family as /metrics declares it (# TYPE) -> its type
    series: dict[str, str]  # every series name Prometheus stores -> its family
    labels: dict[str, set[str]]  # family -> its label names

    def family(self, series: str) -> str | None:
        return self.series.get(series)


def _series_names(family: str, kind: str) -> set[str]:
    """The names Prometheus stores a family's samples under, as prometheus-client exposes them (its
    _created series it declares as gauge families of their own)."""
    return {
        "counter": {family.removesuffix("_total") + "_total"},
        "histogram": {family + "_bucket", family + "_sum", family + "_count"},
        "summary": {family, family + "_sum", family + "_count"},
    }.get(kind, {family})


def _kfan_metric_objects() -> dict[str, tuple[str, tuple[str, ...]]]:
    """kfan's metric families in this process: name -> (type, label names). Found by importing every
    module of proxy/ and backends/ that uses prometheus-client, wherever the refactoring puts it."""
    from prometheus_client import REGISTRY

    for package in ("proxy", "backends"):
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text()
            if "prometheus_client" in text and re.search(r"\b(Counter|Gauge|Histogram|Summary)\(", text):
                parts = path.relative_to(ROOT).with_suffix("").parts
                # A package's metrics live in its __init__: imported as the package, not a second module.
                importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    out = {}
    # prometheus-client keeps a family's label names in _labelnames only: its collect() of a labelled
    # family with no child yet has no sample to read them from.
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001
        name = getattr(collector, "_name", "")
        if name.startswith("kfan_"):
            out[name] = (collector._type, tuple(collector._labelnames))  # noqa: SLF001
    return out


def _traffic(kfan_bootstrap: str, cluster: MockCluster) -> None:
    """A little of everything kfan serves: produce, consume, a Metadata for an unknown topic."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"obs-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, 3)
    producer = Producer({"bootstrap.servers": kfan_bootstrap, "linger.ms": 5})
    for i in range(30):
        producer.produce(topic, value=b"v%d" % i, key=b"%d" % i)
    assert producer.flush(30) == 0
    producer.list_topics(f"missing-{uuid.uuid4().hex[:8]}", timeout=10)
    consumer = Consumer({"bootstrap.servers": kfan_bootstrap, "group.id": f"g-{topic}", "fetch.wait.max.ms": 50})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        got, deadline = 0, time.monotonic() + 30
        while got < 30 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            got += msg is not None and msg.error() is None
        assert got == 30
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def exported(cluster: MockCluster) -> Iterator[Exported]:
    """What a real kfan (one worker, as the chart's default) serves on /metrics after some traffic."""
    k = start_kfan(cluster.bootstrap, "--metrics-listen", "127.0.0.1:0")
    try:
        port = metrics_port_in(k.log)
        _traffic(k.bootstrap, cluster)
        status, text = http_get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
    finally:
        assert k.stop() == 0, "".join(k.log[-40:])
    families = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))
    series = {s: f for f, kind in families.items() for s in _series_names(f, kind)}
    # Every sample served is of a declared family, under a name Prometheus stores it as.
    assert set(parse_samples(text)) <= set(series), set(parse_samples(text)) - set(series)
    objects = _kfan_metric_objects()
    labels: dict[str, set[str]] = {}
    for name, (kind, names) in objects.items():
        (family,) = {series[s] for s in _series_names(name, kind) if s in series} or {None}
        assert family is not None, f"{name} ({kind}) is defined in kfan but missing from /metrics"
        assert families[family] == kind
        labels[family] = set(names)
    assert {f for f in families if f.startswith("kfan_") and not f.endswith("_created")} == set(labels)
    # The traffic did reach kfan's labelled families.
    assert {"kfan_client_requests_total", "kfan_bytes_total", "kfan_fetch_bytes_total", "kfan_broker_reachable"} <= set(parse_samples(text))
    yield Exported(families, series, labels)


# ---- PromQL ----

_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def _grafana_to_promql(expr: str, variables: set[str]) -> str:
    """A Grafana query as Prometheus gets it: $__rate_interval and friends are ranges, a variable
    outside quotes a number (the budgets); inside a matcher's quotes it stays a string."""
    used = set(re.findall(r"\$\{?(\w+)", expr))
    assert used <= variables | {"__rate_interval", "__interval", "__range"}, f"undefined variables {used - variables} in {expr}"
    expr = re.sub(r"\[\$__\w+\]", "[5m]", expr)
    parts = re.split(f"({_QUOTED.pattern})", expr)
    return "".join(p if p.startswith('"') else re.sub(r"\$\{?\w+\}?", "1", p) for p in parts)


@dataclass
class Selector:
    series: str
    matchers: list[tuple[str, str, str]]  # (label, op, value)


def _selectors(node: Any) -> list[Selector]:
    found: list[Selector] = []

    def visit(n: Any) -> None:
        if isinstance(n, promql_parser.VectorSelector):
            matchers = [(m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in n.matchers.matchers]
            name = n.name or next((v for k, _, v in matchers if k == "__name__"), None)
            assert name, "a selector without a metric name"
            found.append(Selector(name, [m for m in matchers if m[0] != "__name__"]))

    promql_parser.walk(node, visit)
    return found


def check_promql(expr: str, exported: Exported, readme_rows: dict[str, str], *, pinned: set[str]) -> tuple[set[str], Any]:
    """Parse ``expr`` and hold it to kfan's metrics; return the metrics it uses and its syntax tree.
    ``pinned``: labels every kfan selector must match on (so a query never mixes releases)."""
    try:
        tree = promql_parser.parse(expr)
    except ValueError as e:
        raise AssertionError(f"does not parse: {e}\n{expr}") from None
    selectors = _selectors(tree)
    assert selectors or re.fullmatch(r"vector\([0-9.]+\)", expr), expr  # a constant: the budget lines

    def labels_of(s: Selector) -> set[str]:
        family = exported.family(s.series)
        if family is None:
            assert s.series in FOREIGN, f"{s.series} is not a metric kfan exports (nor an allowed one): {expr}"
            return FOREIGN[s.series]
        # kfan's own families, or prometheus-client's process_* and python_* that kfan serves beside them.
        return exported.labels.get(family, set()) | TARGET_LABELS | ({"le"} if s.series.endswith("_bucket") else set())

    for s in selectors:
        known = labels_of(s)
        names = {label for label, _, _ in s.matchers}
        assert names <= known, f"{s.series} has no label {names - known}: {expr}"
        if exported.family(s.series) is not None:
            assert pinned <= names, f"{s.series} is not narrowed to {pinned}: {expr}"
            family = exported.family(s.series)
            for label, op, value in s.matchers:
                if label in TARGET_LABELS or "$" in value or op not in ("Equal", "Re"):
                    continue
                for alternative in value.split("|") if op == "Re" else [value]:
                    if label in NUMERIC_LABELS:
                        assert re.fullmatch(r"-?\d+", alternative), f"{label}={alternative!r}: {expr}"
                    else:
                        # The README's metrics table lists the values of each label whose values are names.
                        assert f"`{alternative}`" in readme_rows.get(family, ""), (
                            f"{family}: {label}={alternative!r} is not a value kfan gives it"
                        )

    def visit(n: Any) -> None:
        # Grouping labels are ones the series inside carry (a typo groups everything into one series).
        modifier = getattr(n, "modifier", None)
        if isinstance(n, promql_parser.AggregateExpr) and modifier is not None:
            inside = set().union(*(labels_of(s) for s in _selectors(n.expr)))
            assert set(modifier.labels) <= inside, f"{n.op} by {set(modifier.labels) - inside}: no such label inside, {expr}"

    promql_parser.walk(tree, visit)
    return {s.series for s in selectors}, tree


@pytest.fixture(scope="module")
def readme_rows() -> dict[str, str]:
    """The main README's metrics table: family -> its row (label values in backticks)."""
    readme = (ROOT / "README.md").read_text()
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `(kfan_\w+)` \| \w+ \|.*$", readme, re.M)}


# ---- the dashboard ----


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row keeps its panels inside


def _dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, set[str]]]:
    """Every PromQL of the dashboard, with the labels its kfan series must be narrowed to: the panels'
    targets to one kfan (namespace and job), the variables' label_values() to those picked before."""
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    queries = [(_grafana_to_promql(t["expr"], variables), {"namespace", "job"}) for p in _panels(dashboard) for t in p.get("targets", [])]
    for v in dashboard["templating"]["list"]:
        if v["type"] == "query":
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v["query"]["query"])
            assert m and v["definition"] == v["query"]["query"], v
            queries.append((_grafana_to_promql(m.group(1), variables), set(re.findall(r'(\w+)="\$\w+"', m.group(1)))))
    return queries


def test_dashboard_file_is_a_dashboard_of_unique_panels_each_with_a_datasource_and_queries() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    panels = list(_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert all(isinstance(i, int) for i in ids) and len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    taken: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, f"panel {p['title']!r} overlaps another"
        taken |= cells
        assert p["title"], p["id"]
        if p["type"] == "row":
            assert "targets" not in p
            continue
        assert p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"]), p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"] == p["datasource"], p["title"]
    # The budgets it compares with, when imported on its own, are kfan's defaults for one worker.
    assert int(variables["buffered_budget"]["query"]) == _option_default("max-buffered-bytes")
    assert int(variables["connection_budget"]["query"]) == _option_default("max-connections")


def test_dashboard_uses_only_metrics_kfan_exports_and_shows_every_family(exported: Exported, readme_rows: dict[str, str]) -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    used: set[str] = set()
    for query, pinned in _dashboard_queries(dashboard):
        names, _ = check_promql(query, exported, readme_rows, pinned=pinned)
        used |= names
    # An operator's view of kfan has all of it: every family kfan exports is on some panel.
    shown = {exported.family(s) for s in used}
    missing = {f for f in exported.labels} - shown
    assert not missing, f"families on no panel: {sorted(missing)}"


def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar_and_made_the_releases_own() -> None:
    assert not [d for d in render(BASE) if d["metadata"]["name"].endswith("-dashboard")], "off by default"
    docs = render(ON | {"workers": 3, "limits": {"maxBufferedBytes": 268435456}})
    configmap, key, dashboard = dashboard_of(docs)
    for version in ("1.25.0", latest_version()):
        kubernetes_validate.validate(configmap, version, strict=True)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == NAMESPACE
    # Small enough for `kubectl apply` too, whose last-applied annotation holds it again (256 KiB).
    assert len(json.dumps(configmap)) < 256 * 1024
    # The file's dashboard, with a uid, title, namespace, job and budgets of this release's.
    original = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["panels"] == original["panels"]
    assert len(dashboard["uid"]) <= 40 and dashboard["uid"] != original["uid"]
    service = one(docs, "Service")["metadata"]["name"]
    assert f"{NAMESPACE}/{service}" in dashboard["title"]
    current = {v["name"]: v["current"].get("value") for v in dashboard["templating"]["list"]}
    assert (current["namespace"], current["job"]) == (NAMESPACE, service)  # the labels the ServiceMonitor gives kfan's series
    assert (current["buffered_budget"], current["connection_budget"]) == (str(3 * 268435456), str(3 * _option_default("max-connections")))
    textboxes = {v["name"]: v["query"] for v in dashboard["templating"]["list"] if v["type"] == "textbox"}
    assert textboxes == {"buffered_budget": str(3 * 268435456), "connection_budget": str(3 * _option_default("max-connections"))}
    # Two releases' dashboards can share one Grafana and one sidecar folder.
    other_configmap, other_key, other = dashboard_of(render(ON, name="edge", namespace=NAMESPACE))
    assert other["uid"] != dashboard["uid"] and other["title"] != dashboard["title"] and other_key != key
    assert len({dashboard_of(render(ON, name=n, namespace="ns" + n))[2]["uid"] for n in ("a", "b", "c")}) == 3
    # Label, value, namespace and annotations as the sidecar is set up.
    configmap, _, _ = dashboard_of(
        render(
            BASE
            | {
                "grafana": {
                    "dashboard": {
                        "enabled": True,
                        "namespace": "monitoring",
                        "label": "grafana.com/dashboard",
                        "labelValue": "kafka",
                        "labels": {"team": "streaming"},
                        "annotations": {"grafana_folder": "Kafka"},
                    }
                }
            }
        )
    )
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert {"grafana.com/dashboard": "kafka", "team": "streaming"}.items() <= configmap["metadata"]["labels"].items()
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Kafka"}
    kubernetes_validate.validate(configmap, latest_version(), strict=True)
    # The longest release name still makes a valid object name.
    for doc in render(ON, name="r" * 53):
        assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", doc["metadata"]["name"]), doc["metadata"]["name"]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"grafana": {"dashboard": {"label": "grafana dashboard"}}}, "at '/grafana/dashboard/label'"),
        ({"grafana": {"dashboard": {"labelValue": 1}}}, "at '/grafana/dashboard/labelValue'"),
        ({"grafana": {"dashboard": {"enabled": "yes"}}}, "at '/grafana/dashboard/enabled'"),
        ({"prometheusRule": {"thresholds": {"budgetRatio": 1.5}}}, "at '/prometheusRule/thresholds/budgetRatio': maximum"),
        ({"prometheusRule": {"thresholds": {"errorRatio": 0}}}, "at '/prometheusRule/thresholds/errorRatio': exclusiveMinimum"),
        ({"prometheusRule": {"thresholds": {"clientAuthenticationFailures": -1}}}, "clientAuthenticationFailures': minimum"),
        ({"prometheusRule": {"disabled": ["KfanTypo"]}}, "at '/prometheusRule/disabled/0'"),
        ({"prometheusRule": {"alertLabels": {"severity": "page"}}}, "at '/prometheusRule/alertLabels'"),
        ({"prometheusRule": {"selector": '{job="kfan"}'}}, "at '/prometheusRule/selector'"),
        ({"prometheusRule": {"routineErrorCodes": [27]}}, "at '/prometheusRule/routineErrorCodes/0'"),
    ],
)
def test_schema_refuses_bad_dashboard_and_alert_values(values: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        render(BASE | values)
    assert complaint in str(caught.value)


# ---- the alerts ----

_DURATION = r"(0|([0-9]+(ms|s|m|h|d|w|y))+)"
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
# PrometheusRule as prometheus-operator's CRD (monitoring.coreos.com/v1) has it, strict about unknown fields.
PROMETHEUSRULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {
            "type": "object",
            "required": ["name", "namespace"],
            "properties": {"name": {"type": "string"}, "namespace": {"type": "string"}, "labels": _STRING_MAP},
        },
        "spec": {
            "type": "object",
            "required": ["groups"],
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "rules"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": f"^{_DURATION}$"},
                            "labels": _STRING_MAP,
                            "limit": {"type": "integer"},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string"},
                                        "record": {"type": "string"},
                                        "expr": {"type": "string", "minLength": 1},
                                        "for": {"type": "string", "pattern": f"^{_DURATION}$"},
                                        "keep_firing_for": {"type": "string", "pattern": f"^{_DURATION}$"},
                                        "labels": _STRING_MAP,
                                        "annotations": _STRING_MAP,
                                    },
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                },
                            },
                        },
                    },
                }
            },
        },
    },
}

# The alerts the chart has (values.schema.json's prometheusRule.disabled names the same).
ALERTS = {
    "KfanNoBrokerReachable": "critical",
    "KfanPodNotReady": "warning",
    "KfanMetricsDown": "warning",
    "KfanClientAuthenticationFailures": "warning",
    "KfanBrokerAuthenticationFailures": "warning",
    "KfanBufferedBytesNearBudget": "warning",
    "KfanConnectionsNearLimit": "warning",
    "KfanConnectionsRefused": "warning",
    "KfanErrorRatioHigh": "warning",
    "KfanInternalError": "warning",
}


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * units[u] for n, u in re.findall(r"(\d+)([smh])", duration))


def _output_labels(tree: Any) -> set[str] | None:
    """The labels an alert's series keep: those of the aggregations' `by`, None when nothing aggregates (all kept)."""
    kept: list[set[str]] = []

    def visit(n: Any) -> None:
        if isinstance(n, promql_parser.AggregateExpr):
            assert n.modifier is not None and str(n.modifier.type).endswith("By"), f"aggregate by what? {n}"
            kept.append(set(n.modifier.labels))

    promql_parser.walk(tree, visit)
    return set.intersection(*kept) if kept else None


def test_alerts_are_a_valid_prometheusrule_of_known_metrics_with_severity_duration_and_text(
    exported: Exported, readme_rows: dict[str, str]
) -> None:
    assert not [d for d in render(BASE) if d["kind"] == "PrometheusRule"], "off by default"
    docs = render(ON)
    rule = one(docs, "PrometheusRule")
    jsonschema.Draft7Validator(PROMETHEUSRULE_SCHEMA).validate(rule)
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", rule["metadata"]["name"]) and rule["metadata"]["namespace"] == NAMESPACE
    rules = rules_of(docs)
    assert {r["alert"]: r["labels"]["severity"] for r in rules} == ALERTS
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["prometheusRule"]["properties"]["disabled"]["items"]["enum"]) == set(ALERTS)
    service = one(docs, "Service")["metadata"]["name"]
    for r in rules:
        assert re.fullmatch(r"Kfan[A-Z][A-Za-z]+", r["alert"])
        assert 60 <= _seconds(r["for"]) <= 15 * 60, f"{r['alert']}: for {r['for']}"
        assert set(r["annotations"]) == {"summary", "description"} and all(r["annotations"].values()), r["alert"]
        _, tree = check_promql(r["expr"], exported, readme_rows, pinned={"namespace", "job"})
        # Every kfan series is this release's: the labels the chart's ServiceMonitor gives them.
        for s in _selectors(tree):
            if s.series.startswith("kfan_") or s.series == "up":
                assert {("namespace", "Equal", NAMESPACE), ("job", "Equal", service)} <= set(s.matchers), r["alert"]
        # The annotations are Prometheus templates of the alert's own labels and value.
        kept = _output_labels(tree)
        for text in r["annotations"].values():
            assert text.count("{{") == text.count("}}"), text
            for action in re.findall(r"\{\{(.*?)\}\}", text):
                assert re.fullmatch(r" (\$labels\.\w+|\$value \| (humanize|humanizePercentage)) ", action), action
            used = set(re.findall(r"\$labels\.(\w+)", text))
            assert kept is None or used <= kept, f"{r['alert']}: {used - kept} is not a label of the alert"
    # kube-state-metrics' readiness of exactly this Deployment's pods (<deployment>-<replicaset hash>-<pod suffix>).
    (ready,) = [r for r in rules if r["alert"] == "KfanPodNotReady"]
    deployment = one(docs, "Deployment")["metadata"]["name"]
    pattern = re.search(r'pod=~"([^"]+)"', ready["expr"]).group(1)
    assert re.fullmatch(pattern, f"{deployment}-5d8f7c9b6-x2x7q") and not re.fullmatch(pattern, f"{deployment}-edge-5d8f7c9b6-x2x7q")


def test_budget_alerts_compare_with_the_releases_limits_or_kfans_defaults() -> None:
    def thresholds(values: dict[str, Any]) -> tuple[int, int]:
        rules = {r["alert"]: r["expr"] for r in rules_of(render(values))}
        buffered = re.search(r"kfan_buffered_bytes\{[^}]*\}\) / (\d+) > 0\.9$", rules["KfanBufferedBytesNearBudget"]).group(1)
        connections = re.search(r"kfan_client_connections\{[^}]*\}\) / (\d+) > 0\.9$", rules["KfanConnectionsNearLimit"]).group(1)
        return int(buffered), int(connections)

    assert thresholds(ON) == (_option_default("max-buffered-bytes"), _option_default("max-connections"))
    assert thresholds(ON | {"workers": 4}) == (4 * _option_default("max-buffered-bytes"), 4 * _option_default("max-connections"))
    assert thresholds(ON | {"workers": 2, "limits": {"maxBufferedBytes": 3221225472, "maxConnections": 2500}}) == (6442450944, 5000)


def test_alerts_follow_their_values() -> None:
    values = ON | {
        "prometheusRule": {
            "enabled": True,
            "namespace": "monitoring",
            "labels": {"release": "prom"},
            "selector": 'namespace="kafka", job="kfan-edge"',
            "alertLabels": {"team": "streaming"},
            "disabled": ["KfanPodNotReady", "KfanMetricsDown"],
            "thresholds": {"budgetRatio": 0.8, "errorRatio": 0.2, "clientAuthenticationFailures": 50},
            "routineErrorCodes": ["27"],
        }
    }
    docs = render(values)
    rule = one(docs, "PrometheusRule")
    jsonschema.Draft7Validator(PROMETHEUSRULE_SCHEMA).validate(rule)
    assert rule["metadata"]["namespace"] == "monitoring" and rule["metadata"]["labels"]["release"] == "prom"
    rules = {r["alert"]: r for r in rules_of(docs)}
    assert set(rules) == set(ALERTS) - {"KfanPodNotReady", "KfanMetricsDown"}
    for r in rules.values():
        assert r["labels"] == {"severity": ALERTS[r["alert"]], "team": "streaming"}
        assert 'namespace="kafka", job="kfan-edge"' in r["expr"] and NAMESPACE not in r["expr"]
        promql_parser.parse(r["expr"])
    assert rules["KfanBufferedBytesNearBudget"]["expr"].endswith("> 0.8")
    assert rules["KfanClientAuthenticationFailures"]["expr"].endswith("> 50")
    assert 'error_code!~"27"' in rules["KfanErrorRatioHigh"]["expr"] and ") > 0.2\nand" in rules["KfanErrorRatioHigh"]["expr"]
    # No routine codes: every code counts (a label always has a value, so !~"" keeps them all).
    (expr,) = [
        r["expr"]
        for r in rules_of(render(ON | {"prometheusRule": {"enabled": True, "routineErrorCodes": []}}))
        if r["alert"] == "KfanErrorRatioHigh"
    ]
    assert 'error_code!~""' in expr
    promql_parser.parse(expr)


def test_helm_lint_passes_with_the_dashboard_and_the_alerts() -> None:
    for values in (ON, ON | {"workers": 2, "limits": {"maxConnections": 100}, "serviceMonitor": {"enabled": True}}):
        report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report
