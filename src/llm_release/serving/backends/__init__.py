"""Serving backends: where a candidate's or a release's vLLM server runs.

``process`` (the embedded default) runs vLLM from the serving virtualenv; ``docker`` runs
it in a container through the Docker SDK. Both serve the same endpoint (health, OpenAI
API, ``/metrics``) with the same vLLM arguments (``serve.vllm_args``); a release records
its backend in ``release.serving.backend`` and its server's identity (a pid and start
time, or a container id), and these functions act on whichever it is.
"""

from __future__ import annotations

from pathlib import Path

from llm_release.registry import Release


def release_alive(release: Release) -> bool:
    """The recorded server still runs and is the one recorded (never a reused pid, never
    a container of another release or project home)."""
    if release.serving.backend == "docker":
        from llm_release.serving.backends.docker import release_alive as alive
    else:
        from llm_release.serving.backends.process import release_alive as alive
    return alive(release)


def ensure_watched(release: Release, role: str) -> str | None:
    """A running release's watch started again where it is gone: the docker backend's
    container watch (hang watch and restart metrics), a process of its own that nothing
    else restarts. The process backend's supervisor is the server's parent: a dead one
    makes the release not alive, and ``up`` restarts the release. What was started, or
    None."""
    if release.serving.backend != "docker":
        return None
    from llm_release.serving.backends.docker import ensure_watched as ensure

    return ensure(release, role)


def port_problems(release: Release) -> list[str]:
    """The release's recorded ports (``port``, ``supervisor_port``) that a process other than
    its own server holds, in words; empty when each is its own or free. A record anyone can
    edit must not steer the servers' key (HAProxy, Prometheus, the pipeline send it there) to
    another local user's listener."""
    if release.serving.backend == "docker":
        from llm_release.serving.backends.docker import port_problems as problems
    else:
        from llm_release.serving.backends.process import port_problems as problems
    return problems(release)


def stop_release(release: Release, grace_s: float = 20) -> bool:
    """Stop ``release``'s server if it is still the recorded one; False otherwise."""
    if release.serving.backend == "docker":
        from llm_release.serving.backends.docker import stop_release as stop
    else:
        from llm_release.serving.backends.process import stop_release as stop
    return stop(release, grace_s)


def crash_looping(release: Release) -> str | None:
    """Why ``release``'s server is no longer restarted after crashing too often (its
    supervisor gave up, or Docker's restart policy ran out of retries); None otherwise."""
    if release.serving.backend == "docker":
        from llm_release.serving.backends.docker import crash_looping as looping
    else:
        from llm_release.serving.backends.process import crash_looping as looping
    return looping(release)


def server_summary(release: Release) -> dict | None:
    """How restarting went for ``release``'s server: state, restarts, reason (or None)."""
    if release.serving.backend == "docker":
        from llm_release.serving.backends.docker import server_summary as summary
    else:
        from llm_release.serving.backends.process import server_summary as summary
    return summary(release)


def sweep_containers(home: Path, *, everything: bool) -> list[str]:
    """Remove the containers this project home left behind (see ``docker.sweep``); nothing
    when Docker is not installed or not running (then there are none to remove)."""
    import logging

    from llm_release.serving.backends.docker import sweep
    from llm_release.serving.backends.docker_client import docker_available

    if not docker_available():
        return []
    try:
        return sweep(home, everything=everything)
    except Exception as exc:  # noqa: BLE001 - 'down' goes on stopping what it can
        logging.getLogger(__name__).warning("the container sweep failed: %s", exc)
        return []
