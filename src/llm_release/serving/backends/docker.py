"""The docker backend: one vLLM container per candidate or release, through the Docker SDK.

Each container is named and labelled with the project, the project home, the run or
release and the role; it mounts the model folder read-only at the same path (so vLLM's
arguments are the process backend's, ``serve.vllm_args``), joins the project's bridge
network with inter-container traffic off and publishes vLLM's port on 127.0.0.1 only,
gets shared memory (or the host's IPC namespace) as vLLM's Docker guide prescribes for
tensor parallelism, and GPUs through device requests on a GPU host. The image, the shared
memory and the IPC namespace are the operator's settings (``LLM_RELEASE_DOCKER_*``), not
a run's parameters. Its
log is copied from the daemon into the server's log file, so the failure message (log
tail, likely cause) reads the same as the process backend's. The container is removed on
every exit path; ``sweep`` removes what a killed pipeline left behind, by label, and
nothing else.

The SDK (``docker``) is imported here only, and only when a container is used.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from llm_release import paths, server_key
from llm_release.config import ServingConfig
from llm_release.errors import ServeError, StateError
from llm_release.registry import Release, recorded_log_path
from llm_release.serving import batch_invariance, gpus, processes
from llm_release.serving.backends import image
from llm_release.serving.backends.docker_client import (
    PROJECT,
    client,
    find_container,
    home_text,
    label,
    sdk_errors,
)
from llm_release.serving.serve import (
    MIDDLEWARE_DIR,
    VLLM_MODULE,
    Endpoint,
    Owner,
    Server,
    cpu_env,
    free_port,
    has_cuda,
    vllm_args,
)
from llm_release.settings import IMAGE_REF, MAX_SHM_GIB, NVLINK_MULTICAST_OFF, settings

log = logging.getLogger(__name__)

CONTAINER_PORT = 8000
# The roles whose container Docker restarts when it dies (with a restart policy).
SERVING_ROLES = ("stable", "canary")
METRICS_MODULE = "llm_release.serving.container_metrics"
# Where the vLLM middleware's folder (serve.MIDDLEWARE_DIR) is mounted in a container.
MIDDLEWARE_IN_CONTAINER = "/opt/llm-release/middleware"
# The project's own bridge network, with inter-container traffic off: a vLLM container is
# reached only through its port published on the host's 127.0.0.1, never from another
# container (on this network or the daemon's default bridge, which Docker keeps apart).
NETWORK = "llm-release-isolated"
NETWORK_OPTIONS = {"com.docker.network.bridge.enable_icc": "false"}
# vLLM binds the container's own address on that network (its hostname in /etc/hosts),
# not every address of the container.
HOSTNAME = "vllm-server"

# Host options are the operator's (the worker's environment or the deployment), never a
# run parameter: they decide what of the host a container shares.
IMAGE_ENV = "LLM_RELEASE_DOCKER_IMAGE"
SHM_ENV = "LLM_RELEASE_DOCKER_SHM_GIB"
IPC_HOST_ENV = "LLM_RELEASE_DOCKER_IPC_HOST"


class HostSettings(BaseModel):
    """The docker backend's host options, from the operator's environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = Field(
        "auto",
        description=f"{IMAGE_ENV}. auto: the official vLLM OpenAI server image at the pinned "
        "tag on a GPU host, the locally built vLLM CPU image elsewhere; or an image reference "
        "present on the host",
    )
    shm_size_gib: float = Field(
        4.0,
        gt=0,
        le=MAX_SHM_GIB,
        description=f"{SHM_ENV}: the container's /dev/shm (PyTorch shares tensors between "
        "tensor-parallel ranks through it)",
    )
    ipc_host: bool = Field(
        False,
        description=f"{IPC_HOST_ENV}=1: the container shares the host's IPC namespace instead "
        "of its own /dev/shm (vLLM's docs offer either for tensor parallelism)",
    )

    @field_validator("image")
    @classmethod
    def _image_ref(cls, value: str) -> str:
        if value != "auto" and not re.fullmatch(IMAGE_REF, value):
            raise ValueError(
                f"{value[:100]!r} is not an image reference "
                "(e.g. vllm/vllm-openai:v0.32.0 or registry:5000/team/vllm@sha256:…)"
            )
        return value


def host_settings() -> HostSettings:
    """The operator's host options (``settings``: ConfigError naming the variable when one
    is bad)."""
    current = settings()
    return HostSettings(
        image=current.docker_image,
        shm_size_gib=current.docker_shm_gib,
        ipc_host=current.docker_ipc_host,
    )


