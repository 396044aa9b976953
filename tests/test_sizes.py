"""The product stays readable: no module over 500 lines, no class over 200 (the team's habit, checked).

A module that grows past its limit has taken a second job: split it by job, as
proxy/core/fetch.py (planning) and fetch_wait.py (when a Fetch is answered) were."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import ROOT

PACKAGES = ("proxy", "backends", "spark")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 200


def oversized(root: Path = ROOT) -> list[str]:
    out = []
    for path in sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(root))
        if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
            out.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (size := (node.end_lineno or node.lineno) - node.lineno + 1) > MAX_CLASS_LINES:
                out.append(f"{name}: class {node.name} {size} lines")
    return out


def test_no_module_over_500_lines_and_no_class_over_200() -> None:
    found = oversized()
    assert not found, "split by job:\n" + "\n".join(found)


def test_the_check_finds_a_long_module_and_a_long_class(tmp_path: Path) -> None:
    (tmp_path / "proxy").mkdir()
    (tmp_path / "proxy" / "big.py").write_text("class Big:\n" + "    x = 1\n" * 200 + "\n" * 300)
    for pkg in ("backends", "spark"):
        (tmp_path / pkg).mkdir()
    assert oversized(tmp_path) == ["proxy/big.py: 501 lines", "proxy/big.py: class Big 201 lines"]
