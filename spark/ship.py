"""Ship kfan to the executors of a Spark cluster, as Spark's Python packaging guide does with ``spark.archives``.

The executors run :func:`spark.replay._check_rows`, that is :mod:`spark.checks`
over kfan's sans-IO core, so their Python must import ``spark``, ``proxy`` and
what those import: kio and crc32c (a compiled module); the capture rows come
from :mod:`proxy.capture.rows`, whose package loads nothing else. PySpark
itself they already have: the Spark worker puts its distribution's
``python/lib/pyspark.zip`` and py4j on their path. A worker's Python may have
nothing else installed.

So, when the master is not local, ``kfan replay`` builds one archive (tar.gz)
of kfan's packages and the installed files of those distributions (with their
own dependencies, as installed here), and gives it to Spark as
``spark.archives=ARCHIVE#kfan_env`` with ``spark.executorEnv.PYTHONPATH=kfan_env``:
each executor unpacks it into its working directory, where its Python workers
start, and imports from it. Not a packed virtual environment (venv-pack):
venv-pack refuses editable installs, packs the whole environment (PySpark's
jars, the test tools: over 1 GB here) and needs the environment's base
interpreter at the same path on every worker. Compiled modules (crc32c) load
from the unpacked directory, which they could not from a ``--py-files`` zip.

The archive is cached under ``$XDG_CACHE_HOME/kfan/spark`` (default
``~/.cache``), named by a hash of everything in it and of this interpreter's
ABI, so a run with the same code and dependencies ships the archive the last
one built. Before the replay, a small probe job imports the replay's modules
on the executors; what fails there is named (module, error, the executors'
Python) with what to do about it, instead of a ModuleNotFoundError deep in a
failed stage.

``--spark-archive`` overrides (default ``$KFAN_SPARK_ARCHIVE``, else ``auto``):
``none`` ships nothing (the workers' Python has kfan installed), a path or URL
ships that prebuilt archive instead (the same layout: importable packages at
its top level, e.g. ``pip install --target DIR kfan; tar -czf ARCHIVE -C DIR .``).
``python -m spark.ship`` prints the path of the archive ``auto`` ships.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import sys
import sysconfig
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The distributions the executors import, beside kfan's own packages; their dependencies follow.
EXECUTOR_REQUIREMENTS = (
    "kio",  # proxy.kafka: the codec compiled from Kafka's schemas
    "crc32c",  # proxy.kafka.records: the record batch check (a compiled module)
)
# kfan's top-level packages the executors import (spark.replay, spark.checks, proxy.core, proxy.kafka, proxy.capture).
KFAN_PACKAGES = ("proxy", "spark")
# What the probe imports on the executors: everything the replay runs there comes through these.
EXECUTOR_MODULES = ("spark.replay", "spark.checks")
ENV_DIR = "kfan_env"  # where each executor unpacks the archive, in its working directory
ARCHIVE_LAYOUT = 1  # part of the cache key: bump when what goes into the archive changes
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")  # what Spark unpacks (others it copies as they are)
ROOT = Path(__file__).resolve().parent.parent  # where kfan's packages are: the checkout, or site-packages


class ShippingError(Exception):
    """kfan cannot be shipped to, or imported on, the executors; the message says what is missing and what to do."""


@dataclass(frozen=True)
class Shipment:
    """What ``kfan replay`` gives the executors: the Spark settings, and what they carry, for messages."""

    mode: str  # "auto" (built here), "prebuilt" or "none"
    conf: dict[str, str] = field(default_factory=dict)
    contents: str = ""  # e.g. "kfan (proxy, spark), kio 0.6.5, crc32c 2.9, ..."
    compiled: tuple[str, ...] = ()  # compiled modules in the archive: they load only on this interpreter's ABI


def is_local(master: str) -> bool:
    """Local masters run executors on this machine with this interpreter and kfan's checkout on their path."""
    return master.startswith("local")


def prepare(option: str, existing: dict[str, str] | None = None) -> Shipment:
    """The shipment for ``--spark-archive OPTION`` (auto, none, or an archive's path or URL).

    ``existing``: Spark settings already made (spark-submit's ``--archives``, a
    PYTHONPATH for the executors), which the shipment extends rather than replaces."""
    if option == "none":
        return Shipment("none")
    if option == "auto":
        archive, contents, compiled = build_archive()
        return Shipment("auto", _conf(str(archive), existing or {}), contents, compiled)
    location, _, directory = option.partition("#")
    if "://" not in location:
        path = Path(location).expanduser()
        if not path.is_file():
            raise ShippingError(f"--spark-archive {option}: no such file (give an archive, auto or none)")
        location = str(path.resolve())
    if not location.lower().endswith(ARCHIVE_SUFFIXES):
        raise ShippingError(f"--spark-archive {option}: Spark unpacks only {', '.join(ARCHIVE_SUFFIXES)} archives")
    spec = f"{location}#{directory}" if directory else location
    return Shipment("prebuilt", _conf(spec, existing or {}), f"the prebuilt archive {spec}")


