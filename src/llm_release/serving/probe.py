"""Know what the serving runtime can run on this host before spending on it.

Two measurements, both cached per host (CPU model and ISA flags, GPUs) and runtime version:

- **The served dtype.** On a CPU, the serving runtime's torch multiplies a matrix of the
  model's layer shape in bf16 and in float32 (``runtime_info.py``, run by the serving
  interpreter); the faster one is served. bf16 is kept unless float32 is clearly faster
  (it halves the KV cache and weight memory). On a GPU, bf16.
- **The schemes.** A tiny random-weight model with the release's tokenizer is quantized with
  each candidate's recipe and served by the real runtime with the chosen dtype until it
  answers one completion. vLLM CPU 0.32 on an AVX2-only processor starts a W4A16 model,
  reports healthy and dies at the first request (no ``cpu_gemm_wna16`` kernel in its AVX2
  library): the probe sees that in about a minute, instead of a 30-minute AWQ of the real
  model followed by a crash.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Literal

from pydantic import Field

from llm_release import paths
from llm_release.config import CandidateConfig, ServingConfig
from llm_release.errors import ReleaseError, ServeError
from llm_release.fileio import atomic_write_json
from llm_release.hardware import Hardware, compute_dtype
from llm_release.quantization.quantize import quantize
from llm_release.quantization.recipes import choose_recipe
from llm_release.serving.backends.docker import host_settings
from llm_release.serving.dtype import (
    Record,
    RuntimeInfo,
    cache_key,
    choose_dtype,
    layer_shape,
    read_cache,
    runtime_info,
)
from llm_release.serving.factory import make_server
from llm_release.serving.serve import Owner, diagnose
from llm_release.serving.tiny_models import build_tiny_model, build_tiny_moe_model

log = logging.getLogger(__name__)

# Log lines that say the runtime lacks a kernel or support for what it was asked to run;
# only these make a scheme "unsupported" (cached). Anything else is "unknown" (not cached).
UNSUPPORTED = re.compile(
    r"has no attribute '(?P<op>\w+)'|NotImplementedError|not supported|[Uu]nsupported"
    # vLLM 0.32 CPU on a W4A16 MoE: "No WNA16 MoE backend supports the deployment configuration"
    r"|No [\w ]+ backend supports"
)


class SchemeSupport(Record):
    candidate: str
    scheme: str
    dtype: str
    status: Literal["supported", "unsupported", "unknown"]
    reason: str
    seconds: float = 0.0
    cached: bool = False
    # the probe server's own log, kept beside the cached answer (its start, its requests,
    # the kernel it missed): why a scheme is refused, or why a fresh GPU host's probe is slow.
    # Derived from the cache's path, never stored in it.
    log: str | None = None


class PromptBound(Record):
    """What one request must meet: the load profile's prompt and the TTFT SLO."""

    prompt_tokens: int
    ttft_slo_s: float


class HostSupport(Record):
    """What this host and runtime will serve, decided before any candidate is built."""

    host: Hardware
    runtime: RuntimeInfo
    served_dtype: str
    dtype_reason: str
    calibration_dtype: str
    schemes: list[SchemeSupport] = Field(default_factory=list)

    def skip_reason(self, candidate: str) -> str | None:
        for support in self.schemes:
            if support.candidate == candidate and support.status == "unsupported":
                return support.reason
        return None

    def describe(self) -> str:
        return (
            f"{self.host.describe()}; vLLM {self.runtime.vllm}, torch {self.runtime.torch} "
            f"({self.runtime.torch_cpu_capability}); served dtype {self.served_dtype}; "
            f"calibration in {self.calibration_dtype}"
        )