# vLLM's compile cache (torch.compile artifacts): kept under the project home across
# containers, so only the first start of a model compiles (100-120 s on 2 cores).
CACHE_IN_CONTAINER = "/root/.cache/vllm"
# Roles a pipeline process owns while it runs; stable and canary belong to the registry.
OWNED_ROLES = {"candidate", "probe", "build"}


def container_name(owner: Owner, port: int, home: Path | None = None) -> str:
    """Unique per daemon: the home (hashed), the role, run or release, and the port."""
    import hashlib

    digest = hashlib.sha256(home_text(home).encode()).hexdigest()[:8]
    name = f"llmr-{digest}-{owner.key()}-{port}"
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", name)[:200]


def labels_for(owner: Owner, port: int, home: Path | None = None) -> dict[str, str]:
    me = os.getpid()
    started = processes.start_time(me)
    found = {
        label("project"): PROJECT,
        label("home"): home_text(home),
        label("role"): owner.role,
        label("run-id"): owner.run_id or "",
        label("release-id"): owner.release_id or "",
        label("candidate"): owner.candidate or "",
        label("port"): str(port),
        # The pipeline process that started it: a candidate whose owner is gone was
        # left behind by a killed run.
        label("owner-pid"): str(me),
        label("owner-started"): f"{started:.2f}" if started is not None else "",
    }
    return found


def device_requests(chosen: list[int] | None, wanted: object) -> list[dict]:
    """GPUs as the daemon's device requests (``docker run --gpus``): the chosen indices,
    or every GPU (count -1) where the host's GPUs could not be listed."""
    if chosen:
        return [{"device_ids": [str(g) for g in chosen], "capabilities": [["gpu"]]}]
    if wanted == "all":
        return [{"count": -1, "capabilities": [["gpu"]]}]
    return []


