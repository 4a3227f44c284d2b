"""Checks that run before any download, quantization or server start."""

from __future__ import annotations

import shutil
import socket

from . import paths
from .config import ReleaseConfig
from .errors import ConfigError, RouterError, ServeError
from .evalsets import calibration_texts, validate
from .evaluate import load_decoding
from .promote import ensure_no_canary, router_for
from .quantize import load_calibration_texts
from .registry import load


def check(config: ReleaseConfig, router_port: int) -> None:
    load_decoding()
    calibration = calibration_texts()
    for name in config.evaluation.eval_sets:
        validate(name, calibration=calibration)
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
    if shutil.which("haproxy") is None:
        raise RouterError(
            "haproxy is not installed", hint="run 'make setup' (apt-get install haproxy)"
        )
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
