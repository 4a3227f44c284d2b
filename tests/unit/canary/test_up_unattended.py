"""'llm-release up' as the systemd units run it every 30 s must be harmless: a release still
serving is never restarted, nothing starts after 'llm-release down' (until a plain 'up'),
a crash-looping release is left to an operator, and a record with no release is no error.
A release whose supervisor was killed (a real process, spawned and killed) is started
again. The restart itself is replaced by a recorder (real ones: tests/integration)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from llm_release import registry
from llm_release.canary import promote
from llm_release.cli import main as cli
from llm_release.config import ServingConfig
from llm_release.registry import Release
from llm_release.serving.processes import start_time
from tests.helpers import marked_env


def _release(pid: int, started: float | None, name: str) -> Release:
    return Release(
        release_id=name,
        candidate=name.split("-")[0],
        scheme="none",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/nonexistent",
        public_name="svc",
        port=20001,
        pid=pid,
        pid_started=started,
        log_path="/dev/null",
        serving=ServingConfig(),
    )


@pytest.fixture()
def live(home):
    # Its command line names the releases it stands in for, as a server's does.
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", STABLE, CANARY], env=marked_env()
    )
    yield proc.pid, start_time(proc.pid)
    proc.kill()
    proc.wait()


@pytest.fixture()
def dead(home):
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], env=marked_env()
    )
    started = start_time(proc.pid)
    proc.kill()
    proc.wait()
    return proc.pid, started


@pytest.fixture()
def restarts(monkeypatch) -> list[str]:
    started: list[str] = []

    def restart(release: Release, role: str = "stable") -> Release:
        started.append(release.release_id)
        return release

    monkeypatch.setattr(promote, "_restart", restart)
    monkeypatch.setattr(promote, "_apply", lambda router, state: None)
    monkeypatch.setattr(promote, "stop_release", lambda release, grace_s=20: False)
    return started


STABLE, CANARY = "stable-0123abcd-20261130000000", "canary-0123abcd-20261201000000"


def test_releases_still_serving_are_never_restarted(home, live, restarts):
    registry.save(
        registry.RegistryState(stable=_release(*live, STABLE), canary=_release(*live, CANARY))
    )
    assert promote.up(unattended=True)[1] == []
    assert promote.up()[1] == []
    assert restarts == []


def test_a_release_whose_supervisor_is_gone_is_started_again(home, live, dead, restarts):
    registry.save(
        registry.RegistryState(stable=_release(*live, STABLE), canary=_release(*dead, CANARY))
    )
    assert [s.split(" ")[0] for s in promote.up(unattended=True)[1]] == [CANARY]
    assert restarts == [CANARY]


def test_after_down_the_units_start_nothing_until_a_plain_up(home, dead, restarts, capsys):
    registry.save(registry.RegistryState(stable=_release(*dead, STABLE)))
    promote.down()
    assert promote.down_mark().exists()
    assert promote.up(unattended=True)[1] == []
    assert cli(["up", "--unattended"]) == 0
    assert "'llm-release down' stopped this home" in capsys.readouterr().out
    assert restarts == []
    assert len(promote.up()[1]) == 1 and restarts == [STABLE]
    assert not promote.down_mark().exists()


def test_a_crash_looping_release_is_left_to_an_operator(home, dead, restarts, monkeypatch):
    monkeypatch.setattr(promote, "crash_looping", lambda release: "6 crashes within 600 s")
    registry.save(registry.RegistryState(stable=_release(*dead, STABLE)))
    assert promote.up(unattended=True)[1] == []
    assert restarts == []
    assert len(promote.up()[1]) == 1 and restarts == [STABLE]


def test_a_record_without_releases_is_no_error_unattended(home, capsys):
    assert cli(["up", "--unattended"]) == 0
    assert "no release yet" in capsys.readouterr().out
    assert cli(["up"]) == 2
