"""Sizing in the release: the planner before any download, and vLLM's own numbers after
every start, side by side.

Before the download, the repo's config and shard headers (range requests, no weights) are
planned for the release's serving settings on this host; a setting that cannot hold one
sequence of ``max_model_len`` (what vLLM itself refuses at start) stops the release with
the planner's verdict, which names the number that breaks. After each server starts, the
planner's KV-cache tokens and maximum concurrency for that candidate's own folder are
recorded next to what vLLM logged (``vllm_report``), so every report shows the error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from llm_release import sizing as planner
from llm_release.config import ReleaseConfig, ServingConfig
from llm_release.errors import ConfigError, ReleaseError
from llm_release.fleet import HostCard
from llm_release.hardware import Hardware
from llm_release.hub import hub_headers, local_source
from llm_release.hub.credentials import HubToken
from llm_release.quantization import recipes
from llm_release.serving.dtype import served_dtype
from llm_release.sizing import corrections
from llm_release.sizing.vllm_report import KvCheck, check_plan, parse_vllm_kv_report

log = logging.getLogger(__name__)


def _gpu_memory_gib() -> float:
    from llm_release.hardware import ASSUMED_GPU_MEMORY_GIB, gpu_memory_gib

    return gpu_memory_gib() or ASSUMED_GPU_MEMORY_GIB


TP_SIZES = (1, 2, 4, 8)


def tp_sizes(host: Hardware) -> list[int]:
    """The tensor-parallel sizes 'auto' chooses from: powers of two up to the host's GPUs."""
    return [n for n in TP_SIZES if n <= max(1, len(host.gpus))]


def _request(
    serving: ServingConfig, host: Hardware, dtype: str, gpu_memory_gib: float | None = None
) -> planner.PlanRequest:
    auto = serving.tensor_parallel_size == "auto"
    request = planner.request_for_serving(
        serving.model_copy(update={"tensor_parallel_size": 1}) if auto else serving,
        device="gpu" if host.cuda else "cpu",
        gpu_memory_gib=(gpu_memory_gib or _gpu_memory_gib()) if host.cuda else 80.0,
        gpu_name=host.gpus[0] if host.cuda else "",
        dtype=dtype,
    )
    if auto:
        request = request.model_copy(update={"gpu_counts": tp_sizes(host)})
    # what earlier starts of this vLLM version taught about its non-KV memory
    return corrections.apply(request, corrections.runtime_vllm_version())


def plan_for(
    config: ReleaseConfig,
    host: Hardware,
    files: hub_headers.ModelFiles,
    gpu_memory_gib: float | None = None,
) -> planner.CapacityPlan:
    """The plan for the release's serving settings on ``host`` (its GPUs of
    ``gpu_memory_gib`` each; None: this host's), fitting or not. With no max_num_seqs on a
    GPU the server gets one at start (resolve_batch: what fits, from a plan of one sequence),
    so the fit is judged as resolve_batch judges it: vLLM's default 1,024 sequences would
    profile a sampler the server never gets."""
    serving = config.serving
    if host.cuda and serving.max_num_seqs is None:
        serving = serving.model_copy(update={"max_num_seqs": 1})
    dtype = served_dtype(serving.dtype, host, files.config)
    request = _request(serving, host, dtype, gpu_memory_gib)
    result = planner.plan(
        planner.parse_config(files.config),
        planner.served_weights(files.tensors, files.config, request),
        request,
        model=config.source.repo_id,
    )
    if serving is not config.serving:
        note = (
            "planned for one sequence: the server's max_num_seqs is chosen at start "
            "(the workload's sequences its KV cache holds, at most vLLM's default)"
        )
        result = result.model_copy(update={"notes": [*result.notes, note]})
    return result


def plan_release(
    config: ReleaseConfig,
    host: Hardware,
    files: hub_headers.ModelFiles,
    fleet: Sequence[HostCard] = (),
    own: str | None = None,
) -> planner.CapacityPlan:
    """The plan for the release's serving settings; raises when one sequence cannot fit.
    On a host of a fleet (``own``, its name) every other host's card (``fleet``) is planned
    too: a release that fits no host is refused with every host's figures, one that fits
    another host but not this one (which serves the winner) says where to start it, and one
    that fits here names the hosts that could hold it."""
    result = plan_for(config, host, files)
    others = [card for card in fleet if card.name != own]
    if others:
        result = _judged_on_the_fleet(config, host, files, result, others, own or "this host")
    if not result.fits:
        raise ConfigError(
            f"the serving settings cannot fit {config.source.repo_id} on this host: {result.verdict}",
            hint="change serving.max_model_len, serving.cpu_kvcache_space_gib or "
            "gpu_memory_utilization as the plan suggests ('llm-release plan' shows the table)",
        )
    # A W4A16 group size that does not divide a layer fails here, before the download.
    recipes.check_candidates(config.candidates, files.config)
    return result


