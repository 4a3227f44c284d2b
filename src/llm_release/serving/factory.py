"""The one server factory: a server of the backend ``serving.backend`` names.

Every start goes through here (a candidate's measurement, the scheme probe, tuning,
eval-only, the stable and canary releases), so ``serving.backend: docker`` holds
everywhere. The only module that imports both backends.
"""

from __future__ import annotations

from pathlib import Path

from llm_release.config import ServingConfig
from llm_release.serving.backends.docker import DockerServer
from llm_release.serving.serve import Endpoint, Owner, Server, VllmServer
from llm_release.serving.supervise import SupervisedServer


def backend_class(serving: ServingConfig) -> type[Server]:
    """The server class of ``serving.backend``."""
    return DockerServer if serving.backend == "docker" else VllmServer


def make_server(
    model_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    log_path: Path,
    *,
    port: int | None = None,
    owner: Owner | None = None,
) -> Server:
    """A server of the backend ``serving.backend`` names (not started)."""
    cls = backend_class(serving)
    return cls(model_dir, served_names, serving, log_path, port=port, owner=owner)


def start_detached(
    model_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    log_path: Path,
    *,
    port: int | None = None,
    owner: Owner | None = None,
) -> Endpoint:
    """Start a server that outlives this process (stable/canary behind the router). The
    process backend's runs under a supervisor that restarts it when it dies (the docker
    backend's container has a restart policy)."""
    if serving.backend == "docker":
        server = make_server(model_dir, served_names, serving, log_path, port=port, owner=owner)
    else:
        server = SupervisedServer(
            model_dir, served_names, serving, log_path, port=port, owner=owner
        )
    return server.start_healthy()
