"""Run the README's test command again and again on clean clones: ``python -m tests.repeat [--runs N] [--load]``.

A test that fails one run in ten is a defect; one run of the suite rarely
shows it. This clones the committed HEAD of this checkout into a fresh
directory for each run (nothing installed or left in the work tree carries
over, as on CI), runs ``bash .ci/run`` there (the README's test command) and
prints, per run, its wall time, its pytest summary line and, for a failed
run, the failing tests. ``--load`` runs the long fuzz campaign
(``python -m tests.fuzz``) beside every run, so the suite is tried on a
machine with no core to spare. ``--keep`` leaves the clones and their full
output for diagnosis. Exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUMMARY = re.compile(r"^=+ (.* in [\d.]+s.*) =+$", re.M)
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_once(index: int, workdir: Path, load: bool, fuzz_seconds: float) -> tuple[bool, float, str, list[str]]:
    """One clean clone, the test command in it: (passed, wall seconds, pytest's summary, failed tests)."""
    clone = workdir / f"run{index}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["CI"] = "true"
    fuzz: subprocess.Popen[bytes] | None = None
    if load:
        python = ROOT / ".venv" / "bin" / "python"
        fuzz = subprocess.Popen(
            [
                str(python if python.exists() else sys.executable),
                "-m",
                "tests.fuzz",
                "--seconds",
                str(fuzz_seconds),
                "--seed",
                f"repeat-{index}",
            ],
            cwd=ROOT,
            stdout=(workdir / f"fuzz{index}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its worker processes are stopped with it, as one group
        )
    started = time.monotonic()
    with (workdir / f"run{index}.log").open("wb") as out:
        code = subprocess.run(
            ["bash", ".ci/run"], cwd=clone, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    wall = time.monotonic() - started
    if fuzz is not None:
        if fuzz.poll() is None:
            os.killpg(fuzz.pid, signal.SIGTERM)
        fuzz.wait(30)
    text = (workdir / f"run{index}.log").read_text(errors="replace")
    summaries = SUMMARY.findall(text)
    return code == 0, wall, (summaries[-1] if summaries else f"no pytest summary (exit {code})"), FAILED.findall(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.repeat", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=3, help="consecutive runs (default 3)")
    p.add_argument("--load", action="store_true", help="run the long fuzz campaign beside each run")
    p.add_argument(
        "--fuzz-seconds", type=float, default=3600, help="with --load: the campaign's time per target (it is stopped with the run)"
    )
    p.add_argument("--keep", action="store_true", help="keep the clones and their output")
    args = p.parse_args(argv)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True).stdout
    if dirty.strip():
        print("note: uncommitted changes are not tried; each run clones HEAD", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="kfan-repeat-"))
    print(f"{args.runs} runs of the README's test command on clean clones of HEAD in {workdir}" + (" under load" if args.load else ""))
    results = []
    try:
        for i in range(1, args.runs + 1):
            ok, wall, summary, failed = run_once(i, workdir, args.load, args.fuzz_seconds)
            results.append(ok)
            print(f"run {i}: {'green' if ok else 'RED'} in {wall / 60:.1f} min: {summary}", flush=True)
            for name in failed:
                print(f"    {name}", flush=True)
    finally:
        if args.keep or not all(results):
            print(f"output kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
