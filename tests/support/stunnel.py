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
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.apt import ensure_command
from tests.support.processes import follow_output, stop_process


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


# The line stunnel logs once its accept socket listens (bind, listen, then this line): the port it got.
BOUND = r"Service \[kafka\] \(FD=\d+\) bound to 127\.0\.0\.1:(\d+)"
START_TIMEOUT_S = 30.0


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
    """stunnel accepting on 127.0.0.1:``accept_port`` (None: a port stunnel picks) and connecting to 127.0.0.1:``connect_port``.

    Server mode (default): TLS with ``cert``/``key`` on the accept side;
    ``verify_ca`` makes a verified client certificate mandatory. Client mode:
    TLS on the connect side, ``cert``/``key`` an optional client certificate,
    ``verify_ca`` the CA the server must chain to. With ``accept_port`` None
    stunnel binds port 0 and the port is read from its own log line, so no
    other process can take it in between. Returns once that line says the
    accept socket listens (stunnel logs it after ``listen()``).
    """
    binary = stunnel_binary()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / f"{name}-{uuid.uuid4().hex[:8]}.conf"
    config.write_text(_config(accept_port or 0, connect_port, cert, key, verify_ca, client, proxy_protocol))
    proc = subprocess.Popen([binary, str(config)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log, bound = follow_output(proc, BOUND, START_TIMEOUT_S)
    if bound is None or proc.poll() is not None:
        stop_process(proc, 5)
        raise RuntimeError(f"stunnel did not start:\n--- {config}:\n{config.read_text()}--- output:\n{''.join(log)}")
    port = int(bound.group(1))
    assert accept_port is None or port == accept_port, (port, accept_port)
    return Stunnel(proc, port, connect_port, config, log)
