"""HAProxy in front of the stable release and the canary.

The config has two fixed server slots, ``stable`` and ``canary``, in one backend with
``balance roundrobin`` (weights are dynamic for it). Addresses, weights and drain state
change through HAProxy's runtime API on a unix socket, so a change never restarts the
proxy and never drops an in-flight request.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from . import processes
from .credentials import child_env
from .errors import RouterError
from .fileio import atomic_write_text
from .serve import free_port

BACKEND = "releases"
SLOTS = ("stable", "canary")
# HAProxy needs an address for a slot that points nowhere yet; weight 0 + maint keeps it idle.
PARKED_ADDR = ("127.0.0.1", 9)
# HAProxy's own Prometheus exporter listens here (loopback only); unset: a free port, recorded
# in the router directory for as long as that HAProxy runs.
METRICS_PORT_ENV = "LLM_RELEASE_HAPROXY_METRICS_PORT"


@dataclass(frozen=True)
class SlotTarget:
    host: str
    port: int
    weight: int


def render_config(
    *,
    listen_port: int,
    socket_path: Path,
    pid_path: Path,
    stable: SlotTarget | None,
    canary: SlotTarget | None,
    metrics_port: int | None = None,
) -> str:
    lines = [
        "global",
        f"    stats socket {socket_path} mode 600 level admin",
        f"    pidfile {pid_path}",
        "    maxconn 2048",
        "",
        "defaults",
        "    mode http",
        "    timeout connect 5s",
        "    timeout client 600s",
        "    timeout server 600s",
        "    timeout http-request 30s",
        "    option httplog",
        "",
        "frontend llm",
        f"    bind 127.0.0.1:{listen_port}",
        f"    default_backend {BACKEND}",
        "",
        f"backend {BACKEND}",
        "    balance roundrobin",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        # One request per server connection, so HAProxy's per-server counters are requests.
        "    option http-server-close",
    ]
    for name, target in (("stable", stable), ("canary", canary)):
        if target is None:
            host, port = PARKED_ADDR
            lines.append(f"    server {name} {host}:{port} weight 0 disabled")
        else:
            lines.append(
                f"    server {name} {target.host}:{target.port} weight {target.weight} "
                "check inter 2s fall 3 rise 1"
            )
    if metrics_port is not None:
        # Per-server counters (responses by class, connection and response errors) for
        # Prometheus; a frontend of its own so no client of the service can read them.
        lines += [
            "",
            "frontend metrics",
            f"    bind 127.0.0.1:{int(metrics_port)}",
            "    no log",
            "    http-request use-service prometheus-exporter if { path /metrics }",
            "    http-request deny",
        ]
    return "\n".join(lines) + "\n"


class Router:
    """Controls one HAProxy instance whose files live under ``directory``."""

    def __init__(self, directory: Path, listen_port: int) -> None:
        self.directory = Path(directory)
        self.listen_port = listen_port
        self.socket_path = self.directory / "haproxy.sock"
        self.pid_path = self.directory / "haproxy.pid"
        self.config_path = self.directory / "haproxy.cfg"
        self.metrics_port_path = self.directory / "metrics-port"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    @property
    def metrics_port(self) -> int | None:
        """The port of HAProxy's Prometheus exporter, as recorded when it started."""
        try:
            return int(self.metrics_port_path.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    # -- process -------------------------------------------------------------------------
    def pid(self) -> int | None:
        try:
            pid = int(self.pid_path.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError):
            return None
        # The pid file outlives HAProxy; a reused pid is not ours unless it runs our config.
        if not processes.is_same(pid, None, cmdline_has=str(self.config_path)):
            return None
        return pid

    def running(self) -> bool:
        return self.pid() is not None and self.socket_path.exists()

    def start(self, stable: SlotTarget | None, canary: SlotTarget | None) -> None:
        binary = shutil.which("haproxy")
        if binary is None:
            raise RouterError(
                "haproxy is not installed",
                hint="run 'make setup' (it runs apt-get install -y haproxy) and try again",
            )
        self.directory.mkdir(parents=True, exist_ok=True)
        # HAProxy refuses a unix socket path longer than sun_path (108 bytes).
        if len(str(self.socket_path)) > 100:
            raise RouterError(
                f"router directory path is too long for a unix socket: {self.socket_path}",
                hint="set LLM_RELEASE_HOME to a shorter path",
            )
        metrics_port = int(os.environ.get(METRICS_PORT_ENV) or free_port())
        config = render_config(
            listen_port=self.listen_port,
            socket_path=self.socket_path,
            pid_path=self.pid_path,
            stable=stable,
            canary=canary,
            metrics_port=metrics_port,
        )
        atomic_write_text(self.config_path, config)
        check = subprocess.run(
            [binary, "-c", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            env=child_env(),
        )
        if check.returncode != 0:
            raise RouterError(f"HAProxy rejected its config:\n{check.stderr.strip()}")
        # The daemon inherits this environment for its lifetime: no hub tokens in it.
        proc = subprocess.run(
            [binary, "-D", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            env=child_env(),
        )
        if proc.returncode != 0:
            raise RouterError(
                f"HAProxy did not start: {proc.stderr.strip()}",
                hint=f"is port {self.listen_port} (or the metrics port {metrics_port}) already in "
                f"use? set a different router port or {METRICS_PORT_ENV}",
            )
        atomic_write_text(self.metrics_port_path, f"{metrics_port}\n")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.running():
                return
            time.sleep(0.05)
        raise RouterError("HAProxy started but its runtime socket never appeared")

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, signal.SIGKILL)
        self.socket_path.unlink(missing_ok=True)
        return True

    # -- runtime API -----------------------------------------------------------------------
    def command(self, line: str) -> str:
        if not self.socket_path.exists():
            raise RouterError(
                f"HAProxy runtime socket {self.socket_path} does not exist",
                hint="the router is not running; run a release or 'llm-release router start'",
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(5)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
        reply = b"".join(chunks).decode()
        stripped = reply.strip()
        if (
            stripped
            and not stripped.startswith("#")
            and any(marker in stripped for marker in ("Unknown", "No such", "Require", "invalid"))
        ):
            raise RouterError(f"HAProxy refused {line!r}: {stripped}")
        return reply

    def set_target(self, slot: str, target: SlotTarget | None) -> None:
        """Point ``slot`` at a server (or park it) and set its weight; no restart."""
        if slot not in SLOTS:
            raise RouterError(f"unknown slot {slot!r}; valid: {', '.join(SLOTS)}")
        server = f"{BACKEND}/{slot}"
        if target is None:
            self.command(f"set server {server} weight 0")
            self.command(f"set server {server} state maint")
            return
        self.command(f"set server {server} addr {target.host} port {target.port}")
        self.command(f"set server {server} check-port {target.port}")
        self.command(f"set server {server} weight {target.weight}")
        self.command(f"set server {server} state ready")
        self.command(f"enable health {server}")

    def set_weight(self, slot: str, weight: int) -> None:
        self.command(f"set server {BACKEND}/{slot} weight {int(weight)}")

    def stats(self) -> dict[str, dict[str, str]]:
        """HAProxy's own counters for each server slot (from ``show stat``)."""
        raw = self.command("show stat").lstrip("# ")
        rows = csv.DictReader(io.StringIO(raw))
        return {
            row["svname"]: row
            for row in rows
            if row.get("pxname") == BACKEND and row.get("svname") in SLOTS
        }