def probe_scheme(
    candidate: CandidateConfig,
    served_dtype: str,
    tokenizer_dir: Path,
    host: Hardware,
    runtime: RuntimeInfo,
    *,
    startup_timeout_s: float = 600,
    where: ServingConfig | None = None,
    family: Literal["dense", "moe"] = "dense",
) -> SchemeSupport:
    """Quantize a tiny model with the candidate's recipe and have the runtime answer with it
    (in the backend and image of ``where``, the release's serving settings). ``family``
    ("dense" or "moe", from the release's model config): the tiny model has the model's
    kind of MLP, since a runtime may serve a scheme for dense layers and not for experts
    (vLLM CPU 0.32 serves FP8 and W4A16 Llamas, and neither for a Qwen3-MoE)."""

    backend = {"backend": "process"}
    host_options: list[dict] = []
    if where is not None and where.backend == "docker":
        backend = {"backend": "docker"}
        # The operator's image and shared memory (LLM_RELEASE_DOCKER_*) key the cache too.
        host_options = [host_settings().model_dump()]

    recipe = {
        "scheme": candidate.scheme,
        "symmetric": candidate.symmetric,
        "group_size": candidate.group_size if candidate.scheme == "W4A16_AWQ" else None,
    }
    key = cache_key(
        host.key(),
        runtime.python,
        runtime.vllm,
        runtime.torch,
        served_dtype,
        recipe,
        version("llmcompressor"),
        version("compressed-tensors"),
        *([backend | host_options[0]] if host_options else []),
        *([family] if family != "dense" else []),
    )[:16]
    cache = paths.probes_dir() / f"scheme-{key}.json"
    kept = cache.with_suffix(".vllm.log")  # the probe server's log, beside its answer
    cached = read_cache(cache)
    if cached is not None:
        found = {"log": str(kept) if kept.exists() else None}
        return SchemeSupport.model_validate(
            cached | found | {"candidate": candidate.name, "cached": True}
        )

    def result(status: str, reason: str) -> SchemeSupport:
        return SchemeSupport(
            candidate=candidate.name,
            scheme=candidate.scheme,
            dtype=served_dtype,
            status=status,
            reason=reason,
            seconds=round(time.monotonic() - started, 1),
        )

    started = time.monotonic()
    workdir = paths.probes_dir() / f"scheme-{key}"
    shutil.rmtree(workdir, ignore_errors=True)
    what = f"vLLM {runtime.vllm} on {host.cpu.describe() if not host.cuda else host.describe()}"
    try:
        build = build_tiny_moe_model if family == "moe" else build_tiny_model
        tiny = build(workdir / "model", tokenizer_dir, hidden_size=256)
        probe = candidate.model_copy(
            update={
                "name": "probe",
                "num_calibration_samples": 4,
                "max_seq_length": 64,
                "ignore": ["lm_head"],
                "extra_serving_args": [],
            }
        )
        built = quantize(tiny, probe, workdir / "candidates", host=host)
    except ReleaseError as exc:
        outcome = result(
            "unknown",
            f"the probe could not build a tiny {candidate.scheme} model: "
            f"{str(exc).splitlines()[0]}",
        )
        log.warning("%s: %s", candidate.name, outcome.reason)
        return outcome
    serving = ServingConfig(
        dtype=served_dtype,
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=2,
        startup_timeout_s=startup_timeout_s,
        **backend,
    )
    log_path = workdir / "vllm.log"
    try:
        owner = Owner(role="candidate", candidate=f"probe-{candidate.name}")
        with make_server(built.model_dir, ["probe"], serving, log_path, owner=owner):
            pass
    except ServeError as exc:
        text = log_path.read_text(errors="replace") if log_path.exists() else ""
        match = UNSUPPORTED.search(text)
        if match is None:
            outcome = result(
                "unknown", f"the probe server failed for another reason: {exc.message}"
            )
            log.warning("%s: %s", candidate.name, outcome.reason)
            return outcome
        outcome = result(
            "unsupported",
            f"{what} cannot serve {candidate.scheme} with dtype {served_dtype}: {diagnose(text)}",
        )
    else:
        outcome = result(
            "supported", f"{what} served a tiny {candidate.scheme} model ({served_dtype})"
        )
    if log_path.exists():
        shutil.copyfile(log_path, kept)
        outcome = outcome.model_copy(update={"log": str(kept)})
    atomic_write_json(
        cache, outcome.model_dump(exclude={"candidate", "cached", "log"}) | {"candidate": ""}
    )
    shutil.rmtree(workdir, ignore_errors=True)
    return outcome