def _conf(archive: str, existing: dict[str, str]) -> dict[str, str]:
    # A fragment names the directory Spark unpacks into; a prebuilt archive may bring its own.
    archive = archive if "#" in archive else f"{archive}#{ENV_DIR}"
    directory = archive.rsplit("#", 1)[1]
    archives = ",".join(a for a in (existing.get("spark.archives"), archive) if a)
    path = os.pathsep.join(p for p in (directory, existing.get("spark.executorEnv.PYTHONPATH")) if p)
    # Relative: the executors' Python workers start in their working directory, where the archive is unpacked.
    return {"spark.archives": archives, "spark.executorEnv.PYTHONPATH": path}


# --- building the archive ------------------------------------------------------------------


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kfan" / "spark"


def build_archive(directory: Path | None = None) -> tuple[Path, str, tuple[str, ...]]:
    """The archive of kfan's packages and the executors' dependencies, built unless the cache has it.

    Returns its path, a description of what it holds and its compiled modules."""
    dists = executor_distributions()
    files = sorted({**dict(_kfan_files()), **{arc: src for d in dists for arc, src in _dist_files(d)}}.items())
    key = hashlib.sha256(f"{ARCHIVE_LAYOUT} {sys.implementation.cache_tag} {sysconfig.get_config_var('SOABI')}\n".encode())
    for arc, src in files:
        key.update(arc.encode() + b"\0" + hashlib.sha256(src.read_bytes()).digest())
    archive = (directory or cache_dir()) / f"kfan-executors-{key.hexdigest()[:20]}.tar.gz"
    if not archive.exists():
        archive.parent.mkdir(parents=True, exist_ok=True)
        partial = archive.with_name(f".{archive.name}.{os.getpid()}")
        try:
            # Level 1: the archive goes over the network once per executor; speed matters more than size here.
            with tarfile.open(partial, "w:gz", compresslevel=1) as tar:
                for arc, src in files:
                    tar.add(src, arcname=arc, recursive=False, filter=_anonymous)
            os.replace(partial, archive)  # whole or not at all, even with concurrent runs
        finally:
            partial.unlink(missing_ok=True)
    contents = ", ".join([f"kfan ({', '.join(KFAN_PACKAGES)})", *(f"{d.metadata['Name']} {d.version}" for d in dists)])
    compiled = tuple(arc for arc, _ in files if arc.endswith((".so", ".pyd")))
    return archive, contents, compiled


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    # The builder's user and group mean nothing on the workers.
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def executor_distributions(requirements: Sequence[str] = EXECUTOR_REQUIREMENTS) -> list[importlib.metadata.Distribution]:
    """The installed distributions of ``requirements`` and of what they require, as installed here.

    A dependency whose environment marker does not hold here, or that an extra
    asks for, is left out, as pip left it out; one that is required but not
    installed is an error naming it."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        raise ShippingError("cannot build the executors' archive without packaging: pip install 'kfan[spark]'") from None

    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [(name, "kfan") for name in requirements]
    while todo:
        name, wanted_by = todo.pop()
        key = _canonical(name)
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ShippingError(
                f"cannot build the executors' archive: {name} (required by {wanted_by}) is not installed in {sys.executable}; "
                "pip install 'kfan[spark]' there, or give --spark-archive a prebuilt archive, or none when the workers have kfan"
            ) from None
        found[key] = dist
        for line in dist.requires or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            todo.append((req.name, dist.metadata["Name"]))
    return sorted(found.values(), key=lambda d: _canonical(d.metadata["Name"]))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_files(dist: importlib.metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path in the archive, file here) for an installed distribution: its RECORD, within site-packages."""
    if dist.files is None:
        raise ShippingError(
            f"cannot build the executors' archive: {dist.metadata['Name']} lists no installed files (no RECORD) in {sys.executable}; "
            "reinstall it with pip, or give --spark-archive a prebuilt archive"
        )
    for rel in dist.files:
        # Scripts and headers lie outside site-packages (../../bin/...); bytecode is rebuilt where it runs.
        if rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue
        src = Path(str(dist.locate_file(rel)))
        if src.is_file():
            yield rel.as_posix(), src


def _kfan_files() -> Iterator[tuple[str, Path]]:
    """kfan's packages, from wherever they are imported here (a checkout, editable or not, or site-packages)."""
    for package in KFAN_PACKAGES:
        for src in _walk(ROOT / package):
            yield src.relative_to(ROOT).as_posix(), src


