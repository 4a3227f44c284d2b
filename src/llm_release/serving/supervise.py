"""Supervised serving (process backend): a serving release's vLLM comes back when it dies.

One supervisor process per serving release (stable or canary), started detached by the
project (``python -m llm_release.serving.supervise SPEC``, in its own session). It runs
vLLM in a process group of its own; when vLLM exits without being asked to, it reaps the
WHOLE group (vLLM's engine-core and worker children die with it, never orphans), waits a
backoff that doubles with every crash in the window, and starts it again on the same port.
More than ``restart_limit`` crashes within ``restart_window_s`` is a crash loop: it stops
restarting, says so in its state file and its metrics, and stays up until it is stopped
(a crash-looping canary is rolled back, ``crash_looping``). A server that was healthy and
answers no /health for ``hang_after_s`` is hung: its group is killed, and that is a crash.
A server that dies before it was ever healthy is a failed start, not a crash: the
supervisor exits with vLLM's exit status, so the starter reports the log tail as for an
unsupervised server.

The policy (``after_exit``, ``backoff_s``, ``hung``) is pure; the effects go through
``Effects`` (``ProcessTree`` here, fakes in the unit tests). The supervisor serves its figures at
``/metrics`` (prometheus_client): restarts, crash loop, server up; the project's
Prometheus scrapes it (job ``supervisor``) and the alert rules watch it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import requests
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths, server_key
from llm_release.errors import ConfigError, ServeError, one_line
from llm_release.fileio import atomic_write_text
from llm_release.hub.credentials import child_env
from llm_release.secret_files import private_file
from llm_release.serving import locked_exporter, processes
from llm_release.serving.serve import (
    Endpoint,
    VllmServer,
    free_port,
    stop_process_group,
)
from llm_release.settings import settings

MODULE = "llm_release.serving.supervise"
# How often the supervisor looks at its server (exit status; /health until healthy).
POLL_S = 0.5
# How often a healthy server's /health is asked (a hung one is killed: ``hung``).
HEALTH_EVERY_S = 2.0
# Seconds a stopping server gets between SIGTERM and SIGKILL (the starter waits longer).
STOP_GRACE_S = 15.0
# A dead server's leftover group members get this long after SIGTERM before SIGKILL
# (an orphaned vLLM engine core was seen to ignore SIGTERM: 5 s were all waiting).
REAP_GRACE_S = 2.0

State = Literal["starting", "running", "backoff", "crash-looping", "failed", "stopped"]
# The states in which a release is not serving and will not be brought back by itself.
GAVE_UP: frozenset[str] = frozenset({"crash-looping", "failed", "stopped"})


# ----------------------------------------------------------------------------- policy


class RestartPolicy(BaseModel):
    """When to restart a dead server: backoff doubling from ``backoff_s`` up to
    ``backoff_max_s``; more than ``limit`` crashes within ``window_s`` is a crash loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backoff_s: float = Field(2.0, gt=0)
    backoff_max_s: float = Field(60.0, gt=0)
    limit: int = Field(5, ge=0)
    window_s: float = Field(600.0, gt=0)
    hang_after_s: float = Field(60.0, gt=0)

    @classmethod
    def from_settings(cls) -> RestartPolicy:
        s = settings()
        return cls(
            backoff_s=s.restart_backoff_s,
            backoff_max_s=s.restart_backoff_max_s,
            limit=s.restart_limit,
            window_s=s.restart_window_s,
            hang_after_s=s.hang_after_s,
        )


class Decision(BaseModel):
    """What to do after the server exited by itself."""

    model_config = ConfigDict(extra="forbid")

    action: Literal["restart", "give up", "fail"]
    wait_s: float = 0.0
    crashes: list[float] = Field(description="the crash times inside the window, this one too")
    reason: str


def backoff_s(policy: RestartPolicy, crashes: int) -> float:
    """The wait before the restart that follows the ``crashes``-th crash in the window."""
    if crashes <= 0:
        return 0.0
    return min(policy.backoff_max_s, policy.backoff_s * 2 ** (crashes - 1))


