"""The Docker SDK's client, the project's labels and error types: what the docker backend,
the image builder (``image``) and the GPU ledger (``gpus``) share.

Imports only the package's base modules (errors, paths); the SDK itself is imported when a
client is first needed, so a host without Docker never loads it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from llm_release import paths
from llm_release.errors import ServeError

PROJECT = "llm-release"
LABEL = "org.llm-release."


def label(name: str) -> str:
    return LABEL + name


def home_text(home: Path | None = None) -> str:
    return str(Path(home or paths.home()).resolve())


@functools.cache
def _client_for(pid: int, timeout: int) -> Any:
    import docker  # the SDK; only this backend needs it

    # A fork (Prefect's process worker) must not share the parent's HTTP connection pool.
    del pid
    return docker.from_env(version="auto", timeout=timeout)


def client(timeout: int = 120) -> Any:
    """A Docker SDK client for ``DOCKER_HOST`` (default: the local daemon's socket)."""
    try:
        return _client_for(os.getpid(), timeout)
    except ImportError as exc:
        raise ServeError(
            "the Docker SDK for Python is not installed", hint="run 'make setup'"
        ) from exc
    except Exception as exc:  # docker.errors.DockerException: no daemon, no permission
        raise ServeError(
            f"cannot reach the Docker daemon ({' '.join(str(exc).split())[:200]})",
            hint="'make setup' installs docker.io and starts dockerd; or set DOCKER_HOST",
        ) from exc


def docker_available() -> bool:
    try:
        client().ping()
    except Exception:  # noqa: BLE001 - no SDK, no daemon: nothing of ours can be running
        return False
    return True


def sdk_errors() -> Any:
    import docker.errors

    return docker.errors


def find_container(container_id: str | None) -> Any:
    if not container_id:
        return None
    try:
        return client().containers.get(container_id)
    except sdk_errors().NotFound:
        return None


def container_running(container_id: str) -> bool:
    try:
        found = find_container(container_id)
    except ServeError:
        return False
    return found is not None and found.status == "running"
