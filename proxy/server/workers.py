"""``kfan serve --workers N``: N processes on one port, one metrics endpoint.

Python serves one core per process, so N worker processes each run the whole
proxy and share the listening port through SO_REUSEPORT (the kernel spreads
new connections). kfan is stateless, so workers need not talk to each other.
The parent holds the port, starts the workers, serves /metrics with every
worker's samples summed (prometheus-client's multiprocess mode, in a private
temporary directory), and on SIGTERM passes the signal on and waits for each
worker to drain. Each worker's stdin is a pipe from the parent (its lifeline,
:data:`~proxy.runtime.lifeline.LIFELINE_ENV`): however the parent ends, SIGKILL included,
the workers see it close and stop, draining their clients; the last of them
out removes the metrics directory, which a killed parent could not.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

import trio

from proxy.runtime import metrics
from proxy.runtime.lifeline import LIFELINE_ENV
from proxy.server import config

log = logging.getLogger("kfan.workers")


def _flag_value(value: Any) -> str:
    if isinstance(value, tuple):
        return f"{value[0]}:{value[1]}"
    if isinstance(value, list):
        return ",".join(_flag_value(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def worker_argv(options: Mapping[str, Any], port: int, explicit: frozenset[str], config_path: str | None) -> list[str]:
    """The `kfan serve` command line of one worker: the options given to the parent by flag or environment, and its
    config file, which the worker reads itself (so that it can read it again on a reload). Secrets go by environment."""
    argv = [sys.executable, "-m", "proxy", "serve"]
    for o in config.OPTIONS:
        value = options[o.dest]
        if o.name in ("workers", "metrics-listen", "listen") or o.dest not in explicit or value is None or not o.flag:
            continue
        argv += [f"--{o.name}", _flag_value(value)]
    if config_path:
        argv += ["--config", config_path]
    return argv + ["--listen", _flag_value((options["listen"][0], port)), "--workers", "1"]


def explicit_options(flags: Mapping[str, Any], environ: Mapping[str, str]) -> frozenset[str]:
    """The options (by dest) given by flag or environment, which a config file cannot override."""
    return frozenset(o.dest for o in config.OPTIONS if o.dest in flags or o.env in environ)


def worker_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The parent's environment without KFAN_* settings: a worker's command line
    holds every option the parent was given that way, and a worker that read
    KFAN_METRICS_LISTEN would try to bind the parent's metrics port (a worker
    ignores metrics-listen in the config file too: :func:`proxy.cli._serve`)."""
    return {k: v for k, v in environ.items() if not k.startswith("KFAN_")}


def worker_secrets(options: Mapping[str, Any]) -> dict[str, str]:
    """The options that have no flag (secrets), as the environment a worker reads them from."""
    return {o.env: _flag_value(options[o.dest]) for o in config.OPTIONS if not o.flag and options[o.dest] is not None}


def run_workers(options: dict[str, Any], flags: Mapping[str, Any]) -> int:
    host, port = options["listen"]
    # Hold the port (and pick it, for port 0) so every worker binds the same one.
    reserve = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        reserve.bind((host, port))
    except OSError as e:
        reserve.close()
        raise metrics.ListenFailed(f"cannot listen on {host}:{port} (--listen): {e}") from None
    port = reserve.getsockname()[1]
    metrics_dir = tempfile.mkdtemp(prefix="kfan-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    try:
        explicit = explicit_options(flags, os.environ)
        config_path = flags.get("config") or os.environ.get("KFAN_CONFIG")
        return trio.run(_supervise, options, port, metrics_dir, explicit, str(config_path) if config_path else None)
    finally:
        reserve.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)


async def _supervise(options: dict[str, Any], port: int, metrics_dir: str, explicit: frozenset[str], config_path: str | None) -> int:
    n = options["workers"]
    ready_count = 0
    all_ready = trio.Event()
    # Set on SIGINT/SIGTERM: from then on a worker exiting is the stop, not a failure.
    stopping = trio.Event()
    procs: list[trio.Process] = []

    async def pump(proc: trio.Process) -> None:
        nonlocal ready_count
        assert proc.stdout is not None
        buffer = b""
        async for chunk in proc.stdout:
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                text = line.decode(errors="replace")
                if text.startswith("kfan: serving on"):
                    ready_count += 1
                    log.info("worker pid %s ready", proc.pid)
                    if ready_count == n:
                        all_ready.set()
                else:
                    print(text, flush=True)

    def ready() -> bool:
        return all_ready.is_set() and all(p.returncode is None for p in procs)

    async with trio.open_nursery() as nursery:
        if options["metrics_listen"] is not None:
            await nursery.start(metrics.serve_http, *options["metrics_listen"], ready)
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            for i in range(n):
                env = {
                    **worker_environment(os.environ),
                    **worker_secrets(options),
                    "KFAN_WORKER": str(i),
                    "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
                    LIFELINE_ENV: "stdin",
                }
                # The worker's stdin: its lifeline, never written to; the kernel closes it when this process ends.
                proc = await trio.lowlevel.open_process(
                    worker_argv(options, port, explicit, config_path), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                procs.append(proc)
                nursery.start_soon(pump, proc)

            async def announce() -> None:
                await all_ready.wait()
                advertise = options["advertise"] or (options["listen"][0], port)
                print(f"kfan: serving on {advertise[0]}:{advertise[1] or port}, {n} workers (pids {[p.pid for p in procs]})", flush=True)

            async def watch(proc: trio.Process) -> None:
                code = await proc.wait()
                from prometheus_client import multiprocess

                multiprocess.mark_process_dead(proc.pid)
                if not stopping.is_set():
                    log.error("worker pid %s exited with %s; stopping", proc.pid, code)
                    nursery.cancel_scope.cancel()

            nursery.start_soon(announce)
            for proc in procs:
                nursery.start_soon(watch, proc)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    # Each worker reloads its own configuration (and reopens its audit log).
                    log.info("received SIGHUP: passed on to the %d workers", n)
                    for proc in procs:
                        if proc.returncode is None:
                            proc.send_signal(signal.SIGHUP)
                    continue
                log.info("received %s, stopping %d workers", signal.Signals(signum).name, n)
                stopping.set()
                for proc in procs:
                    if proc.returncode is None:
                        proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(options["shutdown_timeout"] + 5):
                    for proc in procs:
                        await proc.wait()
                nursery.cancel_scope.cancel()
                break
    for proc in procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return 0 if all(p.returncode == 0 for p in procs) else 1


def leave_metrics_dir(metrics_dir: str | None) -> None:
    """A worker stopping because its parent is gone (killed: its ``finally`` did not run): nobody else will
    remove the metrics directory. Each such worker removes its own files, and the last one out (whose rmdir
    finds the directory empty) the directory, so a killed kfan leaves nothing in /tmp however often it is."""
    if not metrics_dir:
        return
    own = f"_{os.getpid()}.db"
    with suppress(OSError):
        for name in os.listdir(metrics_dir):
            if name.endswith(own):
                os.unlink(os.path.join(metrics_dir, name))
        os.rmdir(metrics_dir)
