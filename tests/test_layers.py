"""Import layers of proxy/, backends/ and spark/, checked from the source with ``ast``.

Every ``import`` and ``from ... import`` anywhere in a module counts, lazy
ones inside functions and ``TYPE_CHECKING`` blocks included; relative imports
are resolved to absolute module names (``from pkg import name`` counts as
``pkg.name`` when pkg is one of our packages or pkg.name one of our modules).

:data:`LAYERS` is the rule, one row per layer: ``(pattern, allowed)``. A
pattern ``x.*`` matches x and every module under it, a pattern ``x`` only x;
a module belongs to the row with the longest matching pattern, and may import
only what the row allows: ``STDLIB`` (``sys.stdlib_module_names``),
``THIRD_PARTY`` (anything not under proxy, backends, spark or tests, kio
included) or a module the patterns listed match. ``ANY`` rows, the "top"
modules that wire everything together, are unconstrained, except that nothing
here imports ``tests``. A module in no row is a violation itself: a new module
gets its place in the table.

The rows are also the nodes of a graph, with an edge for every import of one
row's module by another row's; it must be acyclic.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path

from tests.support import ROOT

STDLIB, THIRD_PARTY, ANY = "stdlib", "third-party", ("anything",)
FIRST_PARTY = ("proxy", "backends", "spark", "tests")
PACKAGES = ("proxy", "backends", "spark")  # the tree this test walks
# The tools' optional dependencies (pyproject extras demo, pcap, spark): serving installs none of them.
EXTRAS, TOOL_EXTRAS = ("confluent_kafka", "dpkt", "pyspark"), "the tools' extras"
KAFKA, CORE, SECURITY, CAPTURE, RUNTIME = "proxy.kafka.*", "proxy.core.*", "proxy.security.*", "proxy.capture.*", "proxy.runtime.*"
ROWS = "proxy.capture.rows"  # the capture format alone, without the recorder (and its trio) that serving runs

# The folders, from the bottom up; each may import the ones above it in this table
# that it names, never one below. README "Architecture" states the same rule.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("proxy", (STDLIB,)),  # the package itself: importing any proxy module runs it
    (KAFKA, (STDLIB, "kio.*", "crc32c", KAFKA)),  # Kafka's bytes (and their checksum)
    (CORE, (STDLIB, "kio.*", KAFKA, CORE)),  # the sans-IO core: the route table, splits and merges
    (SECURITY, (STDLIB, THIRD_PARTY, SECURITY)),  # TLS contexts, SASL exchanges, users, tokens
    (RUNTIME, (STDLIB, THIRD_PARTY, KAFKA, RUNTIME)),  # trio leaves: frames on streams, budgets, metrics, log text
    (CAPTURE, (STDLIB, THIRD_PARTY, KAFKA, CORE, "proxy.runtime.metrics", CAPTURE)),  # capture rows and the recorder
    ("backends.*", (STDLIB, THIRD_PARTY, KAFKA, CORE, SECURITY, RUNTIME, "backends.*")),  # kfan's side of the brokers
    (
        "proxy.server.*",
        (STDLIB, THIRD_PARTY, KAFKA, CORE, SECURITY, RUNTIME, CAPTURE, "backends.*", "proxy.server.*"),
    ),  # the trio server: client connections, admission, forwarding, workers
    (
        "proxy.tools.*",
        (STDLIB, THIRD_PARTY, TOOL_EXTRAS, KAFKA, CORE, RUNTIME, CAPTURE, "proxy.tools.*"),
    ),  # bench, embedded cluster, demo, pcap
    ("spark.*", (STDLIB, THIRD_PARTY, TOOL_EXTRAS, KAFKA, CORE, ROWS, "spark.*")),  # the Spark replay job
    ("proxy.cli", ANY),  # the entry points wire everything together
    ("proxy.__main__", ANY),
]


def matches(module: str, pattern: str) -> bool:
    base = pattern.removesuffix(".*")
    return module == base or (pattern.endswith(".*") and module.startswith(base + "."))


def layer_of(module: str) -> str | None:
    """The pattern of the module's row of LAYERS (the longest that matches), None when no row has it."""
    return max((p for p, _ in LAYERS if matches(module, p)), key=lambda p: len(p.removesuffix(".*")), default=None)


