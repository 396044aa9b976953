"""Figures of ``kfan bench`` from its raw measurements, and how they are printed: a table for people, one JSON line for tools.

Derived figures are computed from the unrounded measurements and rounded
once, when the flat result is built: a ratio is kfan / direct, an overhead is
kfan - direct, "one core carries" is 1000 / (kfan CPU ms per MB).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from typing import Any

from proxy.tools.bench.measure import Moved

Result = dict[str, Any]

MBPS_DIGITS = 2
RATIO_DIGITS = 3
MS_DIGITS = 3
ONE_CORE_DIGITS = 1


def percentile(values: Sequence[float], q: int) -> float:
    if len(values) < 2:
        return math.nan
    if q == 50:
        return statistics.median(values)
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


def mbps(moved: list[Moved]) -> float:
    seconds = sum(m.seconds for m in moved)
    return sum(m.bytes for m in moved) / 1e6 / seconds if seconds > 0 else math.nan


def cpu_ms_per_mb(moved: list[Moved]) -> float:
    size = sum(m.bytes for m in moved)
    return sum(m.cpu_s or 0.0 for m in moved) * 1000 / (size / 1e6) if size else math.nan


def throughput_figures(kind: str, direct: list[Moved], kfan: list[Moved]) -> Result:
    d, k = mbps(direct), mbps(kfan)
    cpu = cpu_ms_per_mb(kfan)
    return {
        f"{kind}_records_direct": sum(m.records for m in direct),
        f"{kind}_records_kfan": sum(m.records for m in kfan),
        f"{kind}_mbps_direct": _round(d, MBPS_DIGITS),
        f"{kind}_mbps_kfan": _round(k, MBPS_DIGITS),
        f"{kind}_ratio": _round(k / d if d > 0 else math.nan, RATIO_DIGITS),
        f"kfan_cpu_ms_per_mb_{kind}": _round(cpu, MS_DIGITS),
        f"one_core_{kind}_mbps": _round(1000 / cpu if cpu > 0 else math.nan, ONE_CORE_DIGITS),
    }


def latency_figures(prefix: str, latencies: dict[str, list[float]] | None, quantiles: Sequence[int] = (50, 99)) -> Result:
    out: Result = {}
    for q in quantiles:
        d = percentile(latencies["direct"], q) if latencies else math.nan
        k = percentile(latencies["kfan"], q) if latencies else math.nan
        out[f"{prefix}_p{q}_ms_direct"] = _round(d, MS_DIGITS)
        out[f"{prefix}_p{q}_ms_kfan"] = _round(k, MS_DIGITS)
        out[f"{prefix}_p{q}_overhead_ms"] = _round(k - d, MS_DIGITS)
    return out


def clients_figures(figures: dict[str, int | float]) -> Result:
    return {key if key.startswith("clients") else f"clients_{key}": value for key, value in figures.items()}


def json_line(result: Result) -> str:
    return json.dumps(result, separators=(", ", ": "), allow_nan=False)


def _num(value: Any, digits: int) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _signed(value: Any, digits: int) -> str:
    return "n/a" if value is None else f"{value:+.{digits}f}"


def table(result: Result, context: Sequence[str]) -> str:
    """The human report: ``context`` lines (what was measured), then one row per figure, direct / kfan / kfan vs direct."""
    r = result
    lines = list(context)
    lines.append("")
    lines.append(f"{'figure':32} {'direct':>10} {'kfan':>10}   kfan vs direct")
    for kind in ("produce", "consume"):
        ratio = r[f"{kind}_ratio"]
        lines.append(
            f"{kind + ' throughput, MB/s':32} {_num(r[f'{kind}_mbps_direct'], 2):>10} {_num(r[f'{kind}_mbps_kfan'], 2):>10}"
            f"   ratio {_num(ratio, 3)}"
        )
    for prefix, label in (("latency", "produce latency"), ("slow_fetch", "slow-broker fetch")):
        for q in (50, 99):
            overhead = r[f"{prefix}_p{q}_overhead_ms"]
            lines.append(
                f"{f'{label} p{q}, ms':32} {_num(r[f'{prefix}_p{q}_ms_direct'], 3):>10} {_num(r[f'{prefix}_p{q}_ms_kfan'], 3):>10}   "
                + (f"overhead {_signed(overhead, 3)} ms" if overhead is not None else "(embedded cluster only)")
            )
    lines.append("")
    lines.append(
        f"kfan CPU per MB moved: produce {_num(r['kfan_cpu_ms_per_mb_produce'], 3)} ms,"
        f" consume {_num(r['kfan_cpu_ms_per_mb_consume'], 3)} ms"
    )
    lines.append(
        f"sizing: one kfan core carries {_num(r['one_core_produce_mbps'], 1)} MB/s of produce"
        f" or {_num(r['one_core_consume_mbps'], 1)} MB/s of consume (1000 / CPU ms per MB)"
    )
    if not (r["kfan_cpu_ms_per_mb_produce"] and r["kfan_cpu_ms_per_mb_consume"]):
        tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
        lines.append(f"(kfan used less CPU than the kernel counts, one clock tick of {tick_ms:.0f} ms: give more --records)")
    clients = {k: v for k, v in r.items() if k.startswith("clients")}
    if clients:
        lines.append("")
        lines.append(f"many clients ({r.get('clients', '?')} connected at once to kfan):")
        for key, value in clients.items():
            if key != "clients":
                lines.append(f"  {key[len('clients_') :] if key.startswith('clients_') else key:30} {value}")
    return "\n".join(lines)