def card_host(card: HostCard, like: Hardware) -> Hardware:
    """The host a card declares, as the planner reads a host (``like``'s CPU)."""
    return like.model_copy(update={"gpus": [g.name or f"GPU {g.index}" for g in card.gpus]})


def card_figures(card: HostCard) -> str:
    if not card.gpus:
        return f"{card.name} (no GPU)"
    sizes = " / ".join(f"{m:g}" for m in sorted({g.memory_gib for g in card.gpus}))
    return f"{card.name} ({len(card.gpus)} × {sizes} GiB)"


def _verdict(plan: planner.CapacityPlan | None, host: Hardware) -> str:
    if plan is not None:
        return plan.verdict
    if host.cuda:
        return "not planned: no GPU (this host serves on GPUs)"
    return "not planned: GPUs (this host serves on its CPU)"


def _card_plans(
    config: ReleaseConfig, host: Hardware, files: hub_headers.ModelFiles, cards: Sequence[HostCard]
) -> dict[str, planner.CapacityPlan | None]:
    """Each card's plan for the release's settings (None: a host of the other kind, not
    planned). A card's GPUs are planned at their smallest memory, as a server on any of them
    would be."""
    return {
        card.name: plan_for(
            config,
            card_host(card, host),
            files,
            gpu_memory_gib=min((g.memory_gib for g in card.gpus), default=None),
        )
        # a host of the other kind measures what this one could not compare: not planned
        if bool(card.gpus) == host.cuda
        else None
        for card in cards
    }


def fleet_fits(
    config: ReleaseConfig,
    host: Hardware,
    files: hub_headers.ModelFiles,
    fleet: Sequence[HostCard],
    own: str | None,
) -> list[str]:
    """The other hosts of the fleet (``own`` aside) whose card fits the release's serving
    settings, as the plan stage judges them: where the measure stage may send a contender."""
    others = [card for card in fleet if card.name != own]
    plans = _card_plans(config, host, files, others)
    return sorted(name for name, p in plans.items() if p is not None and p.fits)


def _judged_on_the_fleet(
    config: ReleaseConfig,
    host: Hardware,
    files: hub_headers.ModelFiles,
    own_plan: planner.CapacityPlan,
    others: list[HostCard],
    own: str,
) -> planner.CapacityPlan:
    """``own_plan`` with the fleet's figures: a note when it fits here, a ConfigError when
    it does not (naming the hosts it fits, or every host's verdict when it fits none)."""
    plans = _card_plans(config, host, files, others)
    fitting = sorted(name for name, p in plans.items() if p is not None and p.fits)
    here = (
        f"{own} (this host, {len(host.gpus)} GPU(s))" if host.cuda else f"{own} (this host, no GPU)"
    )
    if own_plan.fits:
        unfit = [card_figures(c) for c in others if c.name not in fitting]
        note = f"fleet: also fits {', '.join(fitting) or 'no other host'}" + (
            f"; not {', '.join(unfit)}" if unfit else ""
        )
        return own_plan.model_copy(update={"notes": [*own_plan.notes, note]})
    repo = config.source.repo_id
    if fitting:
        raise ConfigError(
            f"{repo} fits {', '.join(fitting)} of the fleet, not {here}, which serves the "
            f"winner: {own_plan.verdict}",
            hint=f"start the release on queue host-{fitting[0]} (the deployment's work queue), "
            "or change the serving settings as the plan suggests",
        )
    figures = "; ".join(
        [f"{here}: {own_plan.verdict}"]
        + [f"{card_figures(c)}: {_verdict(plans[c.name], host)}" for c in others]
    )
    raise ConfigError(
        f"{repo} fits no host of the fleet: {figures}",
        hint="change serving.max_model_len, gpu_memory_utilization or tensor_parallel_size "
        "as the verdicts suggest, or join a host with more GPU memory ('make fleet-join')",
    )


def as_planned(config: ReleaseConfig, plan: planner.CapacityPlan) -> ReleaseConfig:
    """The release's settings with what the plan decided: tensor_parallel_size 'auto' becomes
    the smallest size that fits (an explicit size is kept as it was)."""
    if config.serving.tensor_parallel_size != "auto":
        return config
    tp = plan.recommendation.tensor_parallel_size if plan.recommendation else 1
    serving = config.serving.model_copy(update={"tensor_parallel_size": tp})
    return config.model_copy(update={"serving": serving})


def read_release_model(
    config: ReleaseConfig, token: HubToken | None = None
) -> hub_headers.ModelFiles:
    """Config and shard headers of the release's model without its weights, from a local
    folder, a Hugging Face hub or ModelScope (its file API, by range requests alike).
    ``token`` (a block's) goes to its own endpoint only; without one,
    ``credentials.token_for`` decides (read_hub)."""
    source = config.source
    if source.hub == "local":
        # Only from a folder under the operator's roots, every file inside them (links too).
        return hub_headers.read_local(local_source.checked_folder(source.local_path or ""))
    return hub_headers.read_hub(
        source.repo_id,
        revision=source.revision,
        endpoint=source.endpoint,
        token=token,
        hub=source.hub,
    )