def _walk(directory: Path) -> Iterable[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            yield path


# --- checking the executors -----------------------------------------------------------------


def probe_executors(sc: Any, modules: Sequence[str]) -> list[dict[str, Any]]:
    """On the executors (one task per default partition): their Python, and the error importing each of ``modules``.

    The probe is a local function, so Spark pickles it by value: it runs where kfan cannot be imported."""
    names = tuple(modules)

    def probe(_: Iterable[int]) -> Iterator[dict[str, Any]]:
        import importlib
        import platform
        import socket
        import sys
        import sysconfig

        errors = {}
        for name in names:
            try:
                importlib.import_module(name)
            except Exception as e:  # any failure to import is what the probe reports
                errors[name] = f"{type(e).__name__}: {e}"
        yield {
            "host": socket.gethostname(),
            "python": sys.executable,
            "version": platform.python_version(),
            "soabi": sysconfig.get_config_var("SOABI"),
            "errors": errors,
        }

    n = max(1, int(sc.defaultParallelism))
    return sc.parallelize(range(n), n).mapPartitions(probe).collect()


def check_executors(sc: Any, shipment: Shipment, modules: Sequence[str] = EXECUTOR_MODULES) -> None:
    """Raise :class:`ShippingError` naming what the executors cannot import, and what to do about it."""
    try:
        results = probe_executors(sc, modules)
    except Exception as e:  # py4j's error carries the executors' own, which is what to show
        python = sc.pythonExec
        raise ShippingError(
            f"the executors could not run the import probe with Python {python!r} (PYSPARK_PYTHON): {first_error(str(e))}\n"
            "  fix: set PYSPARK_PYTHON to a Python 3 present at that path on every worker, the same minor version as the driver's "
            f"({sys.version_info.major}.{sys.version_info.minor})"
        ) from None
    failed = [r for r in results if r["errors"]]
    if failed:
        raise ShippingError(explain(failed, shipment))


def first_error(text: str) -> str:
    """The line of a Spark job failure that says what went wrong on the executor, rather than the stage's stack."""
    lines = [line.strip() for line in text.splitlines()]
    for line in lines:
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception): ", line) and not line.startswith(("org.apache.", "java.", "py4j.", "scala.")):
            return line
    for line in lines:
        if "Cannot run program" in line or "error=" in line:
            return line[line.find("Cannot run program") :] if "Cannot run program" in line else line
    return next((line for line in lines if line), text)[:500]


def explain(failed: list[dict[str, Any]], shipment: Shipment) -> str:
    """What the probe found missing, what was shipped and how to fix it."""
    lines = ["the executors cannot import what the replay runs there:"]
    # One line per distinct failure: every executor, every module that fails the same way.
    failures: dict[tuple[str, str, str, str], list[str]] = {}
    for r in failed:
        for module, error in r["errors"].items():
            modules = failures.setdefault((error, r["host"], r["version"], r["python"]), [])
            if module not in modules:
                modules.append(module)
    for (error, host, version, python), modules in failures.items():
        lines.append(f"  {', '.join(modules)}: {error} (on {host}, Python {version} at {python})")
    if shipment.mode == "none":
        lines.append("  shipped: nothing (--spark-archive none)")
        lines.append(
            "  fix: install kfan into the Python the executors run (PYSPARK_PYTHON) on every worker (pip install kfan), "
            "or leave out --spark-archive none to ship kfan and its dependencies"
        )
        return "\n".join(lines)
    lines.append(f"  shipped: {shipment.contents}, through spark.archives={shipment.conf.get('spark.archives')}")
    mine = sysconfig.get_config_var("SOABI")
    theirs = sorted({r["soabi"] for r in failed if r["soabi"] != mine})
    if shipment.compiled and theirs:
        lines.append(
            f"  the archive's compiled modules ({', '.join(shipment.compiled)}) are built for {mine}, the executors' Python is "
            f"{', '.join(map(str, theirs))}"
        )
        lines.append(
            f"  fix: point PYSPARK_PYTHON at a Python {sys.version_info.major}.{sys.version_info.minor} on the workers (Spark wants the "
            "driver's minor version too), or, for workers on another platform, build an archive for theirs (pip install --target DIR "
            "--platform PLATFORM --only-binary=:all: kfan; tar -czf kfan.tar.gz -C DIR .) and give it with --spark-archive"
        )
    elif shipment.mode == "prebuilt":
        lines.append(
            "  fix: the archive must hold kfan's packages and their dependencies at its top level "
            "(pip install --target DIR kfan; tar -czf kfan.tar.gz -C DIR .), or use --spark-archive auto"
        )
    else:
        lines.append(
            "  fix: the archive is built from what this Python has installed (spark/ship.py EXECUTOR_REQUIREMENTS and their "
            "dependencies): add what is missing there, or give --spark-archive a prebuilt archive"
        )
    return "\n".join(lines)


def main() -> int:
    """``python -m spark.ship``: build (or find in the cache) the archive ``--spark-archive auto`` ships; print its path."""
    try:
        archive, contents, _ = build_archive()
    except ShippingError as e:
        print(f"kfan: {e}", file=sys.stderr)
        return 2
    print(archive)
    print(f"holds {contents}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
