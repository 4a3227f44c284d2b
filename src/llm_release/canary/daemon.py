"""A server of the Prometheus family the project runs on loopback (Prometheus,
Alertmanager): its own session, so it outlives the process that started it and ``down``
stops its whole group; its pid and port in files under its directory; ready when
``GET /-/ready`` answers 200 (with the credentials ``http_auth`` gives, for a server that
asks for them). Subclasses say how to build the command line and what a failed start's log
means."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import requests

from llm_release.errors import ReleaseError
from llm_release.fileio import atomic_write_text
from llm_release.hub.credentials import child_env
from llm_release.serving import processes
from llm_release.serving.serve import free_port, stop_process_group

READY_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 20


class Daemon:
    name = "server"
    error: type[ReleaseError] = ReleaseError
    port_env = ""
    stop_grace_s = 10.0

    directory: Path
    config_path: Path
    pid_path: Path
    port_path: Path
    log_path: Path
    port: int | None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def http_auth(self) -> tuple[str, str] | None:
        """The user and password its HTTP API asks for (None: it asks for none)."""
        return None

    def pid(self) -> int | None:
        return processes.pid_from_file(self.pid_path, f"--config.file={self.config_path}")

    def running(self) -> bool:
        return self.pid() is not None

    def recorded_port(self) -> int | None:
        """The port its port file names while it runs (None when it does not). The file is
        a state file, input like any, and clients send the server's credentials to that
        port: one held by a process outside the server's own is refused in one line."""
        pid = self.pid()
        port = processes.read_int(self.port_path) if pid is not None else None
        if port is None:
            return None
        others = processes.foreign_listeners(port, processes.tree(pid)) if 0 < port < 65536 else []
        if not 0 < port < 65536 or others:
            held = f" held by {', '.join(others)}" if others else ""
            raise self.error(
                f"{self.name}'s port file {self.port_path} names port {port}{held}, not its "
                f"server's (pid {pid}): its credentials are not sent there",
                hint="stop it ('make down') and start it again ('make up')",
            )
        return port

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        if self.running():
            return
        if self.port:
            self._start(timeout_s)
            return
        # 'auto': a port picked now; one taken between the pick and the bind is picked again
        for attempt in range(3):
            self.port = free_port()
            try:
                self._start(timeout_s)
                return
            except self.error as exc:
                if attempt == 2 or "is in use" not in (exc.hint or ""):
                    raise

    def _start(self, timeout_s: float) -> None:
        raise NotImplementedError

    def _failure_hint(self, tail: str) -> str | None:
        """A subclass's reading of a failed start's log (None: the generic hints)."""
        return None

    def spawn(self, command: list[str], timeout_s: float) -> None:
        """Start ``command`` in its own session and wait until it is ready; a start that
        fails is stopped and raised with its log's tail and a hint."""
        with open(self.log_path, "ab") as log:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.directory,
                env=child_env(),
                start_new_session=True,
            )
        atomic_write_text(self.pid_path, f"{proc.pid}\n")
        atomic_write_text(self.port_path, f"{self.port}\n")
        auth = self.http_auth()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                if requests.get(f"{self.url}/-/ready", auth=auth, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        stop_process_group(proc.pid, grace_s=5)
        tail = self.log_tail()
        hint = self._failure_hint(tail) or f"see {self.log_path}"
        if "address already in use" in tail:
            hint = f"port {self.port} is in use: set {self.port_env} to a free port"
        raise self.error(f"{self.name} did not become ready:\n{tail}", hint=hint)

    def stop(self) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        # SIGTERM lets it write what it keeps (a TSDB head block, a notification log).
        return stop_process_group(pid, grace_s=self.stop_grace_s)
