"""The Helm chart in charts/kfan rendered by real Helm, and kfan run as its Deployment's container would run it:
what the chart tests share (the tests of values, of broker ports and of observability)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import helm_python as helm
import yaml

from tests.support import ROOT
from tests.support.kfan import SERVING
from tests.support.metrics import http_get
from tests.support.processes import follow_output, free_port, stop_process
from tests.support.waiting import wait_for

CHART = ROOT / "charts" / "kfan"
RELEASE, NAMESPACE = "prod", "streaming"
# The one value the chart requires: the brokers to bootstrap from.
BASE: dict[str, Any] = {"kafka": {"bootstrap": "kafka-0.kafka-headless.kafka.svc:9092,kafka-1.kafka-headless.kafka.svc:9092"}}


def _manifests(values: dict[str, Any], name: str = RELEASE, namespace: str = NAMESPACE) -> dict[str, str]:
    """`helm template`: each rendered file's text, by its path in the chart."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=name, namespace=namespace)


def render(values: dict[str, Any] | None = None, *, name: str = RELEASE, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """`helm template`: the rendered objects (NOTES.txt aside)."""
    docs: list[dict[str, Any]] = []
    for path, text in sorted(_manifests(values or {}, name, namespace).items()):
        if not path.endswith("NOTES.txt"):
            docs += [d for d in yaml.safe_load_all(text) if d]
    return docs


def notes(values: dict[str, Any]) -> str:
    return _manifests(values)["kfan/templates/NOTES.txt"]


def one(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    """The one object of ``kind`` (whose name ends with ``name_suffix``)."""
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind}, got {[(d['kind'], d['metadata']['name']) for d in docs]}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def kfan_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment: its env entries and the ConfigMaps it loads whole."""
    c = container(docs)
    env = {e["name"]: e.get("value", "") for e in c.get("env", [])}
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
    for source in c.get("envFrom", []):
        if "configMapRef" in source:
            env.update(configmaps[source["configMapRef"]["name"]])
    return env


def probe_status(url: str) -> int:
    """What a kubelet's HTTP probe of ``url`` sees: the status, or 0 when nothing answers."""
    try:
        return http_get(url, timeout=2)[0]
    except OSError:
        return 0


@dataclass
class RenderedKfan:
    """kfan run from a rendered chart: the objects, the process, its output (growing as it writes) and its two ports."""

    docs: list[dict[str, Any]]
    process: subprocess.Popen[str]
    log: list[str]
    kafka_port: int
    metrics_port: int

    def output(self) -> str:
        return "".join(list(self.log))

    def wait_ready(self, readiness: str, timeout: float) -> None:
        """Until ``readiness`` (its probe's URL) answers 200; fails at once if kfan exits."""
        wait_for("kfan's readiness probe to answer 200", lambda: self.process.poll() is not None or probe_status(readiness) == 200, timeout,
                 seen=lambda: "".join(list(self.log)[-40:]))  # fmt: skip
        assert self.process.poll() is None, "kfan exited before it was ready:\n" + self.output()


def start_rendered(values_for: Callable[[int, int], dict[str, Any]], timeout: float = 60, attempts: int = 5) -> RenderedKfan:
    """kfan started as the Deployment's container would be (its args, its KFAN_* environment) from the chart
    rendered with ``values_for(kafka_port, metrics_port)``; returned once it serves and /readyz says 200.

    The chart takes fixed ports only (1-65535, no 0), so they are picked free first. Another process may
    bind one before kfan does: kfan then exits saying "Address already in use", and is started again on
    other ports. kfan binds its metrics port before it prints that it serves, so once that line is out
    both ports are this kfan's, and what answers on them is not some other process that took them.
    """
    failures: list[str] = []
    for _ in range(attempts):
        kafka_port, metrics_port = free_port(), free_port()
        docs = render(values_for(kafka_port, metrics_port))
        c = container(docs)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KFAN_")} | kfan_env(docs)
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", *c["args"]], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        log, serving = follow_output(process, SERVING, timeout)  # None: it exited (the whole output is in) or the time ran out
        if serving is None:
            stop_process(process, 5)
            failures.append("".join(log))
            if process.returncode != 0 and "address already in use" in failures[-1].lower():
                continue
            raise AssertionError("kfan never served:\n" + failures[-1])
        kfan = RenderedKfan(docs, process, log, kafka_port, metrics_port)
        try:
            kfan.wait_ready(f"http://127.0.0.1:{metrics_port}" + c["readinessProbe"]["httpGet"]["path"], timeout)
        except BaseException:
            stop_process(process, 5)
            raise
        return kfan
    raise AssertionError(f"kfan found its ports taken {attempts} times:\n" + "\n---\n".join(failures))
