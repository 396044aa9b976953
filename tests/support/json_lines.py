"""JSON-lines files another process is still writing (kfan's audit log, the TLS fronts' event files)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def whole_json_lines(path: Path) -> list[dict[str, Any]]:
    """The records of ``path``'s whole lines: its writer may be half-way through the last one as it is read."""
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]