def fp8_too_slow(
    candidate: CandidateConfig,
    config: dict,
    host: Hardware,
    runtime: RuntimeInfo,
    bound: PromptBound,
) -> SchemeSupport | None:
    """An FP8 candidate of a dense model whose one prompt of the load profile, alone on the
    server, cannot meet the TTFT SLO on this CPU at the rate its runtime multiplies FP8
    matrices; None where it may. A lower bound: only the MLP's three matrices of each layer
    (``6 × hidden × intermediate`` FLOPs a token), every core at the one-thread rate. On a
    Xeon with AVX512-FP16 and AMX, torch 2.13 runs FP8 through oneDNN's reference kernel
    (0.07-0.13 GFLOP/s): the demo's FP8 SmolLM2 took its first evaluation request past
    vLLM's 300 s limit for one step (2026-12-07) and was lost after 6 minutes."""
    if host.cuda or candidate.scheme != "FP8_DYNAMIC" or not runtime.fp8_gflops:
        return None
    text = config.get("text_config") or config
    layers = int(text.get("num_hidden_layers") or 0)
    hidden, intermediate = layer_shape(config)
    flops = bound.prompt_tokens * 6 * hidden * intermediate * layers
    seconds = flops / (runtime.fp8_gflops * 1e9 * max(host.cpu.cores, 1))
    if seconds <= bound.ttft_slo_s:
        return None
    return SchemeSupport(
        candidate=candidate.name,
        scheme=candidate.scheme,
        dtype="float8_e4m3fn",
        status="unsupported",
        reason=(
            f"torch {runtime.torch} multiplies FP8 matrices at {runtime.fp8_gflops:g} GFLOP/s "
            f"a thread on {host.cpu.describe()}: one {bound.prompt_tokens}-token prompt "
            f"through this model's MLPs alone needs at least {seconds:,.0f} s on "
            f"{host.cpu.cores} core(s), over the TTFT p95 SLO of {bound.ttft_slo_s:g} s "
            "(gates.ttft_p95_slo_s); not built"
        ),
    )


def check_host_support(
    model_dir: Path,
    candidates: list[CandidateConfig],
    serving: ServingConfig,
    host: Hardware,
    *,
    probe: bool = True,
    bound: PromptBound | None = None,
) -> HostSupport:
    """The served dtype and, per candidate, whether the runtime can serve its scheme here;
    with ``bound`` (the load profile's prompt and the TTFT SLO), an FP8 candidate that could
    not meet the SLO at this CPU's FP8 rate is refused before it is built."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    runtime = runtime_info(host, *layer_shape(config))
    served, why = choose_dtype(serving.dtype, host, runtime)
    support = HostSupport(
        host=host,
        runtime=runtime,
        served_dtype=served,
        dtype_reason=why,
        calibration_dtype="float32" if compute_dtype(host) == "float32" else "checkpoint's own",
    )
    if probe:
        family = "moe" if choose_recipe(config).moe else "dense"
        for candidate in candidates:
            if bound and family == "dense":
                slow = fp8_too_slow(candidate, config, host, runtime, bound)
                if slow is not None:
                    support.schemes.append(slow)
                    continue
            support.schemes.append(
                probe_scheme(
                    candidate, served, Path(model_dir), host, runtime, where=serving, family=family
                )
            )
    return support


def main() -> (
    None
):  # pragma: no cover - a diagnostic: python -m llm_release.serving.probe MODEL_DIR
    from llm_release.hardware import detect

    logging.basicConfig(level=logging.INFO)
    model_dir = Path(sys.argv[1])
    candidates = [
        CandidateConfig(name="fp8-dynamic", scheme="FP8_DYNAMIC"),
        CandidateConfig(name="w4a16-awq", scheme="W4A16_AWQ"),
    ]
    print(
        check_host_support(
            model_dir, candidates, ServingConfig(dtype="fastest"), detect()
        ).model_dump_json(indent=2)
    )


if __name__ == "__main__":
    main()
