"""Checks that run before any download, quantization or server start."""

from __future__ import annotations

import shutil
import socket
import tempfile
from pathlib import Path

from llm_release import paths
from llm_release.canary import alertmanager, analysis, door, prometheus
from llm_release.canary.promote import default_router_port, ensure_no_canary, router_for
from llm_release.config import ReleaseConfig
from llm_release.errors import AlertmanagerError, ConfigError, MetricsError, RouterError, ServeError
from llm_release.evaluation.evaluate import load_decoding
from llm_release.evaluation.set_checks import validate_cached
from llm_release.hub import local_source
from llm_release.quantization.quantize import load_calibration_texts
from llm_release.registry import Release, load
from llm_release.serving import batch_invariance, processes
from llm_release.serving.serve import free_port


def check(config: ReleaseConfig) -> tuple[Release | None, str]:
    """Everything that can be checked before any work. Returns the release serving users
    now (the champion, when there is one) and the model name the service answers to."""
    router_port = config.router_port or default_router_port()
    champion, service_name = check_service(config)
    # A run's Prometheus URL past the endpoint policy (no metadata address, none of ours).
    analysis.prometheus_url(config.rollout.analysis)
    if config.source.hub == "local":
        # A run's local_path only under the operator's roots, every file inside them.
        local_source.checked_folder(config.source.local_path or "")
    load_decoding()
    for name in config.evaluation.eval_sets:
        validate_cached(name)  # checked again only when a file it read changed
    if config.load.prompts_from is not None:  # the load test's prompts: a set that loads
        validate_cached(config.load.prompts_from)
    for candidate in config.candidates:
        if candidate.scheme == "W4A16_AWQ":
            texts = load_calibration_texts(candidate.calibration_set)
            if not texts:
                raise ConfigError(f"calibration set {candidate.calibration_set!r} is empty")
    if not paths.vllm_python().exists():
        raise ServeError(
            f"the serving virtualenv is missing ({paths.vllm_python()})",
            hint="run 'make setup', or point LLM_RELEASE_VLLM_PYTHON at a python with vLLM",
        )
    if config.serving.backend == "docker":
        check_docker(config)
    check_host_kv_cache(config)
    batch_invariance.check(config.serving)
    if shutil.which("haproxy") is None:
        raise RouterError(
            "haproxy is not installed", hint="run 'make setup' (apt-get install haproxy)"
        )
    door.settings()  # the operator's door: a public bind without TLS and keys is refused
    ensure_no_canary()
    router = router_for(load())
    if not router.running():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", router_port))
            except OSError as exc:
                raise RouterError(
                    f"the load-balancer port {router_port} is taken by another program",
                    hint="free it or pass a different router_port",
                ) from exc
    # The canary is measured by the project's Prometheus, which the deploy starts.
    if shutil.which("prometheus") is None:
        raise MetricsError(
            "prometheus is not installed", hint="run 'make setup' (apt-get install prometheus)"
        )
    metrics = prometheus.for_home()
    if not metrics.running() and not _free(metrics.port):
        raise MetricsError(
            f"the Prometheus port {metrics.port} is taken by another program",
            hint=f"free it or set {prometheus.PORT_ENV} to another port",
        )
    # Its alerts go through the project's Alertmanager, which the deploy starts beside it.
    if not any(map(shutil.which, processes.ALERTMANAGER_BINARIES)) or not shutil.which("amtool"):
        raise MetricsError(
            "alertmanager (or amtool) is not installed",
            hint="run 'make setup' (apt-get install prometheus-alertmanager)",
        )
    alerts = alertmanager.for_home()
    if not alerts.running() and not _free(alerts.port):
        raise MetricsError(
            f"the Alertmanager port {alerts.port} is taken by another program",
            hint=f"free it or set {alertmanager.PORT_ENV} to another port",
        )
    if not alerts.running():
        check_alertmanager_starts()
    return champion, service_name


def check_alertmanager_starts() -> None:
    """Alertmanager started once in a scratch folder, on a port of its own, and stopped: one
    that cannot start here stops the release now, not at the promote stage after the
    measurements (on the H200, Debian's package unpacked without apt missed the default
    template compiled into it, and the release stopped after 14 minutes)."""
    with tempfile.TemporaryDirectory(prefix="llm-release-alertmanager-") as scratch:
        trial = alertmanager.Alertmanager(Path(scratch), port=free_port())
        try:
            trial.start()
        except AlertmanagerError as exc:
            raise AlertmanagerError(
                f"Alertmanager cannot start on this host (tried before any work): {exc.message}",
                hint="its log's tail above names the cause; 'make setup' installs Debian's "
                "prometheus-alertmanager with every file it reads",
            ) from None
        finally:
            trial.stop()


def check_host_kv_cache(config: ReleaseConfig) -> None:
    """A CPU host whose vLLM cannot hold the KV dtype the release asks for (fp8 without
    AVX-512 or AMX) refuses here, before the download: the serving runtime is asked."""
    from llm_release.hardware import detect
    from llm_release.serving.cpu_kernels import check_kv_cache

    serving = config.serving
    check_kv_cache(serving.kv_cache_dtype, serving.extra_args, None, detect())


def _free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_service(config: ReleaseConfig) -> tuple[Release | None, str]:
    """One service, one model name: a release of another repository or public name into a
    load balancer whose stable release serves a different one is refused, unless the config
    says it replaces that service's model (then the canary also answers to the service's
    name, so its clients never reach a server that does not serve it)."""
    stable = load().stable
    name = config.served_name()
    if stable is None:
        return None, name
    same = stable.repo_id == config.source.repo_id and stable.public_name == name
    if not same and not config.replaces_service:
        raise ConfigError(
            f"the service behind this load balancer serves {stable.public_name!r} "
            f"({stable.repo_id}); this release is {name!r} ({config.source.repo_id})",
            hint="release it into another service (another LLM_RELEASE_HOME and router_port), "
            "or set replaces_service: true to replace this service's model",
        )
    return stable, stable.public_name


def check_docker(config: ReleaseConfig) -> str:
    """The docker backend can start containers here: the daemon answers and the image is on
    the host (nothing is pulled during a release). Returns the image."""
    from llm_release.serving.backends.docker import resolve_image
    from llm_release.serving.backends.docker_client import client, sdk_errors

    docker = client()
    try:
        docker.ping()
    except Exception as exc:  # noqa: BLE001 - any failure to talk to the daemon
        raise ServeError(
            f"the Docker daemon does not answer ({' '.join(str(exc).split())[:200]})",
            hint="'make setup' installs docker.io and starts dockerd; or set DOCKER_HOST",
        ) from exc
    image = resolve_image(config.serving)
    try:
        docker.images.get(image)
    except sdk_errors().ImageNotFound:
        raise ServeError(
            f"serving.backend is docker and the image {image} is not on the Docker host",
            hint="run 'llm-release image build' (the local vLLM CPU image), or "
            f"'docker pull {image}' on a host that reaches the registry",
        ) from None
    return image