def source_modules(root: Path = ROOT) -> dict[str, tuple[str, bool]]:
    """module name -> (its source, whether it is a package) for every .py under PACKAGES.

    A package wins over a module of the same name, as it does for Python."""
    found: dict[str, tuple[str, bool]] = {}
    for path in sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if package else parts)
        if package or name not in found:
            found[name] = (path.read_text(), package)
    return found


def imports_of(module: str, source: str, package: bool, modules: Mapping[str, tuple[str, bool]]) -> set[str]:
    """Absolute names of everything the module imports; ``modules``: the tree, as source_modules gives it."""
    here = module.split(".") if package else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            named = [node.module] if node.module else []
            base = ".".join([*here[: len(here) - node.level + 1], *named] if node.level else named)
            ours = modules.get(base, ("", False))[1]
            out.update(f"{base}.{a.name}" if ours or f"{base}.{a.name}" in modules else base for a in node.names)
    return out


def import_graph(modules: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the absolute names it imports, for every module given."""
    return {name: imports_of(name, source, package, modules) for name, (source, package) in modules.items()}


def allows(allowed: tuple[str, ...], imported: str) -> bool:
    top = imported.split(".")[0]
    if top in sys.stdlib_module_names:
        return STDLIB in allowed
    if top in EXTRAS:
        return TOOL_EXTRAS in allowed
    if top not in FIRST_PARTY and THIRD_PARTY in allowed:
        return True
    return any(matches(imported, a) for a in allowed if a not in (STDLIB, THIRD_PARTY))


def violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Each forbidden import, as ``module -> imported (rule)``."""
    rules = dict(LAYERS)
    out = []
    for module, imported in sorted(graph.items()):
        layer = layer_of(module)
        if layer is None:
            out.append(f"{module} -> * (module in no row of LAYERS)")
            continue
        for name in sorted(imported):
            if matches(name, "tests.*"):
                out.append(f"{module} -> {name} (nothing under {', '.join(p + '/' for p in PACKAGES)} imports tests)")
            elif rules[layer] != ANY and name.split(".")[0] in EXTRAS and TOOL_EXTRAS not in rules[layer]:
                out.append(f"{module} -> {name} ({name.split('.')[0]} is one of {TOOL_EXTRAS}, which serving does not install)")
            elif rules[layer] != ANY and not allows(rules[layer], name):
                out.append(f"{module} -> {name} ({layer} may import only {', '.join(rules[layer])})")
    return out


def cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """Cycles of the row-to-row graph, each as ``a -> b -> a (one import behind each edge)``: one per
    back edge of a depth-first walk, so none if and only if the graph is acyclic."""
    edges: dict[str, dict[str, str]] = {}
    for module, imported in sorted(graph.items()):
        for name in sorted(imported):
            a, b = layer_of(module), layer_of(name)
            if a and b and a != b:
                edges.setdefault(a, {}).setdefault(b, f"{module} -> {name}")
    found: list[str] = []
    done: set[str] = set()

    def visit(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], {})):
            if nxt in path:
                loop = [*path[path.index(nxt) :], nxt]
                found.append(" -> ".join(loop) + " (" + "; ".join(edges[x][y] for x, y in pairwise(loop)) + ")")
            elif nxt not in done:
                visit([*path, nxt])
        done.add(path[-1])

    for start in sorted(edges):
        if start not in done:
            visit([start])
    return found