def hung(policy: RestartPolicy, last_answer: float, now: float) -> bool:
    """A server healthy once whose last /health answer is ``hang_after_s`` old is hung: alive
    to the kernel, no use to anyone (a deadlocked engine, a stopped process)."""
    return now - last_answer >= policy.hang_after_s


def after_exit(
    policy: RestartPolicy, crashes: list[float], now: float, code: int, *, ever_healthy: bool
) -> Decision:
    """The decision after an unasked-for exit with status ``code`` at ``now``, given the
    earlier crash times. A server never healthy since the supervisor started it failed to
    start: that is the starter's error to report, not a crash to retry."""
    if not ever_healthy:
        return Decision(
            action="fail",
            crashes=list(crashes),
            reason=f"the server exited with code {code} before it was ever healthy",
        )
    recent = [t for t in crashes if now - t <= policy.window_s] + [now]
    if len(recent) > policy.limit:
        return Decision(
            action="give up",
            crashes=recent,
            reason=f"{len(recent)} crashes within {policy.window_s:g} s (limit "
            f"{policy.limit} restarts); last exit code {code}",
        )
    wait = backoff_s(policy, len(recent))
    return Decision(
        action="restart",
        wait_s=wait,
        crashes=recent,
        reason=f"exit code {code}; crash {len(recent)} of at most {policy.limit + 1} "
        f"within {policy.window_s:g} s; restart in {wait:g} s",
    )


# ----------------------------------------------------------------------- the records


class SuperviseSpec(BaseModel):
    """What a supervisor runs (written by the starter, 0600, beside the server's log)."""

    model_config = ConfigDict(extra="forbid")

    release_id: str
    role: str
    service: str
    command: list[str]
    env: dict[str, str]
    log_path: str
    health_url: str
    metrics_port: int
    policy: RestartPolicy = Field(default_factory=RestartPolicy)
    stop_grace_s: float = STOP_GRACE_S


class SupervisorState(BaseModel):
    """What a supervisor says of its server (``<log>.supervisor.json``)."""

    model_config = ConfigDict(extra="forbid")

    release_id: str
    state: State
    supervisor_pid: int
    # The supervisor's start time: its pid alone is no identity once it is gone (older
    # files have none: then its command line must name its spec file).
    supervisor_started: float | None = None
    server_pid: int = 0
    server_started: float | None = None
    restarts: int = 0
    crashes: list[float] = Field(default_factory=list)
    last_exit_code: int | None = None
    reason: str | None = None
    updated_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())


def spec_path(log_path: str | Path) -> Path:
    return Path(log_path).with_suffix(".supervise.json")


def state_path(log_path: str | Path) -> Path:
    return Path(log_path).with_suffix(".supervisor.json")


def read_state(log_path: str | Path) -> SupervisorState | None:
    """The supervisor's last word on its server; None when it wrote none (or garbled)."""
    try:
        return SupervisorState.model_validate_json(state_path(log_path).read_bytes())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- effects


@dataclass
class Exit:
    """How a run of the server ended: its exit status, and whether it was healthy once.
    ``code`` None: the supervisor was asked to stop (and stopped the server)."""

    code: int | None
    healthy: bool = False
    hung: bool = False  # killed by the supervisor: no /health answer for hang_after_s


class Effects(Protocol):
    def now(self) -> float: ...

    def start(self) -> None:
        """Start the server in a process group of its own."""

    def watch(self) -> Exit:
        """Until the server exits or the supervisor is asked to stop (then stop the server)."""

    def reap(self) -> None:
        """Stop what is left of the server's process group (orphaned children)."""

    def sleep(self, seconds: float) -> bool:
        """Wait; False when asked to stop meanwhile."""

    def wait_for_stop(self) -> None: ...

    def report(self, state: State, **details: object) -> None: ...

    def count_restart(self) -> None: ...


@dataclass
class Outcome:
    state: State
    exit_status: int
    restarts: int
    crashes: list[float] = field(default_factory=list)