def container_spec(
    *,
    image: str,
    model_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    port: int,
    owner: Owner,
    gpu_ids: list[int] | None,
    gpu_host: bool,
    home: Path | None = None,
    host: HostSettings | None = None,
    restart_limit: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``client.containers.run`` for one vLLM server (pure: no daemon).
    ``host``: the operator's host options (default: from the environment);
    ``restart_limit``: a serving release's restarts (default ``LLM_RELEASE_RESTART_LIMIT``)."""
    host = host or host_settings()
    if restart_limit is None:
        restart_limit = settings().restart_limit
    home_path = Path(home or paths.home()).resolve()
    model = str(Path(model_dir).resolve())
    env = {
        "HF_HUB_OFFLINE": "1",  # the model is a local folder; the container fetches nothing
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # The lock on every path but /health (llm_release.server_key): its key, and the
        # middleware's folder, mounted read-only below.
        server_key.KEY_ENV: server_key.key(home_path),
        "PYTHONPATH": MIDDLEWARE_IN_CONTAINER,
    } | NVLINK_MULTICAST_OFF
    if not gpu_host:
        # CPU ids as this host numbers them: the container shares the host's CPUs (no cpuset)
        env |= cpu_env(serving, owner.role)
    # the host's GPUs, read once through nvidia-smi (serving/batch_invariance.py)
    env |= batch_invariance.env(serving, gpu_ids) if gpu_host else {batch_invariance.ENV: "0"}
    spec: dict[str, Any] = {
        "image": image,
        "name": container_name(owner, port, home_path),
        "labels": labels_for(owner, port, home_path),
        # The official image's entrypoint differs between releases (python -m …, vllm
        # serve); the module is the one entry both images have.
        "entrypoint": ["python3", "-m", VLLM_MODULE],
        # vLLM listens on the container's address on the project's network (its hostname,
        # which Docker writes into the container's /etc/hosts), where only the host's
        # published port reaches it: inter-container traffic is off on that network, and
        # the host publishes on 127.0.0.1 only.
        "command": vllm_args(
            Path(model), HOSTNAME, CONTAINER_PORT, served_names, serving, cuda=gpu_host
        ),
        "hostname": HOSTNAME,
        "network": NETWORK,
        "ports": {f"{CONTAINER_PORT}/tcp": ("127.0.0.1", port)},
        "volumes": {
            model: {"bind": model, "mode": "ro"},
            str(MIDDLEWARE_DIR): {"bind": MIDDLEWARE_IN_CONTAINER, "mode": "ro"},
            str(home_path / "cache" / "vllm-container"): {
                "bind": CACHE_IN_CONTAINER,
                "mode": "rw",
            },
        },
        "environment": env,
        "init": True,  # tini as PID 1: signals reach vLLM, its engine processes are reaped
        "security_opt": ["no-new-privileges"],
        "detach": True,
    }
    if owner.role in SERVING_ROLES:
        # A serving release's container comes back when it dies (the daemon's backoff
        # doubles from 100 ms); a candidate's must stay dead so its failure is reported.
        spec["restart_policy"] = {"Name": "on-failure", "MaximumRetryCount": restart_limit}
    if host.ipc_host:
        spec["ipc_mode"] = "host"
    else:
        spec["shm_size"] = f"{int(host.shm_size_gib * 1024)}m"
    requests = device_requests(gpu_ids, serving.gpus) if gpu_host else []
    if requests:
        spec["device_requests"] = requests
    return spec


def resolve_image(serving: ServingConfig | None = None) -> str:
    """The operator's image (``LLM_RELEASE_DOCKER_IMAGE``), with ``auto`` made concrete for
    this host. ``serving`` is not read: a run does not pick what runs on the host."""
    del serving
    chosen = host_settings().image
    if chosen != "auto":
        return chosen
    return image.OFFICIAL_IMAGE if has_cuda() else image.local_image()


def ensure_network(docker: Any) -> None:
    """The project's isolated bridge network, created once per daemon."""
    errors = sdk_errors()
    if docker.networks.list(names=[NETWORK]):
        return
    try:
        docker.networks.create(
            NETWORK,
            driver="bridge",
            options=NETWORK_OPTIONS,
            labels={label("project"): PROJECT},
            check_duplicate=True,
        )
    except errors.APIError as exc:
        if exc.status_code != 409:  # another pipeline process created it first
            raise ServeError(f"the Docker daemon refused the network {NETWORK}: {exc}") from exc


class DockerServer(Server):
    """A vLLM container. Use as a context manager so it is removed on every exit path."""

    backend = "docker"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.container: Any = None
        self.image: str | None = None
        self._header = ""
        self._last_code: int | None = None
        # A serving release's restarts in Prometheus (serving/container_metrics.py)
        self.metrics_process: subprocess.Popen | None = None
        self.metrics_port: int | None = None

    def container_id(self) -> str | None:
        return self.container.id if self.container is not None else None

    def endpoint(self) -> Endpoint:
        endpoint = super().endpoint()
        endpoint.supervisor_port = self.metrics_port
        return endpoint

    def _start_metrics(self) -> None:
        """The container's restarts, crash loop and health at a /metrics of their own: a
        process of its own (it outlives this one, as the container does), scraped as the
        process backend's supervisor is."""
        self.metrics_port = free_port()
        self.metrics_process = _start_watch(
            self.container.id,
            self.served_names[0],
            self.owner.release_id or self.served_names[-1],
            self.owner.role,
            self.metrics_port,
            f"{self.base_url}/health",
            self.log_path,
        )

    def what(self) -> str:
        return f"vLLM container for {self.served_names[-1]}"

    def start(self) -> Endpoint:
        self._prepare()
        docker = client()
        self.image = resolve_image(self.serving)
        errors = sdk_errors()
        try:
            docker.images.get(self.image)
        except errors.ImageNotFound:
            raise ServeError(
                f"the image {self.image} is not on this Docker host",
                hint="run 'llm-release image build' (the local vLLM CPU image), or "
                f"'docker pull {self.image}' on a host that reaches the registry",
            ) from None
        gpu_host = has_cuda()
        self._claim_gpus()
        spec = container_spec(
            image=self.image,
            model_dir=self.model_dir,
            served_names=self.served_names,
            serving=self.serving,
            port=self.port,
            owner=self.owner,
            gpu_ids=self.gpus or None,
            gpu_host=gpu_host,
        )
        (paths.home() / "cache" / "vllm-container").mkdir(parents=True, exist_ok=True)
        ensure_network(docker)
        self._header = (
            f"$ docker run {spec['name']} ({self.image}) "
            f"{' '.join(spec['entrypoint'] + spec['command'])}\n"
        )
        # Appended after what the file holds (a restarted release keeps its earlier log).
        self.mark_log_start()
        with self.log_path.open("a") as fh:
            fh.write(self._header)
        try:
            self.container = self._run(docker, spec)
        except BaseException:
            self._give_back_gpus()
            raise
        self.started = True
        if self.gpus:
            gpus.bind(self.gpu_holder, container=self.container.id)
        if self.owner.role in SERVING_ROLES:
            self._start_metrics()
        return self.endpoint()

    def _run(self, docker: Any, spec: dict[str, Any], *, again: bool = True) -> Any:
        errors = sdk_errors()
        try:
            return docker.containers.run(**spec)
        except errors.APIError as exc:
            gone = exc.status_code == 404 and "network" in str(exc.explanation or exc).lower()
            if gone and again:
                # another home's 'down' removed the shared network after ensure_network
                ensure_network(docker)
                return self._run(docker, spec, again=False)
            if exc.status_code != 409:
                raise ServeError(
                    f"the Docker daemon refused {spec['name']}: {exc.explanation or exc}"
                ) from exc
        # A container of this name is left from a killed run of this home (the name
        # carries the home's hash): it is ours to remove.
        leftover = docker.containers.get(spec["name"])
        if leftover.labels.get(label("home")) != spec["labels"][label("home")]:
            raise ServeError(f"a container named {spec['name']} exists and is not ours")
        leftover.remove(force=True)
        return docker.containers.run(**spec)

    def exit_code(self) -> int | None:
        if self.container is None:
            return None
        if self._last_code is not None:
            return self._last_code
        try:
            self.container.reload()
        except sdk_errors().NotFound:
            self._last_code = -1  # removed under us
            return self._last_code
        # 'restarting': a serving release's container died and its restart policy is at
        # work; seen by this server (while it starts) it is a failed start, as unsupervised.
        if self.container.status in ("exited", "dead", "restarting"):
            self._last_code = int(self.container.attrs["State"].get("ExitCode", -1))
        return self._last_code

    def sync_log(self) -> None:
        """The log file: what it held before this container, the ``docker run`` line, and
        the container's whole log as the daemon has it now."""
        if self.container is None:
            return
        try:
            text = self.container.logs(stdout=True, stderr=True).decode(errors="replace")
        except Exception:  # noqa: BLE001 - removed, or the daemon went: keep what we have
            return
        with self.log_path.open("r+b") as fh:
            fh.seek(self.log_start)
            fh.truncate()
            fh.write((self._header + text).encode())

    def stop(self, grace_s: float = 20) -> None:
        if self.metrics_process is not None and self.metrics_process.poll() is None:
            self.metrics_process.terminate()
            self.metrics_process.wait(10)
        if self.container is None:
            return
        self.sync_log()
        _remove(self.container, grace_s)
        self.sync_log()  # no-op once removed; the copy above holds the last lines
        self._give_back_gpus()


def _remove(container: Any, grace_s: float) -> None:
    """SIGTERM, SIGKILL after ``grace_s``, then the container is gone."""
    errors = sdk_errors()
    try:
        container.stop(timeout=int(grace_s))
    except errors.NotFound:
        return
    except errors.APIError as exc:
        log.warning("stopping %s: %s", container.name, exc)
    try:
        container.remove(force=True, v=True)  # with any anonymous volume it made
    except errors.NotFound:
        pass


def _is_recorded(container: Any, release: Release) -> bool:
    """The container is the release's own: same release id, same project home."""
    labels = container.labels or {}
    return (
        labels.get(label("project")) == PROJECT
        and labels.get(label("home")) == home_text()
        and labels.get(label("release-id")) == release.release_id
    )


def release_alive(release: Release) -> bool:
    try:
        found = find_container(release.container)
    except ServeError as exc:  # no daemon: nothing of it can be serving
        log.warning("%s: %s", release.release_id, exc.one_line())
        return False
    return found is not None and found.status == "running" and _is_recorded(found, release)


def _published_ports(container: Any) -> set[int]:
    """The host ports the container publishes on 127.0.0.1 (Docker's own record of them)."""
    ports = (container.attrs.get("NetworkSettings") or {}).get("Ports") or {}
    return {
        int(bind["HostPort"])
        for binds in ports.values()
        for bind in binds or []
        if bind.get("HostIp") == "127.0.0.1" and str(bind.get("HostPort", "")).isdigit()
    }


def _start_watch(
    container_id: str,
    service: str,
    release_id: str,
    role: str,
    port: int,
    health_url: str,
    log_path: Path,
) -> subprocess.Popen:
    """The container's watch (``container_metrics``): its restarts and health at a /metrics
    on ``port``, and the hang watch that restarts a container whose vLLM stopped answering.
    A log of its own: the release's log is rewritten from the container's (sync_log)."""
    from llm_release.serving.supervise import RestartPolicy, supervisor_env

    with Path(log_path).with_suffix(".metrics.log").open("ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                METRICS_MODULE,
                container_id,
                service,
                release_id,
                role,
                str(port),
                health_url,
                f"{RestartPolicy.from_settings().hang_after_s:g}",
                str(server_key.key_path()),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=supervisor_env(paths.home()),
            start_new_session=True,
        )


def ensure_watched(release: Release, role: str) -> str | None:
    """Start the watch of ``release``'s running container again when it is gone (killed,
    or lost with its host process while the container kept running): without it a hung
    container is never restarted and its restarts go unexported. What was started, in
    words; None when the watch runs, or there is no container of the release to watch."""
    if release.supervisor_port is None:
        return None
    try:
        found = find_container(release.container)
    except ServeError:
        return None
    if found is None or found.status != "running" or not _is_recorded(found, release):
        return None
    if _metrics_processes(found.id):
        return None
    if processes.foreign_listeners(release.supervisor_port, set()):
        log.warning(
            "%s: its watch is gone and its port %d is taken: not restarted",
            release.release_id,
            release.supervisor_port,
        )
        return None
    try:
        log_path = recorded_log_path(release, f"release {release.release_id}'s")
    except StateError as exc:
        log.warning("%s", exc.one_line())
        return None
    _start_watch(
        found.id,
        release.public_name,
        release.release_id,
        role,
        release.supervisor_port,
        f"http://127.0.0.1:{release.port}/health",
        log_path,
    )
    return f"the watch of {release.release_id}'s container (port {release.supervisor_port})"


def _metrics_processes(container_id: str) -> set[int]:
    """This user's container-metrics processes of the container (``_start_metrics``)."""
    import psutil

    found = set()
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        cmdline = proc.info["cmdline"] or []
        uids = proc.info["uids"]
        if uids is not None and uids.real == os.getuid() and METRICS_MODULE in cmdline:
            if container_id in cmdline:
                found.add(proc.pid)
    return found


def port_problems(release: Release) -> list[str]:
    """The recorded ports held by something other than the release's container (``port``:
    published by it, whoever listens for Docker) and its metrics process
    (``supervisor_port``)."""
    try:
        found = find_container(release.container)
    except ServeError:
        found = None
    ours = found is not None and _is_recorded(found, release)
    problems = []
    if not (ours and release.port in _published_ports(found)):
        others = processes.foreign_listeners(release.port, set())
        if others:
            problems.append(f"port {release.port} is held by {', '.join(others)}")
    if release.supervisor_port is not None:
        metrics = _metrics_processes(found.id) if ours else set()
        others = processes.foreign_listeners(release.supervisor_port, metrics)
        if others:
            problems.append(
                f"supervisor_port {release.supervisor_port} is held by {', '.join(others)}"
            )
    return problems


def stop_release(release: Release, grace_s: float = 20) -> bool:
    """Stop and remove the release's container, its log copied to the release's log file
    first; False when it was not running (a stopped one of ours is removed all the same)."""
    try:
        found = find_container(release.container)
    except ServeError as exc:
        log.warning("cannot stop %s: %s", release.release_id, exc.one_line())
        return False
    if found is None or not _is_recorded(found, release):
        return False
    was_running = found.status == "running"
    try:
        _save_log(found, recorded_log_path(release, f"release {release.release_id}'s"))
    except StateError as exc:  # the record names no log of ours: the log is not copied
        log.warning("%s", exc.one_line())
    _remove(found, grace_s)
    return was_running


def crash_looping(release: Release) -> str | None:
    """The release's container exited and its restart policy has no retry left."""
    try:
        found = find_container(release.container)
    except ServeError:
        return None
    if found is None or not _is_recorded(found, release):
        return None
    return looping_reason(found.status, found.attrs or {})


def looping_reason(status: str, attrs: dict) -> str | None:
    """A container (its status and inspect attributes) that exited with no retry of its
    on-failure restart policy left; None otherwise."""
    if status != "exited":
        return None
    policy = (attrs.get("HostConfig") or {}).get("RestartPolicy") or {}
    limit = int(policy.get("MaximumRetryCount") or 0)
    restarts = int(attrs.get("RestartCount") or 0)
    if policy.get("Name") != "on-failure" or restarts < limit:
        return None
    code = (attrs.get("State") or {}).get("ExitCode")
    return f"the container exited with code {code} after {restarts} restarts (limit {limit})"


def server_summary(release: Release) -> dict | None:
    """The container's state and Docker's restart count."""
    try:
        found = find_container(release.container)
    except ServeError:
        return None
    if found is None or not _is_recorded(found, release):
        return None
    return {"state": found.status, "restarts": int((found.attrs or {}).get("RestartCount") or 0)}


def _save_log(container: Any, log_path: Path) -> None:
    """The container's whole log into ``log_path``, in place of the copy taken when it
    became ready (after the last ``docker run`` line of this container, when there is one)."""
    try:
        text = container.logs(stdout=True, stderr=True).decode(errors="replace")
    except Exception:  # noqa: BLE001 - best effort: the container is going anyway
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    before = log_path.read_text(errors="replace") if log_path.exists() else ""
    marker = f"$ docker run {container.name} "
    cut = before.rfind(marker)
    if cut >= 0:
        line_end = before.find("\n", cut)
        before = before[: line_end + 1] if line_end >= 0 else before + "\n"
    else:
        before += f"$ docker run {container.name}\n"
    log_path.write_text(before + text)


def is_leftover(
    labels: dict[str, str],
    status: str,
    *,
    everything: bool,
    owner_alive: Callable[[int, float | None], bool],
) -> bool:
    """Whether a container of this project home is left behind.

    ``everything`` (``llm-release down``): all of them. Before a release: a container that
    no longer runs, and a candidate (or image build) whose pipeline process is gone.
    Stable and canary containers belong to the registry; only ``down`` removes them.
    """
    if everything or status not in ("running", "created", "restarting"):
        return True
    if labels.get(label("role")) not in OWNED_ROLES:
        return False
    try:
        pid = int(labels.get(label("owner-pid"), ""))
    except ValueError:
        return True
    started_text = labels.get(label("owner-started"), "")
    started = float(started_text) if started_text else None
    return not owner_alive(pid, started)


def _owner_alive(pid: int, started: float | None) -> bool:
    # Start times in labels are rounded to 10 ms (a clock tick).
    if started is None:
        return processes.is_alive(pid)
    return processes.is_alive(pid) and processes.same_start(pid, started)


def sweep(home: Path, *, everything: bool) -> list[str]:
    """Remove this home's leftover containers (see ``is_leftover``) and nothing else: the
    daemon is asked only for containers labelled with this project and this home."""
    docker = client()
    found = docker.containers.list(
        all=True,
        filters={"label": [f"{label('project')}={PROJECT}", f"{label('home')}={home_text(home)}"]},
    )
    removed = []
    for container in found:
        labels = container.labels or {}
        # The daemon filtered by label; checked again here, so a filter the daemon
        # ignored could never widen what is removed.
        if labels.get(label("project")) != PROJECT or labels.get(label("home")) != home_text(home):
            continue
        if not is_leftover(
            labels, container.status, everything=everything, owner_alive=_owner_alive
        ):
            continue
        role, release_id = labels.get(label("role"), ""), labels.get(label("release-id"), "")
        if role in ("stable", "canary") and re.fullmatch(r"[\w.-]+", release_id):
            # Where the release's own log is (promote's naming): a crash's log is kept.
            _save_log(container, Path(home) / "servers" / f"{role}-{release_id}.log")
        _remove(container, grace_s=10)
        removed.append(f"container {container.name} ({labels.get(label('role'), '?')})")
    if everything and remove_network_if_unused(docker):
        removed.append(f"network {NETWORK}")
    return removed


def remove_network_if_unused(docker: Any) -> bool:
    """The project's network, removed when no container is attached to it ('down'): it is
    the daemon's, shared by every project home there, so one still in use (another home's
    server, a container started meanwhile: the daemon refuses) stays."""
    errors = sdk_errors()
    removed = False
    for network in docker.networks.list(names=[NETWORK]):
        if (
            network.name != NETWORK
            or (network.attrs.get("Labels") or {}).get(label("project")) != PROJECT
        ):
            continue  # a network of that name the project did not create
        try:
            network.reload()
            if network.attrs.get("Containers"):
                continue
            network.remove()
            removed = True
        except errors.NotFound:
            continue
        except errors.APIError as exc:  # active endpoints: attached since the reload
            log.info("the network %s stays: %s", NETWORK, exc)
    return removed