def kv_check(
    model_dir: Path, serving: ServingConfig, host: Hardware, log_text: str
) -> KvCheck | None:
    """The planner for this folder and settings next to what vLLM reported at start."""
    report = parse_vllm_kv_report(log_text)
    if report is None:
        return None
    try:
        result = plan_for_dir(model_dir, serving, host)
    except (ReleaseError, ValueError, KeyError) as exc:
        log.warning("no planner figure for %s: %s", model_dir, exc)
        return None
    option = result.options[0]
    factor = result.request.non_kv_overhead_factor
    return check_plan(
        option.kv_cache_tokens,
        option.max_concurrency,
        report,
        # the raw estimate: what a correction is learned against
        overhead_bytes=int(option.overhead_per_gpu_bytes / factor),
        kv_memory_bytes=option.kv_memory_per_gpu_bytes,
    )


def folder_files(model_dir: Path) -> hub_headers.ModelFiles:
    """What the planner reads of a local model folder: its shards' headers, or for a folder
    with a config and no weight shards (a full-size shape served with ``--load-format
    dummy``) the config alone."""
    folder = Path(model_dir)
    has_weights = (folder / "model.safetensors").is_file() or (
        folder / "model.safetensors.index.json"
    ).is_file()
    if (
        has_weights
        or not (folder / "config.json").is_file()
        or (folder / "config.json").stat().st_size > planner.MAX_CONFIG_BYTES
    ):
        return hub_headers.read_local(folder)
    return hub_headers.ModelFiles(
        source="local (config only)",
        config=planner.load_config_json((folder / "config.json").read_bytes()),
        tensors={},
        shards=[],
    )


def plan_for_dir(
    model_dir: Path,
    serving: ServingConfig,
    host: Hardware,
    files: hub_headers.ModelFiles | None = None,
) -> planner.CapacityPlan:
    """The planner for a local model folder served with ``serving`` on ``host``. A folder with
    a config and no weight shards is sized from the config's parameter count in its own
    dtype (``folder_files``)."""
    if files is None:
        files = folder_files(model_dir)
    dtype = served_dtype(serving.dtype, host, files.config)
    arch = planner.parse_config(files.config)
    request = _request(serving, host, dtype)
    weights = (
        planner.served_weights(files.tensors, files.config, request)
        if files.tensors
        else planner.estimate_weights(arch, "bf16", with_mtp=request.speculative_mtp)
    )
    return planner.plan(arch, weights, request)


def default_batched_tokens(serving: ServingConfig, host: Hardware) -> int:
    """The budget vLLM gives ``serving``'s server on ``host`` when no
    --max-num-batched-tokens is passed (arg_utils.get_batch_defaults)."""
    tp = serving.tensor_parallel_size
    return planner.default_batched_tokens(
        planner.Runtime(
            device="gpu" if host.cuda else "cpu",
            tensor_parallel_size=1 if tp == "auto" else tp,
            gpu_memory_gib=_gpu_memory_gib() if host.cuda else 80.0,
            gpu_name=host.gpus[0] if host.cuda else "",
        )
    )


def resolve_batch(model_dir: Path, serving: ServingConfig, host: Hardware) -> ServingConfig:
    """``serving.max_num_seqs`` made concrete when the config leaves it to the plan: on a GPU
    the sequences of ``serving.request_tokens`` the planner's KV cache holds at once, at most
    vLLM's own default, while one sequence of max_model_len still fits (sizing/batch.py says
    why); on a CPU the demo host's 16. An explicit value is kept."""
    from llm_release.config import CPU_MAX_NUM_SEQS, DEFAULT_REQUEST_TOKENS
    from llm_release.sizing.batch import choose_max_num_seqs, vllm_default_max_num_seqs

    if serving.max_num_seqs is not None:
        return serving
    seqs = CPU_MAX_NUM_SEQS
    if host.cuda:
        cap = vllm_default_max_num_seqs(_gpu_memory_gib(), host.gpus[0])
        workload = serving.request_tokens or min(serving.max_model_len, DEFAULT_REQUEST_TOKENS)
        try:
            plan = plan_for_dir(model_dir, serving.model_copy(update={"max_num_seqs": 1}), host)
        except (ReleaseError, ValueError, KeyError) as exc:
            log.warning("max_num_seqs: no plan for %s (%s); vLLM's default is used", model_dir, exc)
            plan = None
        if plan is not None and plan.options:
            choice = choose_max_num_seqs(plan, workload, cap)
            seqs = choice.max_num_seqs
            log.info("max_num_seqs %d for %s: %s", seqs, model_dir, choice.reason)
        else:
            seqs = cap
    return serving.model_copy(update={"max_num_seqs": seqs})
