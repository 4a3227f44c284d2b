"""Batch-invariant decoding: the same prompt gets the same answer whatever it is batched with.

On a GPU, greedy decoding is not a function of the prompt alone: the kernels split their sums
by the batch's shape, so another mix of requests gives other roundings in bf16 and, now and
then, another token. The pipeline compares answers twice — the eval gates (a challenger
against the champion's stored scores) and the canary's quality probes (canary against stable
on live servers) — and a zero-margin gate fails on one flipped item. On the H100 on
2026-12-05 the update's baseline, the champion's own weights, was refused so
(docs/gpu-host.md). vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``, NVIDIA compute
capability 8.0 or higher: docs.vllm.ai features/batch_invariance; vLLM 0.26's
``model_executor/layers/batch_invariant.py``) is meant to make every reduction's order
independent of the batch, so that what the gates compare is the weights.

Every server the project starts (candidate, stable, canary) gets the same mode, so the scores
a release was chosen on, and the answers its canary is judged by, come from one kind of
server; its load test measures what is then served.

It is off by default, because it did not do what it is for where it was tried. On the H100 on
2026-12-05 (vLLM 0.26.0, SmolLM2-135M, eager, the demo's update: the champion's own weights)
the update's baseline still differed from the champion on 10 item-metric scores (1 without the mode,
2026-12-05 morning), and the output tok/s at 100 streams was 2,530 against 5,957 without it
(0.42x; two runs on the same kind of machine, not one call): docs/gpu-host.md.
``bench/batch_invariance.py`` measures both in one call (answers alone against batched, tok/s
with and without) for the next GPU session.
"""

from __future__ import annotations

from llm_release.config import ServingConfig
from llm_release.errors import ConfigError
from llm_release.serving import gpus

ENV = "VLLM_BATCH_INVARIANT"
# vLLM's requirement for NVIDIA GPUs (Ampere and later).
MIN_COMPUTE_CAPABILITY = 8.0


def supported(gpu_ids: list[int] | None = None) -> tuple[bool, str]:
    """Whether vLLM can decode batch-invariantly on ``gpu_ids`` (default: every GPU of the
    host), and why in words."""
    caps = gpus.compute_capabilities()
    if not caps:
        return False, "no NVIDIA GPU (nvidia-smi lists none)"
    ids = list(gpu_ids) if gpu_ids else sorted(caps)
    unknown = [g for g in ids if g not in caps]
    if unknown:
        return False, f"nvidia-smi gives no compute capability for GPU {unknown}"
    low = [f"GPU {g}: {caps[g]:g}" for g in ids if caps[g] < MIN_COMPUTE_CAPABILITY]
    if low:
        return False, (f"compute capability below {MIN_COMPUTE_CAPABILITY:g} ({', '.join(low)})")
    shown = ", ".join(f"GPU {g}: {caps[g]:g}" for g in ids)
    return True, f"compute capability {shown}"


def enabled(serving: ServingConfig, gpu_ids: list[int] | None = None) -> tuple[bool, str]:
    """The mode a server on ``gpu_ids`` gets, and why. ``on`` where vLLM cannot is a
    ConfigError (``check`` raises it before any work)."""
    if serving.batch_invariant == "off":
        return False, "serving.batch_invariant is off"
    ok, why = supported(gpu_ids)
    if not ok:
        raise ConfigError(
            f"serving.batch_invariant is 'on' but vLLM cannot decode batch-invariantly here: {why}",
            hint="set serving.batch_invariant to off (its default)",
        )
    return ok, why


def env(serving: ServingConfig, gpu_ids: list[int] | None = None) -> dict[str, str]:
    """The server's ``VLLM_BATCH_INVARIANT``, always written: an operator's own variable in
    the worker's environment does not decide it behind the setting's back."""
    on, _ = enabled(serving, gpu_ids)
    return {ENV: "1" if on else "0"}


def check(serving: ServingConfig) -> None:
    """Before any work: ``on`` on a host where vLLM cannot is refused in one line."""
    enabled(serving)