def supervise(policy: RestartPolicy, effects: Effects) -> Outcome:
    """Run the server until asked to stop, restarting it by ``policy`` when it dies."""
    crashes: list[float] = []
    restarts = 0
    ever_healthy = False
    while True:
        effects.start()
        ended = effects.watch()
        effects.reap()
        if ended.code is None:
            effects.report("stopped", reason="asked to stop")
            return Outcome("stopped", 0, restarts, crashes)
        ever_healthy = ever_healthy or ended.healthy
        decision = after_exit(policy, crashes, effects.now(), ended.code, ever_healthy=ever_healthy)
        crashes = decision.crashes
        if decision.action == "fail":
            effects.report("failed", last_exit_code=ended.code, reason=decision.reason)
            return Outcome("failed", ended.code or 1, restarts, crashes)
        if decision.action == "give up":
            effects.report(
                "crash-looping", last_exit_code=ended.code, reason=decision.reason, crashes=crashes
            )
            effects.wait_for_stop()
            effects.report(
                "stopped", reason=f"asked to stop while crash-looping: {decision.reason}"
            )
            return Outcome("crash-looping", 0, restarts, crashes)
        why = f"hung, killed; {decision.reason}" if ended.hung else decision.reason
        effects.report("backoff", last_exit_code=ended.code, reason=why, crashes=crashes)
        if not effects.sleep(decision.wait_s):
            effects.report("stopped", reason="asked to stop during the backoff")
            return Outcome("stopped", 0, restarts, crashes)
        restarts += 1
        effects.count_restart()


