"""The README's first command, from a fresh copy of the repository.

It must set everything up by itself and serve a produce/consume round trip
on 127.0.0.1:9092; the example `kfan demo` prints must work as printed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quickstart_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sh\n(.*?)```", section, re.S)


def fresh_copy(dest: Path) -> None:
    """What a clone holds: tracked files plus new, not-ignored ones."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def test_readme_has_exactly_two_quickstart_commands() -> None:
    blocks = quickstart_blocks()
    assert len(blocks) == 2
    assert blocks[0].strip().endswith("kfan demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert blocks[1].strip() in ci, ".ci/run must run the README's test command"


def test_demo_from_fresh_copy(tmp_path: Path) -> None:
    fresh_copy(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    proc = subprocess.Popen(
        ["bash", "-c", quickstart_blocks()[0]],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    out: list[str] = []
    printed = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if "Ctrl-C stops it" in line:
                printed.set()
        printed.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        assert printed.wait(600) and proc.poll() is None, "kfan demo did not start:\n" + "".join(out[-40:])
        text = "".join(out)
        assert "127.0.0.1:9092" in text
        leaders = [int(b) for b in re.findall(r"partition \d -> broker (\d)", text)]
        assert leaders == [1, 2, 3, 1, 2, 3]
        example = re.search(r"^(\.venv/bin/python - <<'PY'\n.*?\nPY)\n", text, re.S | re.M)
        assert example, "no copy-paste example printed"
        started = time.monotonic()
        run = subprocess.run(["bash", "-c", example.group(1)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        got = re.findall(r"^partition (\d) b'(\d+)' b'hello (\d+)'$", run.stdout, re.M)
        assert sorted(int(v) for _, _, v in got) == list(range(12)), run.stdout
        assert len({p for p, _, _ in got}) > 1, "records spread over partitions led by different brokers"
        assert time.monotonic() - started < 120
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
    assert code == 0, "Ctrl-C must stop kfan demo cleanly:\n" + "".join(out[-20:])
