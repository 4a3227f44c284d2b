"""The process backend's release operations (the server itself is ``serve.VllmServer``)."""

from __future__ import annotations

from llm_release.registry import Release
from llm_release.serving import processes
from llm_release.serving.serve import stop_process_group


def release_alive(release: Release) -> bool:
    """Same pid and start time (older records: a command line naming the release). A
    reused pid is some other process, never ours."""
    return processes.is_same(release.pid, release.pid_started, cmdline_has=release.release_id)


def stop_release(release: Release, grace_s: float = 20) -> bool:
    if not release_alive(release):
        return False
    return stop_process_group(release.pid, grace_s)
