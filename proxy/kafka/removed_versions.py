"""The versions of Kafka's APIs that Kafka 4 removed, read from removed_versions.json.

kio carries Kafka 4's schemas, which dropped the oldest versions of a dozen
APIs (KIP-896) that brokers up to 3.9 still serve and older clients still
send. Those versions come from Kafka 3.9's definitions, restated as data in
removed_versions.json beside this module (its "notation" entry says how to
read it). This module only reads that file: one message version at a time,
as plain field definitions (:class:`StructDef`); :mod:`.schema` compiles them
into codecs, as it compiles kio's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

_FIELD = re.compile(r"(?P<name>\w+) (?P<type>\[\]\w*|\w+)(?P<null>\?)?(?: v(?P<lo>\d+)(?P<hi>\+|-\d+)?)?(?: =(?P<default>\S+))?")


@dataclass(frozen=True, slots=True)
class FieldDef:
    """One field of a removed version, as the file states it."""

    name: str
    kafka_type: str | None  # of the field, or of its elements; None for a struct or struct array
    array: bool
    nullable: bool
    default: Any
    has_default: bool
    struct: StructDef | None  # the struct of a struct or struct-array field


@dataclass(frozen=True, slots=True)
class StructDef:
    """A message (or a struct within one) of a removed version: its name and, in order, its fields."""

    name: str
    fields: tuple[FieldDef, ...]


@cache
def _apis() -> dict[int, dict[str, Any]]:
    text = resources.files(__package__).joinpath("removed_versions.json").read_text(encoding="utf-8")
    return {int(k): v for k, v in json.loads(text)["apis"].items()}


def versions(api_key: int) -> range | None:
    """The versions of ``api_key`` Kafka 4 removed (the file defines), or None."""
    api = _apis().get(api_key)
    if api is None:
        return None
    lo, hi = api["versions"].split("-")
    return range(int(lo), int(hi) + 1)


def message(api_key: int, version: int, kind: str) -> StructDef:
    """One removed version's request or response (``kind``: "request" or "response")."""
    api = _apis()[api_key]
    return _struct(f"{api['name']}{kind.title()}", api[kind], version)


def _in_version(m: re.Match[str], version: int) -> bool:
    if m["lo"] is None:
        return True
    lo = int(m["lo"])
    hi = 1 << 15 if m["hi"] == "+" else lo if m["hi"] is None else int(m["hi"][1:])
    return lo <= version <= hi


def _struct(owner: str, entries: list[Any], version: int) -> StructDef:
    fields: list[FieldDef] = []
    for entry in entries:
        head, children = next(iter(entry.items())) if isinstance(entry, dict) else (entry, None)
        m = _FIELD.fullmatch(head)
        if m is None:
            raise ValueError(f"removed_versions.json: cannot read {head!r} in {owner}")
        if not _in_version(m, version):
            continue
        has_default = m["default"] is not None
        fields.append(
            FieldDef(
                m["name"],
                m["type"].removeprefix("[]") or None,
                m["type"].startswith("[]"),
                bool(m["null"]),
                json.loads(m["default"]) if has_default else None,
                has_default,
                None if children is None else _struct(m["name"].title().replace("_", ""), children, version),
            )
        )
    return StructDef(owner, tuple(fields))