def module_cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """Import cycles between modules (any import counts, lazy and ``TYPE_CHECKING`` ones too): each
    strongly connected component of more than one module, as ``a <-> b <-> c``, its modules sorted.

    An imported name resolves to the longest module of the graph it starts with
    (``proxy.core.plan_request`` is ``proxy.core``)."""

    def module_of(name: str) -> str | None:
        parts = name.split(".")
        return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in graph), None)

    edges = {m: sorted({t for n in names if (t := module_of(n)) and t != m}) for m, names in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[str] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the tree is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(" <-> ".join(sorted([v, *component])))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found)


def test_imports_follow_the_layers() -> None:
    bad = violations(import_graph(source_modules()))
    assert not bad, f"{len(bad)} imports break the layers of tests/test_layers.py:\n" + "\n".join(bad)


def test_no_import_cycle_between_layers() -> None:
    found = cycles(import_graph(source_modules()))
    assert not found, "import cycles between the layers of tests/test_layers.py:\n" + "\n".join(found)


def test_no_import_cycle_between_modules() -> None:
    found = module_cycles(import_graph(source_modules()))
    assert not found, "import cycles between modules (lazy and TYPE_CHECKING imports count):\n" + "\n".join(found)


def test_the_checker_reports_forbidden_imports_and_cycles() -> None:
    tree = {
        "proxy": ("", True),
        "proxy.kafka": ("", True),
        "proxy.kafka.wire": ("import struct\n", False),
        "proxy.kafka.x": ("import struct\nfrom . import wire\ndef f():\n    import trio\n", False),
        "proxy.core": ("from ..kafka import wire\nfrom .y import Y\n", True),
        "proxy.core.y": ("from ..kafka.wire import read\nif True:\n    from backends import link\n", False),
        "proxy.server": ("", True),
        "proxy.server.serve": ("from ..core import plan_request\n", False),
        "proxy.cli": ("def main():\n    import spark.replay\n    from tests.support import ROOT\n", False),
        "proxy.stray": ("", False),
        "backends": ("", True),
        "backends.link": ("import trio\nfrom proxy.core import plan_request\nfrom proxy.server import serve\n", False),
        "backends.a": ("from . import b\nimport confluent_kafka\n", False),
        "backends.b": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\n", False),
    }
    graph = import_graph(tree)
    assert graph["proxy.kafka.x"] == {"struct", "proxy.kafka.wire", "trio"}
    assert graph["proxy.core"] == {"proxy.kafka.wire", "proxy.core.y"}
    assert graph["proxy.core.y"] == {"proxy.kafka.wire", "backends.link"}
    assert graph["backends.link"] == {"trio", "proxy.core.plan_request", "proxy.server.serve"}
    assert graph["backends.b"] == {"typing", "backends.a"}
    assert violations(graph) == [
        "backends.a -> confluent_kafka (confluent_kafka is one of the tools' extras, which serving does not install)",
        "backends.link -> proxy.server.serve (backends.* may import only stdlib, third-party, proxy.kafka.*, proxy.core.*, proxy.security.*, proxy.runtime.*, backends.*)",
        "proxy.cli -> tests.support (nothing under proxy/, backends/, spark/ imports tests)",
        "proxy.core.y -> backends.link (proxy.core.* may import only stdlib, kio.*, proxy.kafka.*, proxy.core.*)",
        "proxy.kafka.x -> trio (proxy.kafka.* may import only stdlib, kio.*, crc32c, proxy.kafka.*)",
        "proxy.stray -> * (module in no row of LAYERS)",
    ]
    assert cycles(graph) == [
        "backends.* -> proxy.core.* -> backends.* (backends.link -> proxy.core.plan_request; proxy.core.y -> backends.link)",
    ]  # backends.* -> proxy.server.* -> proxy.core.* -> backends.* too, not reported: proxy.core.* was done
    assert module_cycles(graph) == [
        "backends.a <-> backends.b",  # the TYPE_CHECKING import counts
        "backends.link <-> proxy.core <-> proxy.core.y <-> proxy.server.serve",
    ]
