"""The process backend's release operations (the server itself is ``serve.VllmServer``,
a serving release's under a supervisor: ``supervise.SupervisedServer``)."""

from __future__ import annotations

import logging
from pathlib import Path

from llm_release import paths
from llm_release.errors import StateError
from llm_release.registry import Release, recorded_log_path
from llm_release.serving import processes, supervise
from llm_release.serving.serve import stop_process_group

log = logging.getLogger(__name__)


def _supervisor_log(release: Release) -> Path | None:
    """The log beside which the release's supervisor keeps its spec and state, when the
    record names one of the servers folder's logs; None (logged) when it names anything
    else: no file of it is then read, signalled or written."""
    if release.supervisor_port is None:
        return None
    try:
        return recorded_log_path(release, f"release {release.release_id}'s")
    except StateError as exc:
        log.warning("%s", exc.one_line())
        return None


def _recorded_alive(release: Release) -> bool:
    """Same pid and start time (older records: a command line naming the release), and a
    process this home's project started (``processes.is_ours``): a reused pid, or one a
    record names that belongs to somebody else, is never ours."""
    log_path = _supervisor_log(release)
    # vLLM's --served-model-name names the release; a supervisor's argument is its spec file
    names = (release.release_id, *([str(supervise.spec_path(log_path))] if log_path else []))
    return processes.is_same(
        release.pid, release.pid_started, cmdline_has=names
    ) and processes.is_ours(release.pid, paths.home())


def release_alive(release: Release) -> bool:
    """The release serves or will again by itself: its server runs, or its supervisor runs
    and has not given up on it (a crash-looping release is not alive)."""
    if not _recorded_alive(release):
        return False
    if release.supervisor_port is None:
        return True
    log_path = _supervisor_log(release)
    state = supervise.read_state(log_path) if log_path else None
    return state is None or state.state not in supervise.GAVE_UP


def port_problems(release: Release) -> list[str]:
    """The recorded ports another process listens on (the release's server tree, a supervisor
    and its vLLM, is the only one that may): the pipeline sends the servers' key there."""
    ours = processes.tree(release.pid) if _recorded_alive(release) else set()
    problems = []
    for field, port in (("port", release.port), ("supervisor_port", release.supervisor_port)):
        others = processes.foreign_listeners(port, ours) if port is not None else []
        if others:
            problems.append(f"{field} {port} is held by {', '.join(others)}")
    return problems


def stop_release(release: Release, grace_s: float = 20) -> bool:
    """Stop the recorded server (a supervisor stops its server first), and the server group
    a supervisor last ran should the supervisor be gone."""
    stopped = _recorded_alive(release) and stop_process_group(release.pid, grace_s)
    log_path = _supervisor_log(release)
    if log_path is not None:
        stopped = supervise.stop_server_group(log_path, release.release_id) or stopped
    return stopped


def crash_looping(release: Release) -> str | None:
    log_path = _supervisor_log(release)
    return supervise.crash_looping(log_path) if log_path else None


def server_summary(release: Release) -> dict | None:
    log_path = _supervisor_log(release)
    return supervise.summary(log_path) if log_path else None
