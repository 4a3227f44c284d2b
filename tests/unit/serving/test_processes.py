"""A process's identity, against real processes: its start time survives a step of the wall
clock (CI, 2026-12-04: a promoted stable taken for dead, started a second time beside the
first), an older record's epoch start time is still read, and only a process carrying the
home's mark is the project's."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from llm_release.serving import processes
from tests.helpers import marked_env

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture()
def sleeper(home):
    started = []

    def spawn(env: dict | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(SLEEP, env=env)
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        proc.kill()
        proc.wait(timeout=10)


def test_a_step_of_the_wall_clock_leaves_a_process_its_identity(sleeper, monkeypatch):
    proc = sleeper()
    recorded = processes.start_time(proc.pid)
    assert recorded is not None and recorded < processes.EPOCH_FLOOR  # seconds after boot
    # psutil's epoch start time is its boot time (/proc/stat's btime) plus the ticks: a VM
    # restored from a snapshot, or an NTP step, moves btime under a running process.
    from psutil import _pslinux

    real_boot = psutil.boot_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: real_boot + 7)
    assert abs(psutil.Process(proc.pid).create_time() - (recorded + real_boot + 7)) < 0.05
    assert processes.is_same(proc.pid, recorded)
    assert not processes.is_same(proc.pid, recorded - 1)


def test_an_older_records_epoch_start_time_is_still_read(sleeper):
    proc = sleeper()
    epoch = psutil.Process(proc.pid).create_time()
    assert processes.is_same(proc.pid, epoch)
    assert not processes.is_same(proc.pid, epoch - 30)


def test_only_a_process_with_the_homes_mark_is_ours(sleeper, home, tmp_path):
    ours = sleeper(marked_env(home))
    stranger = sleeper()
    other_home = sleeper(marked_env(tmp_path))
    assert processes.is_ours(ours.pid, home)
    assert not processes.is_ours(stranger.pid, home)
    assert not processes.is_ours(other_home.pid, home)
    assert not processes.is_ours(999_999_999, home)


def test_a_command_line_names_a_release_by_an_equal_argument_not_a_part_of_one(home):
    """A forged record whose release id begins another's (``…-2026113000000`` of
    ``…-20261130000000``) names none of that release's processes (issue 36, medium 3)."""
    victim = "stable-0123abcd-20261130000000"
    proc = subprocess.Popen([*SLEEP, "--served-model-name", "svc", victim])
    try:
        # until it has exec'd, its /proc cmdline is the forking test's
        deadline = time.monotonic() + 10
        while victim not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)
        started = processes.start_time(proc.pid)
        assert processes.is_same(proc.pid, started, cmdline_has=victim)
        assert processes.is_same(proc.pid, started, cmdline_has=("nope", victim))
        assert not processes.is_same(proc.pid, started, cmdline_has=victim[:-1])
        assert not processes.is_same(proc.pid, started, cmdline_has="0123abcd")
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _listen(pid):
    """One row of psutil.net_connections: a socket listening on port 8123."""
    from types import SimpleNamespace

    return SimpleNamespace(status=psutil.CONN_LISTEN, laddr=SimpleNamespace(port=8123), pid=pid)


def test_a_socket_psutil_has_not_yet_matched_to_its_process_is_looked_at_again(monkeypatch):
    # the kernel's table lists the socket before psutil's descriptor scan finds its owner
    reads = iter([[_listen(None)], [_listen(None)], [_listen(4242)]])
    monkeypatch.setattr(processes, "UNSEEN_WAIT_S", 0.0)
    monkeypatch.setattr(psutil, "net_connections", lambda kind: next(reads))
    assert processes.foreign_listeners(8123, {4242}) == []


def test_a_socket_that_stays_pidless_is_another_users(monkeypatch):
    calls = []
    monkeypatch.setattr(processes, "UNSEEN_WAIT_S", 0.0)
    monkeypatch.setattr(psutil, "net_connections", lambda kind: calls.append(1) or [_listen(None)])
    assert processes.foreign_listeners(8123, {4242}) == ["another user's process"]
    assert len(calls) == 1 + processes.UNSEEN_RETRIES


def test_a_real_listener_of_this_process_is_ours_and_anothers_is_named():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        me = os.getpid()
        assert processes.foreign_listeners(port, {me}) == []
        assert processes.foreign_listeners(port, {1}) == [f"pid {me}"]
