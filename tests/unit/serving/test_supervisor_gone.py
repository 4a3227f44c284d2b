"""A supervisor killed (or lost with a reboot) restarts nothing: 'canary status' says it is
gone, never its last words ('backoff', 'restart in 2 s') as if it still ran. Real
processes: one spawned and killed (its pid recorded), one still running."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llm_release.cli import _server_text
from llm_release.fileio import atomic_write_text
from llm_release.serving import processes
from llm_release.serving.supervise import (
    GONE,
    SupervisorState,
    spec_path,
    state_path,
    summary,
)

BACKOFF = "exit code -9; crash 1 of at most 6 within 600 s; restart in 2 s"


def _spawn(*extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *extra])


def _write_state(log_path, pid: int, started: float | None, state: str = "backoff") -> None:
    record = SupervisorState(
        release_id="r1",
        state=state,
        supervisor_pid=pid,
        supervisor_started=started,
        restarts=1,
        reason=BACKOFF,
    )
    atomic_write_text(state_path(log_path), record.model_dump_json(indent=2) + "\n")


@pytest.fixture
def dead_pid():
    proc = _spawn()
    started = processes.start_time(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, started


def test_a_killed_supervisor_is_reported_gone_not_its_stale_backoff(tmp_path, dead_pid):
    log = tmp_path / "r1.log"
    pid, started = dead_pid
    _write_state(log, pid, started)
    found = summary(log)
    assert found["state"] == GONE and found["restarts"] == 1
    assert found["reason"] == (
        f"supervisor not running (pid {pid} gone): 'llm-release up' starts it again"
    )
    text = _server_text(found)
    assert "restart in" not in text and f"pid {pid} gone" in text


def test_an_older_state_file_without_a_start_time_is_checked_by_command_line(tmp_path, dead_pid):
    log = tmp_path / "r1.log"
    _write_state(log, dead_pid[0], None, state="running")
    assert summary(log)["state"] == GONE


def test_a_live_process_that_is_not_the_supervisor_is_not_taken_for_it(tmp_path):
    # A reused pid: alive, but another start time (or a command line not naming the spec).
    proc = _spawn()
    try:
        log = tmp_path / "r1.log"
        _write_state(log, proc.pid, processes.start_time(proc.pid) - 100)
        assert summary(log)["state"] == GONE
        _write_state(log, proc.pid, None)
        assert summary(log)["state"] == GONE
    finally:
        proc.kill()
        proc.wait()


def test_a_running_supervisor_keeps_its_figures(tmp_path):
    log = tmp_path / "r1.log"
    proc = _spawn(str(spec_path(log)))  # its command line names its spec, as a supervisor's does
    try:
        _write_state(log, proc.pid, processes.start_time(proc.pid))
        assert summary(log) == {"state": "backoff", "restarts": 1, "reason": BACKOFF}
    finally:
        proc.kill()
        proc.wait()


def test_a_supervisor_that_stopped_by_itself_is_not_called_gone(tmp_path, dead_pid):
    # 'stopped' and 'failed' are written as it exits: its absence is expected, not news.
    log = tmp_path / "r1.log"
    _write_state(log, dead_pid[0], dead_pid[1], state="stopped")
    assert summary(log)["state"] == "stopped"
