"""stunnel4 (Debian's, a real TLS implementation independent of kfan) as a TLS front for tests.

:func:`start_stunnel` runs one stunnel process in the foreground with one
service: TLS 1.2+ on ``accept_port``, plaintext to ``connect_port`` (server
mode), or the reverse with ``client=True``. With ``verify_ca`` it requires a
client certificate signed by that CA (mTLS). With ``proxy_protocol`` it opens
each plaintext connection with a PROXY protocol v1 line naming the TLS
client's address, so that the server behind it can tell connections apart.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apt import ensure_command
from tests.support.processes import follow_output, free_port, stop_process


def stunnel_binary() -> str:
    """stunnel4's binary (Debian names it stunnel4, with stunnel as an alias), installed with apt if missing."""
    return shutil.which("stunnel4") or shutil.which("stunnel") or ensure_command("stunnel4", "stunnel4")


@dataclass
class Stunnel:
    """A running stunnel process; ``log`` keeps growing with its output (debug level: handshakes, peer certificates)."""

    process: subprocess.Popen[str]
    accept_port: int
    connect_port: int
    config: Path
    log: list[str] = field(default_factory=list)

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.accept_port)

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        return "".join(self.log)

    def stop(self) -> int:
        return stop_process(self.process, 5)


def _config(
    accept_port: int,
    connect_port: int,
    cert: Path | None,
    key: Path | None,
    verify_ca: Path | None,
    client: bool,
    proxy_protocol: bool,
) -> str:
    lines = [
        "foreground = yes",
        "pid =",
        "debug = info",
        "syslog = no",
        "[kafka]",
        f"accept = 127.0.0.1:{accept_port}",
        f"connect = 127.0.0.1:{connect_port}",
        "sslVersionMin = TLSv1.2",
    ]
    if client:
        lines.append("client = yes")
    if cert is not None:
        lines.append(f"cert = {cert}")
    if key is not None:
        lines.append(f"key = {key}")
    if verify_ca is not None:
        # Server mode: require and verify the client's certificate. Client
        # mode: verify the server's certificate chain against this CA.
        lines += ["verifyChain = yes", f"CAfile = {verify_ca}"]
        if not client:
            lines.append("requireCert = yes")
    if proxy_protocol:
        lines.append("protocol = proxy")
    return "\n".join(lines) + "\n"


def _wait_port(port: int, process: subprocess.Popen[str], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.02)
    return False


def start_stunnel(
    accept_port: int | None,
    connect_port: int,
    cert: Path | None,
    key: Path | None,
    *,
    verify_ca: Path | None = None,
    workdir: Path,
    client: bool = False,
    proxy_protocol: bool = False,
    name: str = "stunnel",
) -> Stunnel:
    """stunnel accepting on 127.0.0.1:``accept_port`` (None: a free port) and connecting to 127.0.0.1:``connect_port``.

    Server mode (default): TLS with ``cert``/``key`` on the accept side;
    ``verify_ca`` makes a verified client certificate mandatory. Client mode:
    TLS on the connect side, ``cert``/``key`` an optional client certificate,
    ``verify_ca`` the CA the server must chain to. Returns once the accept
    port takes connections (the probe connection shows in the log as a
    failed handshake).
    """
    binary = stunnel_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []
    for _ in range(3):  # a free port can be taken between free_port() and stunnel's bind
        port = accept_port if accept_port is not None else free_port()
        config = workdir / f"{name}-{port}.conf"
        config.write_text(_config(port, connect_port, cert, key, verify_ca, client, proxy_protocol))
        proc = subprocess.Popen([binary, str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log, _ = follow_output(proc, r"Configuration successful", 10)
        if _wait_port(port, proc, 10):
            return Stunnel(proc, port, connect_port, config, log)
        stop_process(proc, 5)
        failures.append(f"--- {config}:\n{config.read_text()}--- output:\n{''.join(log)}")
        if accept_port is not None:
            break
    raise RuntimeError("stunnel did not start:\n" + "\n".join(failures))
