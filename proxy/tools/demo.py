"""The embedded cluster's processes: `kfan cluster` (librdkafka's mock brokers, relayed to another host
if asked) and, for `kfan demo`, that command in a child process with the banner that says how to connect.

A tool: the serving path never imports it; the CLI wires it to the server.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import trio

from proxy.runtime.lifeline import LIFELINE_ENV

log = logging.getLogger("kfan")


# The demo's brokers run in a child process: `kfan cluster`, the same command
# its users run. librdkafka's mock brokers do not validate what they receive,
# and some requests that pass kfan's schema check crash them (SIGSEGV,
# SIGABRT); in a child, such a crash takes the brokers down, not kfan.
DEMO_BROKERS = 3
DEMO_TOPIC = ("demo", 6)
_BROKERS_START_TIMEOUT_S = 60.0
_BROKERS_STOP_TIMEOUT_S = 10.0


class BrokersDidNotStart(RuntimeError):
    pass


def _exit_status(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


class BrokerProcess:
    """`kfan cluster` in a child process, for as long as the ``async with`` lasts.

    Entering starts it and reads its bootstrap from its stdout (with a
    deadline); ``watch`` logs its end once; leaving terminates and reaps it.
    """

    def __init__(self, brokers: int, topics: list[tuple[str, int]], log_json: bool = False) -> None:
        self.argv = [sys.executable, "-m", "proxy", "cluster", "--brokers", str(brokers), "--log-level", "WARNING"]
        if log_json:
            self.argv += ["--log-json", "true"]  # its stderr is kfan's: one log, one format
        for name, partitions in topics:
            self.argv += ["--topic", f"{name}:{partitions}"]
        self.command = " ".join(["kfan", *self.argv[3:]])
        self.bootstrap = ""
        self._process: trio.Process | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None
        return self._process.pid

    async def __aenter__(self) -> BrokerProcess:
        import subprocess

        # Wherever this kfan was imported from, the child imports the same code.
        root = str(Path(__file__).resolve().parent.parent)
        pythonpath = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, LIFELINE_ENV: "stdin", "PYTHONPATH": pythonpath}
        # Its own session: a Ctrl-C in the terminal reaches kfan only, which
        # drains its clients before it stops the brokers. Its stderr is kfan's.
        self._process = await trio.lowlevel.open_process(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True
        )
        try:
            with trio.move_on_after(_BROKERS_START_TIMEOUT_S):
                self.bootstrap = await self._read_bootstrap()
            if not self.bootstrap:
                raise BrokersDidNotStart(
                    f"the embedded brokers (process {self.pid}: {self.command}) did not report their address"
                    f" within {_BROKERS_START_TIMEOUT_S:.0f} s"
                )
        except BaseException:
            await self.stop()
            raise
        log.info("embedded brokers: process %d (%s) at %s", self.pid, self.command, self.bootstrap)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _read_bootstrap(self) -> str:
        assert self._process is not None and self._process.stdout is not None
        buffer = b""
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                # `kfan cluster`'s first line: "kfan cluster: N brokers at HOST:PORT,HOST:PORT,..."
                text = line.decode(errors="replace").strip()
                if text.startswith("kfan cluster: ") and " brokers at " in text:
                    return text.rsplit(" brokers at ", 1)[1]
            data = await self._process.stdout.receive_some(65536)
            if not data:
                code = await self._process.wait()
                raise BrokersDidNotStart(
                    f"the embedded brokers (process {self.pid}: {self.command}) {_exit_status(code)}"
                    " before reporting their address (its error, if any, is above)"
                )
            buffer += data

    async def watch(self) -> None:
        """Wait for the child to end, and say so once: kfan keeps serving, its brokers unreachable."""
        assert self._process is not None and self._process.stdout is not None
        # Its stdout reaches end of file when it exits; read it so it never blocks on a full pipe.
        while await self._process.stdout.receive_some(65536):
            pass
        code = await self._process.wait()
        log.error(
            "embedded brokers: process %d %s; kfan keeps running, but every broker behind it is unreachable"
            " (restart kfan demo for new ones)",
            self.pid,
            _exit_status(code),
        )

    async def stop(self) -> None:
        """Terminate the child (SIGTERM, then SIGKILL after a while) and reap it; idempotent."""
        process = self._process
        if process is None:
            return
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(_BROKERS_STOP_TIMEOUT_S):
                    await process.wait()
                if process.returncode is None:
                    log.warning(
                        "embedded brokers: process %d still running %.0f s after SIGTERM, killing it", process.pid, _BROKERS_STOP_TIMEOUT_S
                    )
                    process.kill()
                    await process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    await trio.aclose_forcefully(stream)


def print_banner(addr: str, leaders: Mapping[int, int]) -> None:
    """How to connect, and which broker leads each partition of the topic demo (``leaders``: as kfan's topology has it)."""
    print(
        f"""
kfan demo: an embedded 3-broker Kafka cluster with kfan in front of it.

  Connect any Kafka client to:  {addr}
  (the clients see one broker; kfan splits requests across the three behind it)

  Topic "demo", 6 partitions, led by:
"""
        + "".join(f"    partition {p} -> broker {b}\n" for p, b in sorted(leaders.items()))
        + f"""
  Try it from another terminal (Python with confluent-kafka, which the
  setup already installed in .venv), copy-paste:

.venv/bin/python - <<'PY'
import os
from confluent_kafka import Producer, Consumer
p = Producer({{"bootstrap.servers": "{addr}"}})
for i in range(12):
    p.produce("demo", key=str(i), value=f"hello {{i}}")
p.flush()
c = Consumer({{"bootstrap.servers": "{addr}", "group.id": f"demo-{{os.getpid()}}", "auto.offset.reset": "earliest"}})
c.subscribe(["demo"])
got = 0
while got < 12:
    m = c.poll(5)
    if m is not None and m.error() is None:
        got += 1
        print("partition", m.partition(), m.key(), m.value())
c.close()
PY

  or with kcat:  kcat -b {addr} -L

Ctrl-C stops it.
""",
        flush=True,
    )


def run_cluster(args: argparse.Namespace, until_signal: Callable[[Callable[[trio.Nursery], Awaitable[None]]], Awaitable[object]]) -> int:
    """`kfan cluster`: librdkafka's mock brokers until a signal (``until_signal``: the CLI's, with its lifeline)."""
    from proxy.tools.mock_cluster import MockCluster
    from proxy.tools.mock_lib import MockError

    try:
        mock = MockCluster(args.brokers)
    except MockError as e:  # no librdkafka to run them (the demo extra missing): one line, not a traceback
        raise SystemExit(f"kfan cluster: {e}") from None
    with mock:
        for name, partitions in args.topic:
            mock.create_topic(name, partitions)
        ports = [int(a.rsplit(":", 1)[1]) for a in mock.bootstrap.split(",")]
        bootstrap = mock.bootstrap
        if args.host:
            for broker, port in enumerate(ports, start=1):
                mock.set_broker_address(broker, args.host, port)
            bootstrap = ",".join(f"{args.host}:{port}" for port in ports)
        print(f"kfan cluster: {args.brokers} brokers at {bootstrap}", flush=True)
        for name, partitions in args.topic:
            print(f"  topic {name}: {partitions} partitions, leaders round-robin", flush=True)
        print(f"Run: kfan serve --bootstrap {bootstrap}", flush=True)

        async def body(nursery: trio.Nursery) -> None:
            if args.host:
                for port in ports:
                    await nursery.start(relay, args.host, port)
            return None

        trio.run(until_signal, body)
    return 0


async def relay(host: str, port: int, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Forward connections on host:port to the mock broker on 127.0.0.1:port."""

    async def pipe(src: trio.SocketStream, dst: trio.SocketStream) -> None:
        try:
            while data := await src.receive_some(65536):
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await trio.aclose_forcefully(dst)

    async def handle(client: trio.SocketStream) -> None:
        try:
            broker = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            await trio.aclose_forcefully(client)
            return
        async with trio.open_nursery() as n:
            n.start_soon(pipe, client, broker)
            n.start_soon(pipe, broker, client)

    listeners = await trio.open_tcp_listeners(port, host=host)
    task_status.started()
    await trio.serve_listeners(handle, listeners)