class ProcessTree:
    """The real effects: the server a process group, its figures at ``/metrics``."""

    def __init__(self, spec: SuperviseSpec) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge

        self.spec = spec
        self.stopping = threading.Event()
        self.process: subprocess.Popen | None = None
        self.status = SupervisorState(
            release_id=spec.release_id,
            state="starting",
            supervisor_pid=os.getpid(),
            supervisor_started=processes.start_time(os.getpid()),
        )
        self.registry = CollectorRegistry()
        labels = ["service", "release", "role"]
        values = (spec.service, spec.release_id, spec.role)
        self.restarts = Counter(
            "llm_release_server_restarts",
            "Restarts of a serving release's server after it died",
            labels,
            registry=self.registry,
        ).labels(*values)
        self.crash_looping = Gauge(
            "llm_release_server_crash_looping",
            "1: the server crashed too often and is no longer restarted",
            labels,
            registry=self.registry,
        ).labels(*values)
        self.up = Gauge(
            "llm_release_server_up",
            "1: the supervisor saw the server healthy and it has not exited since",
            labels,
            registry=self.registry,
        ).labels(*values)

    def serve_metrics(self) -> None:
        """Its figures on 127.0.0.1, for whoever holds the servers' key (its server's)."""
        locked_exporter.serve(
            self.spec.metrics_port, self.registry, self.spec.env.get(server_key.KEY_ENV, "")
        )

    def _log(self, text: str) -> None:
        line = f"{datetime.now(UTC).isoformat()} supervisor: {text}\n"
        with open(self.spec.log_path, "a") as fh:
            fh.write(line)

    def now(self) -> float:
        return time.time()

    def start(self) -> None:
        self._log(f"starting {self.spec.release_id}'s server")
        with open(self.spec.log_path, "ab") as log:
            log.write(f"$ {' '.join(self.spec.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.spec.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.spec.env,
                umask=0o077,  # vLLM's ZMQ sockets in /tmp: its owner's alone
                start_new_session=True,  # its own process group: reaped as a whole
            )
        self.report(
            "starting",
            server_pid=self.process.pid,
            server_started=processes.start_time(self.process.pid),
        )

    def _healthy(self) -> bool:
        try:
            return requests.get(self.spec.health_url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def watch(self) -> Exit:
        assert self.process is not None
        healthy = False
        last_answer = probed = 0.0
        while True:
            if self.stopping.is_set():
                self._log("asked to stop: stopping the server's process group")
                stop_process_group(self.process.pid, self.spec.stop_grace_s)
                self._wait_leader()
                self.up.set(0)
                return Exit(None, healthy)
            code = self.process.poll()
            if code is not None:
                self.up.set(0)
                self._log(f"the server (pid {self.process.pid}) exited with code {code}")
                return Exit(code, healthy)
            if not healthy and self._healthy():
                healthy = True
                last_answer = probed = time.monotonic()
                self.up.set(1)
                self.report("running")
            elif healthy and time.monotonic() - probed >= HEALTH_EVERY_S:
                probed = time.monotonic()
                if self._healthy():
                    last_answer = probed
                elif hung(self.spec.policy, last_answer, probed):
                    return self._kill_hung(probed - last_answer)
            self.stopping.wait(POLL_S)

    def _kill_hung(self, silent_s: float) -> Exit:
        """SIGKILL for the whole group (a stopped or deadlocked server may not act on
        SIGTERM); then it is a crash like any other."""
        self._log(
            f"the server (pid {self.process.pid}) answered no /health for {silent_s:.0f} s: "
            "hung; killing its process group"
        )
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._wait_leader()
        self.up.set(0)
        code = self.process.poll()
        return Exit(code if code is not None else -signal.SIGKILL, True, hung=True)

    def _wait_leader(self) -> None:
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def reap(self) -> None:
        """The group outlives its leader while a child of it runs (vLLM's EngineCore)."""
        if self.process is not None and stop_process_group(self.process.pid, REAP_GRACE_S):
            self._log(f"reaped what was left of process group {self.process.pid}")

    def sleep(self, seconds: float) -> bool:
        return not self.stopping.wait(seconds)

    def wait_for_stop(self) -> None:
        self.crash_looping.set(1)
        self.stopping.wait()

    def count_restart(self) -> None:
        self.restarts.inc()
        self.status = self.status.model_copy(update={"restarts": self.status.restarts + 1})

    def report(self, state: State, **details: object) -> None:
        self.status = self.status.model_copy(
            update={"state": state, "updated_at": datetime.now(UTC).isoformat(), **details}
        )
        if state != "running" or "reason" in details:
            self._log(f"{state}" + (f": {details['reason']}" if details.get("reason") else ""))
        atomic_write_text(
            state_path(self.spec.log_path), self.status.model_dump_json(indent=2) + "\n"
        )


def read_spec(path: Path) -> SuperviseSpec:
    """The spec a supervisor runs: a file of this user that no one else can read or write
    (it names the command run and the server's environment, its key among it), in the
    spec's schema; ConfigError or ValidationError otherwise."""
    private_file(path, "spec", "the .supervise.json its starter wrote (mode 0600)")
    return SuperviseSpec.model_validate_json(path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        spec = read_spec(Path(args[0]))
    except (ConfigError, ValidationError, OSError, IndexError) as exc:
        print(f"supervisor: {one_line(exc)}; nothing started", file=sys.stderr)
        return 2
    tree = ProcessTree(spec)
    signal.signal(signal.SIGTERM, lambda *_: tree.stopping.set())
    signal.signal(signal.SIGINT, lambda *_: tree.stopping.set())
    tree.serve_metrics()
    outcome = supervise(spec.policy, tree)
    return outcome.exit_status


# ------------------------------------------------------------------- the starter's side


def supervisor_env(home: Path) -> dict[str, str]:
    """The supervisor's environment: no secrets, this package importable, the home mark."""
    import llm_release

    package_root = str(Path(llm_release.__file__).resolve().parents[1])
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    env[processes.HOME_MARK] = str(Path(home).resolve())
    return env


class SupervisedServer(VllmServer):
    """A serving release's vLLM under a supervisor (the process backend). ``pid()`` is the
    supervisor's: it lives as long as the release, whatever vLLM's pid is now."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.supervisor_port: int | None = None

    def what(self) -> str:
        return f"supervised vLLM for {self.served_names[-1]}"

    def endpoint(self) -> Endpoint:
        endpoint = super().endpoint()
        endpoint.supervisor_port = self.supervisor_port
        return endpoint

    def _launch(self, command: list[str], env: dict[str, str]) -> None:
        self.supervisor_port = free_port()
        spec = SuperviseSpec(
            release_id=self.owner.release_id or self.served_names[-1],
            role=self.owner.role,
            service=self.served_names[0],
            command=command,
            env=env,
            log_path=str(self.log_path),
            health_url=f"{self.base_url}/health",
            metrics_port=self.supervisor_port,
            policy=RestartPolicy.from_settings(),
        )
        path = spec_path(self.log_path)
        atomic_write_text(path, spec.model_dump_json(indent=2) + "\n")
        os.chmod(path, 0o600)
        state_path(self.log_path).unlink(missing_ok=True)
        self.mark_log_start()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", MODULE, str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=supervisor_env(paths.home()),
                start_new_session=True,
            )
        self.started = True

    def wait_healthy(self, timeout_s: float | None = None) -> Endpoint:
        """Healthy for the starter, and for the supervisor too: until it has seen its
        server healthy once, a death is a failed start to it, not a crash to restart."""
        timeout_s = timeout_s if timeout_s is not None else self.serving.startup_timeout_s
        deadline = time.monotonic() + timeout_s
        endpoint = super().wait_healthy(timeout_s)
        while time.monotonic() < deadline:
            state = read_state(self.log_path)
            if state is not None and state.state == "running":
                return endpoint
            if self.exit_code() is not None or (state is not None and state.state in GAVE_UP):
                raise self.died_error("its supervisor's first health check")
            time.sleep(0.1)
        self.stop()
        raise ServeError(f"the supervisor of {self.what()} never saw it healthy")

    def stop(self, grace_s: float = 20) -> None:
        super().stop(grace_s)
        stop_server_group(self.log_path)


def stop_server_group(log_path: str | Path, release_id: str | None = None) -> bool:
    """The server group a supervisor last ran, if it is still that process: a supervisor
    killed before it could stop its server leaves it behind. With ``release_id``, only if
    the state file is that release's."""
    state = read_state(log_path)
    if state is None or not state.server_pid:
        return False
    if release_id is not None and state.release_id != release_id:
        return False
    if not processes.is_same(state.server_pid, state.server_started):
        return False
    if not processes.is_ours(state.server_pid, paths.home()):
        return False  # the state file names a process the project did not start
    return stop_process_group(state.server_pid, REAP_GRACE_S)


def crash_looping(log_path: str | Path) -> str | None:
    """Why the supervised server of ``log_path`` is crash-looping; None while it is not."""
    state = read_state(log_path)
    if state is None or state.state != "crash-looping":
        return None
    return state.reason or "crash-looping"


def supervisor_running(log_path: str | Path, state: SupervisorState) -> bool:
    """The supervisor that wrote ``state`` still runs (same pid and start time; for an
    older file without one, a command line naming its spec file): a reused pid is not it."""
    return processes.is_same(
        state.supervisor_pid, state.supervisor_started, cmdline_has=str(spec_path(log_path))
    )


# The states a supervisor writes while it runs: once it is gone, they are stale.
WHILE_RUNNING: frozenset[str] = frozenset({"starting", "running", "backoff", "crash-looping"})
GONE = "supervisor gone"


def summary(log_path: str | Path) -> dict | None:
    """The supervisor's state, restarts and reason, for 'canary status'. A supervisor
    killed (or lost with a reboot) restarts nothing: its last words ('backoff', 'restart in
    2 s') are not repeated as if it still ran; the state says it is gone instead."""
    state = read_state(log_path)
    if state is None:
        return None
    if state.state in WHILE_RUNNING and not supervisor_running(log_path, state):
        return {
            "state": GONE,
            "restarts": state.restarts,
            "reason": f"supervisor not running (pid {state.supervisor_pid} gone): "
            "'llm-release up' starts it again",
        }
    return json.loads(state.model_dump_json(include={"state", "restarts", "reason"}))


if __name__ == "__main__":
    sys.exit(main())
