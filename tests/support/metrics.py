"""kfan's metrics and health endpoints, as tests read them: where they listen, GET, parse /metrics."""

from __future__ import annotations

import re
import urllib.error
import urllib.request

from tests.support.waiting import wait_for_line


def http_get(url: str, timeout: float = 5) -> tuple[int, str]:
    """GET ``url``: (status, body), error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metrics_port_in(log: list[str], timeout: float = 20) -> int:
    """The port of the metrics listener, from the line a kfan process logs for it (waits for the line)."""
    return int(wait_for_line(log, r"metrics and health on http://[^:]+:(\d+)/metrics", timeout).group(1))


def parse_samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """Prometheus text: metric name -> [(labels as written, e.g. ``{broker="1"}``, value)]."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"^(\w+)(\{[^}]*\})? (\S+)$", line)
        assert m, line
        out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def labels_of(text: str) -> dict[str, str]:
    """A sample's labels as :func:`parse_samples` gives them (``{broker="1"}``), as a dict."""
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def metric_total(log: list[str], family: str, timeout: float = 5, **labels: str) -> float:
    """The sum of ``family``'s samples whose labels include ``labels``, read from the metrics endpoint of the
    kfan process that logged ``log``."""
    _, text = http_get(f"http://127.0.0.1:{metrics_port_in(log)}/metrics", timeout=timeout)
    return sum(v for found, v in parse_samples(text).get(family, []) if labels.items() <= labels_of(found).items())
