"""The record's paths are input: a release's ``log_path`` is used only when it is a log of
the home's servers folder (no link, FIFO or device there), its ``run_dir`` only when it is a
run folder of the home. Anything else is refused in one line, or, where the release is only
read (status, history, the published card), left unread with a warning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from llm_release import paths, registry
from llm_release.canary import publish as canary_publish
from llm_release.config import ServingConfig
from llm_release.errors import StateError
from llm_release.registry import Release
from llm_release.reporting import lineage
from llm_release.serving import processes, supervise
from llm_release.serving.backends import process
from tests.helpers import marked_env

OWN_LOG = "stable-baseline-aaaaaaaa-20261205000000.log"


def _release(**fields) -> Release:
    return Release(
        **{
            "release_id": "baseline-aaaaaaaa-20261205000000",
            "candidate": "baseline",
            "scheme": "bf16",
            "repo_id": "tests/tiny-llama",
            "commit": "a" * 40,
            "model_dir": str(paths.models_dir() / "m"),
            "public_name": "svc",
            "port": 20001,
            "supervisor_port": 20002,
            "log_path": str(paths.servers_dir() / "stable-baseline-aaaaaaaa-20261205000000.log"),
            "serving": ServingConfig(),
        }
        | fields
    )


def test_a_log_of_the_servers_folder_is_used_where_it_is(home, tmp_path):
    servers = paths.servers_dir()
    servers.mkdir(parents=True, exist_ok=True)
    assert registry.recorded_log_path(_release(), "the stable release") == (
        servers.resolve() / OWN_LOG
    )
    (servers / OWN_LOG).write_text("a line\n")
    assert registry.recorded_log_path(_release(), "the stable release").is_file()


@pytest.mark.parametrize(
    "log_path",
    [
        "/root/.bashrc.log",
        "{home}/stable.log",  # in the home, not its servers folder
        "{home}/servers/../stable.log",
        "{home}/servers/sub/stable.log",
        "{home}/servers/stable.txt",
        "servers/stable.log",  # relative: would follow the working directory
    ],
)
def test_a_log_path_elsewhere_is_refused_in_one_line(home, log_path):
    release = _release(log_path=log_path.format(home=paths.home()))
    with pytest.raises(StateError, match=r"the stable release log_path .* is not a log of") as e:
        registry.recorded_log_path(release, "the stable release")
    assert "\n" not in e.value.one_line()


def test_a_link_or_a_fifo_in_the_servers_folder_is_refused(home, tmp_path):
    servers = paths.servers_dir()
    servers.mkdir(parents=True, exist_ok=True)
    secret = tmp_path / "secret"
    secret.write_text("keep out\n")
    (servers / OWN_LOG).symlink_to(secret)
    os.mkfifo(servers / OWN_LOG.replace("stable-", "canary-"))
    for name in (OWN_LOG, OWN_LOG.replace("stable-", "canary-")):
        release = _release(log_path=str(servers / name))
        with pytest.raises(StateError, match="is a link or not a regular file"):
            registry.recorded_log_path(release, "the stable release")


def _forged_state(folder, name: str = "forged.log", **state) -> str:
    """A log path (outside the servers folder, by default) with a supervisor state file
    beside it."""
    log_path = folder / name
    log_path.write_text("")
    state = {"release_id": "x", "state": "crash-looping", "supervisor_pid": 1} | state
    supervise.state_path(log_path).write_text(json.dumps(state))
    return str(log_path)


def test_status_reads_no_supervisor_state_beside_a_log_outside_the_servers_folder(home, tmp_path):
    forged = _release(log_path=_forged_state(tmp_path, reason="forged"))
    assert supervise.crash_looping(forged.log_path) == "forged"  # what it read before
    assert process.crash_looping(forged) is None
    assert process.server_summary(forged) is None
    # the same state beside a log of the servers folder is read
    paths.servers_dir().mkdir(parents=True, exist_ok=True)
    own = _release(log_path=_forged_state(paths.servers_dir(), OWN_LOG, reason="own"))
    assert process.crash_looping(own) == "own"


def test_stop_signals_no_group_named_beside_a_log_outside_the_servers_folder(
    home, tmp_path, monkeypatch
):
    asked: list[str] = []
    monkeypatch.setattr(
        supervise, "stop_server_group", lambda p, r=None: asked.append(str(p)) or True
    )
    forged = _release(log_path=_forged_state(tmp_path, server_pid=os.getpid()), pid=0)
    assert process.stop_release(forged) is False
    assert asked == []
    # a FIFO named as the log: nothing opens it, nothing hangs
    os.mkfifo(tmp_path / "fifo.log")
    done = threading.Event()
    threading.Thread(
        target=lambda: (
            process.stop_release(_release(log_path=str(tmp_path / "fifo.log"))),
            done.set(),
        ),
        daemon=True,
    ).start()
    assert done.wait(10), "stop_release hung on a FIFO the record named"
    assert asked == []


def _report_naming(folder, candidate: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    evals = [{"eval_set": "forged", "num_items": 1, "metrics": {}}]
    result = {"name": candidate, "scheme": "bf16", "role": "baseline", "status": "measured"}
    result["evals"] = evals
    (folder / "report.json").write_text(json.dumps({"results": [result]}))


def test_a_run_dir_outside_the_runs_folder_is_not_read(home, tmp_path, caplog):
    outside = tmp_path / "elsewhere" / "run-1"
    _report_naming(outside, "baseline")
    release = _release(run_dir=str(outside))
    assert registry.recorded_run_dir(release) is None
    assert "is not a run folder of" in caplog.text
    assert canary_publish.winner_evals(release) == []
    assert lineage._report(registry.recorded_run_dir(release)) is None
    # a link in the runs folder pointing out of it is the same folder elsewhere
    paths.runs_dir().mkdir(parents=True, exist_ok=True)
    (paths.runs_dir() / "run-2").symlink_to(outside, target_is_directory=True)
    assert registry.recorded_run_dir(_release(run_dir=str(paths.runs_dir() / "run-2"))) is None


def test_a_run_folder_of_the_home_is_read(home):
    inside = paths.runs_dir() / "run-3"
    _report_naming(inside, "baseline")
    release = _release(run_dir=str(inside))
    assert registry.recorded_run_dir(release) == inside.resolve()
    assert [e.eval_set for e in canary_publish.winner_evals(release)] == ["forged"]


def test_a_record_naming_another_releases_log_is_refused_and_stops_nothing_of_it(home):
    """The canary's row given the stable's log (and so its supervisor's spec, state and
    processes): refused in one line; a state file of another release stops nothing."""
    stable_log = paths.servers_dir() / "stable-stable-1111aaaa-20261205000000.log"
    canary = _release(release_id="canary-2222bbbb-20261205000000", log_path=str(stable_log))
    with pytest.raises(StateError, match="is not release canary-2222bbbb-20261205000000's log"):
        registry.recorded_log_path(canary, "the canary release")
    assert process.crash_looping(canary) is None and process.server_summary(canary) is None
    paths.servers_dir().mkdir(parents=True, exist_ok=True)
    stable_server = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=marked_env(home),
        start_new_session=True,
    )
    try:
        state = _forged_state(
            paths.servers_dir(),
            stable_log.name,
            release_id="stable-1111aaaa-20261205000000",
            server_pid=stable_server.pid,
            server_started=processes.start_time(stable_server.pid),
        )
        assert supervise.stop_server_group(state, "canary-2222bbbb-20261205000000") is False
        assert stable_server.poll() is None  # the stable's server runs on
        assert supervise.stop_server_group(state, "stable-1111aaaa-20261205000000") is True
        assert stable_server.wait(10) is not None
    finally:
        if stable_server.poll() is None:
            stable_server.kill()
            stable_server.wait(10)
