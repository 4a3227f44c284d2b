"""Typed, strict configuration for a release. Unknown keys are errors, not silently ignored."""

from __future__ import annotations

import json
import re
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llm_release.errors import ConfigError
from llm_release.hub.credentials import check_endpoint
from llm_release.safety import (
    MAX_SERVED_NAME,
    SERVED_NAME,
    SERVED_NAME_PATTERN,
    SERVED_NAME_RULE,
    SET_NAME,
)
from llm_release.serving.serving_flags import check_serving_args

__all__ = ["check_serving_args"]  # re-exported: llm_release.serving.serving_flags has the list

REPO_ID = r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_][A-Za-z0-9_.-]*"


def _set_name(value: str, what: str) -> str:
    # Eval sets and calibration sets are named by a folder/file name under the repository.
    if not SET_NAME.fullmatch(value) or len(value) > 100:
        raise ValueError(
            f"{what} {value!r}: use lower-case letters, digits, '_' and '-' (a name, not a path)"
        )
    return value


# A candidate's name, short enough that its release id (name, commit, time) is a served name.
MAX_CANDIDATE_NAME = 64
# Upper bounds of the run form's numbers and lists (issue 36, low: a run parameter is input;
# a number past these is a typo or a probe, refused in one line before any work).
MAX_TOKENS = 10_485_760  # a context or request length: 10 Mi tokens
MAX_GPUS = 1024  # GPUs a server may span (tensor parallel size, a count, an index)
MAX_WAIT_S = 86_400.0  # a timeout, SLO or level duration: a day
MAX_REVIEW_S = 7 * 86_400  # a person's answer: a week
MAX_CONCURRENCY = 100_000  # requests in flight at one load level
MAX_LIST = 64  # entries of a list (eval sets, load levels, ignored layers, candidates)
MAX_REVISION = 256  # a branch, tag or commit
MAX_MEMORY_GIB = 1 << 20  # memory a server may be given: 1 PiB
# A CPU server's batch when the config names none (the demo host's two cores).
CPU_MAX_NUM_SEQS = 16
# vLLM's own --max-num-seqs on a GPU of >= 70 GiB (engine/arg_utils.py get_batch_defaults).
GPU_MAX_NUM_SEQS_CAP = 1024
# a GPU server's typical request when nothing says (ServingConfig.request_tokens)
DEFAULT_REQUEST_TOKENS = 1024


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SourceConfig(StrictModel):
    """Where the model comes from. ``endpoint`` points at a Hub-compatible server."""

    # A refused endpoint may hold a password: validation errors do not repeat the input.
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)

    hub: Literal["huggingface", "modelscope", "local"] = "huggingface"
    repo_id: str = Field(
        description="Repository id on the hub, e.g. HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    revision: str = Field(
        "main",
        min_length=1,
        max_length=MAX_REVISION,
        description="Branch, tag or commit; resolved to a commit first",
    )
    endpoint: str | None = Field(
        None, description="hub endpoint; None uses HF_ENDPOINT / MODELSCOPE_ENDPOINT or the hub"
    )
    allow_patterns: list[str] | None = Field(None, max_length=MAX_LIST)
    local_path: str | None = Field(
        None,
        description="for hub=local: the absolute path of a model folder under one of the "
        "folders the operator allows (LLM_RELEASE_LOCAL_ROOTS); anything else is refused",
    )
    credentials_block: str | None = Field(
        None,
        description="name of a saved HubCredentials block (endpoint + token) for gated repos "
        "or a mirror; the token never enters parameters, logs or the report",
    )

    @model_validator(mode="after")
    def _local_needs_a_path(self) -> SourceConfig:
        if (self.hub == "local") != (self.local_path is not None):
            raise ValueError("local_path is required with hub='local' and only allowed with it")
        return self

    @field_validator("local_path")
    @classmethod
    def _absolute_local_path(cls, value: str | None) -> str | None:
        # Where it may point is the operator's roots' business (local_source), at run time.
        if value is not None and (not value.startswith("/") or "\0" in value or len(value) > 4096):
            raise ValueError("local_path must be an absolute path (e.g. /srv/models/my-model)")
        return value

    @field_validator("endpoint")
    @classmethod
    def _plain_endpoint(cls, value: str | None) -> str | None:
        # The endpoint is written to the manifest and to messages: no credentials in it.
        return None if value is None else check_endpoint(value)

    @field_validator("repo_id")
    @classmethod
    def _repo_id_shape(cls, value: str) -> str:
        # Each part names a folder on the hub and on disk: never '.', '..' or hidden.
        if not re.fullmatch(REPO_ID, value):
            raise ValueError(
                f"repo_id {value!r} is not of the form 'owner/name' (letters, digits, '.', '_', '-')"
            )
        return value


Scheme = Literal["FP8_DYNAMIC", "W4A16_AWQ"]


class CandidateConfig(StrictModel):
    """A quantized candidate built from the baseline with llm-compressor."""

    name: str
    scheme: Scheme
    ignore: list[str] = Field(default_factory=lambda: ["lm_head"], max_length=MAX_LIST)
    group_size: int = Field(
        64,
        ge=1,
        le=MAX_TOKENS,
        description="W4A16 group size: positive, and every quantized layer's input width must "
        "divide by it (checked against the model's config.json before the download)",
    )
    symmetric: bool = Field(
        False, description="W4A16 without zero points; asymmetric (the default) loses less"
    )
    calibration_set: str = Field("manufacturing_maintenance", description="file in calibration/")
    num_calibration_samples: int = Field(64, ge=1, le=100_000)
    max_seq_length: int = Field(256, ge=16, le=MAX_TOKENS)
    extra_serving_args: list[str] = Field(
        default_factory=list,
        max_length=2 * MAX_LIST,
        description="vLLM tuning flags for this candidate only, from the allow-list of "
        "llm_release.serving.serving_flags (docs/security.md)",
    )

    @field_validator("calibration_set")
    @classmethod
    def _calibration_name(cls, value: str) -> str:
        return _set_name(value, "calibration_set")

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str, info: ValidationInfo) -> str:
        # A release id is '<candidate>-<commit[:8]>-<time>': it stays a served name (a
        # config recorded before the bound loads as written).
        too_long = len(value) > MAX_CANDIDATE_NAME and not _stored(info)
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", value) or too_long:
            raise ValueError(
                f"candidate name {value[:80]!r}: use lower-case letters, digits, '-', '_' "
                f"(at most {MAX_CANDIDATE_NAME} characters)"
            )
        return value


class Speculation(StrictModel):
    """Speculative decoding as vLLM's ``--speculative-config`` takes it, in the shapes a
    release may use: prompt lookup (``ngram``: drafts copied from the prompt, no second
    model) or the model's own multi-token-prediction head (``mtp``: Qwen3.5, DeepSeek-V3 and
    others whose checkpoint carries one). Numbers only: no draft model, no path
    (``serve.vllm_args`` writes the JSON; ``--speculative-config`` in extra_args is
    refused and pointed here). Greedy answers should not change; the tuner takes a setting
    with it only when they do not and goodput improves (serving/tune.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ngram", "mtp"]
    num_speculative_tokens: int = Field(ge=1, le=8, description="tokens drafted a step")
    prompt_lookup_max: int | None = Field(
        None, ge=1, le=16, description="ngram: the longest n-gram looked up (vLLM's default: 5)"
    )
    prompt_lookup_min: int | None = Field(
        None, ge=1, le=16, description="ngram: the shortest n-gram looked up (vLLM's: 5 or max)"
    )

    @model_validator(mode="after")
    def _lookup(self) -> Speculation:
        if self.method != "ngram" and (self.prompt_lookup_max or self.prompt_lookup_min):
            raise ValueError("prompt_lookup_max / prompt_lookup_min are for method ngram only")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        if low is not None and high is not None and low > high:
            raise ValueError("prompt_lookup_min must not exceed prompt_lookup_max")
        return self

    def vllm_json(self) -> str:
        """The value of vLLM's --speculative-config."""
        return json.dumps(self.model_dump(exclude_none=True), sort_keys=True)

    def label(self) -> str:
        lookup = f"/{self.prompt_lookup_max}" if self.prompt_lookup_max else ""
        return f"{self.method}:{self.num_speculative_tokens}{lookup}"


class ServingConfig(StrictModel):
    """The vLLM arguments operators tune; the same for every candidate of a release."""

    max_model_len: int = Field(2048, ge=64, le=MAX_TOKENS)
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        le=65536,
        description="vLLM --max-num-seqs. None: from the plan when the server starts — on a GPU "
        "the sequences of request_tokens the planner's KV cache holds at once, at most vLLM's "
        "own default (1024 on a GPU of 70 GiB or more), while one sequence of max_model_len "
        f"still fits; on a CPU {CPU_MAX_NUM_SEQS}",
    )
    request_tokens: int | None = Field(
        None,
        ge=1,
        le=10_000_000,
        description="prompt + output tokens of a typical request, what a GPU server's default "
        "max_num_seqs is sized for (sizing/batch.py). None: the release's load profile's "
        "(load.prompt_tokens + load.output_tokens, and a shared prefix's tokens where "
        "prefix caching is off: each request then holds its own copy); outside a release "
        f"min(max_model_len, {DEFAULT_REQUEST_TOKENS})",
    )
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cpu_kvcache_space_gib: int = Field(
        1, ge=1, le=MAX_MEMORY_GIB, description="VLLM_CPU_KVCACHE_SPACE (GiB) on CPU"
    )
    cpu_threads_bind: str = Field(
        "split",
        pattern=r"^(split|auto|nobind|[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*)$",
        description="on a CPU host, the cores vLLM's OpenMP threads are bound to "
        "(VLLM_CPU_OMP_THREADS_BIND). split: a canary gets the upper half of this process's "
        "CPUs and every other server the lower half, so stable and canary never share a core "
        "(vLLM's own auto binds every server to the same first cores); auto, nobind or a list "
        "like 0-3,8 go to vLLM as they are",
    )
    enable_prefix_caching: bool = True
    enforce_eager: bool = False
    speculation: Speculation | None = Field(
        None, description="speculative decoding (vLLM --speculative-config); None: off"
    )
    dtype: Literal["fastest", "auto", "bfloat16", "float16", "float32"] = Field(
        "fastest",
        description="fastest: bfloat16 on a GPU; on a CPU the faster of bfloat16 and float32 "
        "in the serving runtime, measured at the model's layer shape (float32 on CPUs without "
        "native bf16). Other values go to vLLM's --dtype as they are.",
    )
    probe_schemes: bool = Field(
        True,
        description="before quantizing, check with a tiny model that the serving runtime can "
        "serve each candidate's scheme on this host (cached per host and runtime version)",
    )
    extra_args: list[str] = Field(
        default_factory=list,
        max_length=2 * MAX_LIST,
        description="vLLM tuning flags beyond the fields here, from the allow-list of "
        "llm_release.serving.serving_flags (e.g. --max-num-batched-tokens 512); anything else is "
        "refused (docs/security.md)",
    )
    startup_timeout_s: float = Field(900, gt=0, le=MAX_WAIT_S)
    thinking: bool = Field(
        False,
        description="reasoning models (a chat template with a thinking switch, e.g. Qwen3's "
        "enable_thinking): false turns thinking off in every request the pipeline sends "
        "(evaluation, load test, demo traffic); true lets the model think (give the eval's "
        "max_gen_toks room for it). The family's --reasoning-parser is set either way",
    )
    # Where vLLM runs. Both backends build the same vLLM arguments from the fields below.
    backend: Literal["process", "docker"] = Field(
        "process",
        description="process: a vLLM process in the serving virtualenv (the embedded "
        "default); docker: one container per candidate or release through the Docker SDK",
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=MAX_GPUS)] | Literal["auto"] = Field(
        1,
        description="vLLM --tensor-parallel-size; auto: the plan's, the smallest of 1, 2, 4, "
        "8 GPUs (at most the host's) whose KV cache holds a sequence of max_model_len (1 on "
        "a CPU host), set by the plan stage before anything starts",
    )
    enable_expert_parallel: bool = Field(
        False, description="vLLM --enable-expert-parallel: MoE experts spread over the TP ranks"
    )
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="vLLM --kv-cache-dtype (fp8 halves the KV bytes per token)"
    )
    batch_invariant: Literal["on", "off"] = Field(
        "off",
        description="vLLM's batch-invariant decoding (VLLM_BATCH_INVARIANT=1) in every server "
        "(candidates, stable, canary): meant to make a request's answer independent of the "
        "requests batched with it. on: refused before any work unless every GPU is NVIDIA "
        "compute capability 8.0 or higher. off (default): on the H100 on 2026-12-05 (vLLM "
        "0.26) it did not make the same weights score alike and cost 0.42x the output tok/s "
        "(docs/gpu-host.md)",
    )
    gpus: (
        Literal["auto", "all"]
        | Annotated[int, Field(ge=1, le=MAX_GPUS)]
        | Annotated[list[Annotated[int, Field(ge=0, lt=MAX_GPUS)]], Field(max_length=MAX_GPUS)]
    ) = Field(
        "auto",
        description="GPUs a server gets on a GPU host: auto (tensor_parallel_size free GPUs), "
        "all, a count of free GPUs, or a list of GPU indices; never GPUs another running "
        "server of this project holds",
    )

    @model_validator(mode="before")
    @classmethod
    def _no_host_options(cls, data: object, info: ValidationInfo) -> object:
        # The container's image, shared memory and IPC namespace are the operator's
        # (LLM_RELEASE_DOCKER_*), never a run's; records written before they moved still load.
        if not isinstance(data, dict):
            return data
        moved = [k for k in HOST_OPTIONS if k in data]
        if moved and _stored(info):
            return {k: v for k, v in data.items() if k not in HOST_OPTIONS}
        if moved:
            key = moved[0]
            raise ValueError(f"serving.{key}: {HOST_OPTIONS[key]}")
        return data

    @model_validator(mode="after")
    def _allowed_extra_args(self, info: ValidationInfo) -> ServingConfig:
        if not _stored(info):
            self.check_args(self.extra_args, "serving.extra_args")
        return self

    def check_args(self, args: list[str], where: str) -> None:
        """ValueError (one line) unless ``args`` are allowed tuning flags with valid values
        that no typed field here sets as well (vLLM would keep one of the two silently)."""
        pairs = check_serving_args(args, where)
        typed = {
            "--tensor-parallel-size": ("tensor_parallel_size", self.tensor_parallel_size != 1),
            "--enable-expert-parallel": ("enable_expert_parallel", self.enable_expert_parallel),
            "--kv-cache-dtype": ("kv_cache_dtype", self.kv_cache_dtype != "auto"),
        }
        for flag, _ in pairs:
            field, is_set = typed.get(flag, ("", False))
            if is_set:
                raise ValueError(f"{where} sets {flag} and serving.{field} sets it too: keep one")

    @model_validator(mode="after")
    def _parallel_settings(self) -> ServingConfig:
        if isinstance(self.gpus, list):
            if not self.gpus or len(set(self.gpus)) != len(self.gpus) or min(self.gpus) < 0:
                raise ValueError("serving.gpus: a list of distinct GPU indices (0, 1, …)")
        wanted = len(self.gpus) if isinstance(self.gpus, list) else self.gpus
        tp = self.tensor_parallel_size
        if isinstance(wanted, int) and isinstance(tp, int) and wanted < tp:
            raise ValueError(
                f"serving.gpus gives {wanted} GPU(s), fewer than tensor_parallel_size "
                f"{self.tensor_parallel_size} (one GPU per tensor-parallel rank)"
            )
        return self

    @property
    def tp_size(self) -> int:
        """The tensor-parallel size a server starts with; 'auto' must be planned first."""
        if self.tensor_parallel_size == "auto":
            raise ConfigError(
                "serving.tensor_parallel_size is 'auto' and was not planned",
                hint="the release's plan stage sets it; elsewhere give a number (1, 2, 4, 8)",
            )
        return self.tensor_parallel_size

    def parallel_args(self) -> list[str]:
        """The typed parallelism and KV settings as vLLM arguments (defaults are omitted,
        so a CPU command line stays what vLLM CPU accepts)."""
        args: list[str] = []
        if self.tp_size != 1:
            args += ["--tensor-parallel-size", str(self.tp_size)]
        if self.enable_expert_parallel:
            args.append("--enable-expert-parallel")
        if self.kv_cache_dtype != "auto":
            args += ["--kv-cache-dtype", self.kv_cache_dtype]
        return args


# Host options that moved to the operator's settings, with where they are now.
HOST_OPTIONS = {
    "image": "the container image is the operator's setting: set LLM_RELEASE_DOCKER_IMAGE "
    "in the worker's environment (default auto)",
    "shm_size_gib": "the container's /dev/shm is the operator's setting: set "
    "LLM_RELEASE_DOCKER_SHM_GIB in the worker's environment (default 4)",
    "ipc_host": "sharing the host's IPC namespace is the operator's setting: set "
    "LLM_RELEASE_DOCKER_IPC_HOST=1 in the worker's environment",
    "allow_unsafe_serving_args": "removed: serving flags come from an allow-list; the "
    "operator adds flags with LLM_RELEASE_ALLOW_SERVING_FLAGS",
}

# Validation context of records the pipeline wrote itself (the release registry): they
# load as written, though their settings predate today's rules.
STORED = {"stored": True}


def _stored(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get("stored"))


class TuneConfig(StrictModel):
    """Per-candidate search of the vLLM settings that matter for goodput: the highest load
    level at which TTFT p95 (gates.ttft_p95_slo_s) and ITL p95 stay under the SLO with the
    error ceiling (gates.max_error_rate) held. One server per setting, load swept against
    it; settings the planner says cannot fit are never started (see llm_release.serving.tune).
    Off by default: on a 2-core CPU each setting costs a server start (~1.5 min)."""

    enabled: bool = Field(False, description="tune every candidate before measuring it")
    strategy: Literal["coordinate", "exhaustive"] = Field(
        "coordinate",
        description="coordinate: descent from the planner's start with racing and early "
        "stops; exhaustive: every grid point at every level (for benchmarks)",
    )
    max_num_seqs: list[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16],
        max_length=MAX_LIST,
        description="--max-num-seqs values to try",
    )
    max_num_batched_tokens: list[Annotated[int, Field(ge=1, le=MAX_TOKENS)] | None] = Field(
        default_factory=lambda: [None],
        max_length=MAX_LIST,
        description="--max-num-batched-tokens values to try; null: vLLM's default",
    )
    enable_prefix_caching: list[bool] = Field(
        default_factory=lambda: [True], max_length=2, description="prefix caching on and/or off"
    )
    speculation: list[Speculation | None] = Field(
        default_factory=lambda: [None],
        max_length=16,
        description="speculative decoding settings to try beside none (always tried), e.g. "
        '{"method": "ngram", "num_speculative_tokens": 3}; one is taken only if its greedy '
        "answers match those without it and its goodput is higher",
    )
    gpu_memory_utilization: list[Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=list,
        max_length=MAX_LIST,
        description="GPU only (ignored on CPU); empty: serving.gpu_memory_utilization",
    )
    concurrencies: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] | None = Field(
        None,
        max_length=MAX_LIST,
        description="load levels of the tuning sweep; null: load.concurrencies",
    )
    requests_per_level: int | None = Field(
        None, ge=1, le=1_000_000, description="requests per level; null: load.requests_per_level"
    )
    itl_p95_slo_ms: float | None = Field(
        None,
        gt=0,
        le=MAX_WAIT_S * 1000,
        description="ITL p95 ceiling in ms; null: gates.itl_p95_slo_ms (TTFT and errors come "
        "from gates)",
    )
    max_settings: int = Field(8, ge=1, le=100, description="server starts at most per candidate")
    tie_margin: float = Field(
        0.05,
        ge=0,
        le=1,
        description="at equal goodput a trial setting must serve this much more output tokens/s "
        "(below it, two CPU runs of one setting differ by noise)",
    )
    confirm_ties: bool = Field(
        True,
        description="a setting that wins at equal goodput by output tokens/s alone is taken only "
        "if it also beats the best setting started again (one server start more): on one H100 "
        "three starts of one setting gave 1.35x apart in tokens/s",
    )

    @field_validator("max_num_seqs")
    @classmethod
    def _seqs(cls, value: list[int]) -> list[int]:
        if not value or any(v < 1 for v in value):
            raise ValueError("max_num_seqs must be a non-empty list of positive integers")
        return sorted(set(value))

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _batched(cls, value: list[int | None]) -> list[int | None]:
        if not value or any(v is not None and v < 1 for v in value):
            raise ValueError("max_num_batched_tokens: positive integers or null, at least one")
        return value

    @field_validator("speculation")
    @classmethod
    def _speculation(cls, value: list[Speculation | None]) -> list[Speculation | None]:
        # Without speculation is always a choice: it is the reference whose greedy answers
        # a setting with speculation must keep, and what is kept when speculation does not pay.
        return [None, *dict.fromkeys(v for v in value if v is not None)]

    @field_validator("enable_prefix_caching")
    @classmethod
    def _prefix(cls, value: list[bool]) -> list[bool]:
        if not value:
            raise ValueError("enable_prefix_caching: at least one of true, false")
        return sorted(set(value))

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util(cls, value: list[float]) -> list[float]:
        if any(not 0 < v <= 1 for v in value):
            raise ValueError("gpu_memory_utilization values must be in (0, 1]")
        return sorted(set(value))

    @field_validator("concurrencies")
    @classmethod
    def _levels(cls, value: list[int] | None) -> list[int] | None:
        if value is not None and (not value or any(c < 1 for c in value)):
            raise ValueError("concurrencies must be a non-empty list of positive integers")
        return None if value is None else sorted(set(value))


LIVE_EVAL_CONCURRENCY = 4
GPU_EVAL_CONCURRENCY = 1  # a batch of one: the only answers a GPU gives alike (concurrency())
MAX_EVAL_CONCURRENCY = 64  # lm-eval opens a connection per request in flight


class EvalConfig(StrictModel):
    eval_sets: list[str] = Field(
        default_factory=lambda: ["manufacturing_kb", "refusal_kb"], max_length=MAX_LIST
    )
    num_concurrent: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="requests lm-eval keeps in flight. Default: 1 against a server on a GPU "
        "(a greedy answer there changes with the batch it shares, and the gates compare the "
        "answers item by item); on a CPU the candidate server's max_num_seqs (at most 64), so "
        "the evaluation fills the batch the server was sized for; 4 against the live stable "
        "release, which serves users",
    )
    limit: int | None = Field(
        None, ge=1, le=10_000_000, description="evaluate only the first N items"
    )

    def concurrency(self, serving: ServingConfig | None, *, gpu: bool = False) -> int:
        """In-flight requests against a server with ``serving`` (None: the live stable) that
        runs on a GPU (``gpu``) or a CPU.

        On a GPU, one at a time: greedy decoding there is not batch-invariant, so an item's
        answer depends on what it shared a batch with, and a zero-margin gate failed on one
        such item of the champion's own weights (docs/gpu-host.md). Measured with
        bench/batch_invariance.py on an H100 (vLLM 0.26, SmolLM2-135M, the 80 items of
        manufacturing_kb): 3-14 of 80 answers changed batched, with vLLM's batch-invariant
        mode on or off and prefix caching on or off, and 0 of 80 asked alone of a second
        server. On a CPU the answers did not change batched (0 of 4 each way), and the
        evaluation fills the batch: on the demo's FP8 candidate (vLLM CPU, max_num_seqs 8,
        AMD EPYC with native bf16) 20 eval items took 74 s at 8 in flight against 112-120 s
        at 4, with the same scores."""
        if self.num_concurrent is not None:
            return self.num_concurrent
        if serving is None:
            return LIVE_EVAL_CONCURRENCY
        if gpu:
            return GPU_EVAL_CONCURRENCY
        return min(serving.max_num_seqs or CPU_MAX_NUM_SEQS, MAX_EVAL_CONCURRENCY)

    @field_validator("eval_sets")
    @classmethod
    def _eval_set_names(cls, value: list[str]) -> list[str]:
        return [_set_name(v, "eval set") for v in value]


class SharedPrefix(StrictModel):
    """What the traffic's prompts share: a system prompt or a knowledge-base passage that
    many requests start with (what vLLM's prefix caching saves recomputing). GuideLLM's
    synthetic data is shaped so (its ``prefix_buckets``)."""

    tokens: int = Field(
        ge=1, le=131_072, description="tokens of the shared prefix (a system prompt: 200-2000)"
    )
    share: float = Field(
        1.0, gt=0, le=1, description="the fraction of requests that start with a shared prefix"
    )
    distinct: int = Field(
        1,
        ge=1,
        le=1000,
        description="how many different prefixes the requests share (1: one system prompt for "
        "all; more: several assistants or knowledge-base passages)",
    )


class LoadProfile(StrictModel):
    """GuideLLM sweep. CPU-sized by default; use [10, 50, 100] on a GPU host."""

    concurrencies: list[Annotated[int, Field(le=MAX_CONCURRENCY)]] = Field(
        default_factory=lambda: [1, 4], max_length=MAX_LIST
    )
    requests_per_level: int = Field(8, ge=1, le=1_000_000)
    prompt_tokens: int = Field(
        128,
        ge=1,
        le=MAX_TOKENS,
        description="each request's own tokens (after its shared prefix, if any)",
    )
    output_tokens: int = Field(32, ge=1, le=MAX_TOKENS)
    max_seconds_per_level: float = Field(300, gt=0, le=MAX_WAIT_S)
    warm_up: bool = Field(
        True,
        description="before the measured levels, one level at the top concurrency (a request "
        "a stream) whose figures are left out: a server's first requests pay one-time costs "
        "that its users do not (on a GPU, kernels compiled on first use: vLLM 0.26 compiles "
        "its top-k/top-p sampler kernel at the first request a model's sampling defaults send "
        "through it, a stall of seconds that made one H100 run's lowest level miss a 3 s TTFT "
        "SLO)",
    )
    shared_prefix: SharedPrefix | None = Field(
        None,
        description="None: prompts that share nothing (random text); else the prefix the "
        "traffic shares, and the report shows vLLM's prefix-cache hit rate at each level",
    )
    turns: int = Field(
        1,
        ge=1,
        le=16,
        description="user turns a conversation: each later turn resends the conversation so "
        "far (its prompts and answers) before its own prompt_tokens, as a chat client does; "
        "every turn is one of requests_per_level",
    )
    prompts_from: str | None = Field(
        None,
        max_length=64,
        pattern=r"^[a-z0-9][a-z0-9_-]*$",
        description="None: synthetic prompts of prompt_tokens (shaped by shared_prefix and "
        "turns); else the name of an eval set whose items' prompts the load test sends, as "
        "the evaluation and the canary's probes send them (the set's description as the "
        "system message, doc_to_text as the user's), cycled in the set's order: the data "
        "scientists' own traffic, with whatever passages its prompts share. prompt_tokens "
        "is then the items' own",
    )

    @model_validator(mode="after")
    def _one_kind_of_prompt(self) -> LoadProfile:
        if self.prompts_from is not None and (self.shared_prefix is not None or self.turns > 1):
            raise ValueError(
                "prompts_from sends an eval set's own prompts: it takes neither shared_prefix "
                "nor turns (those shape synthetic prompts); drop one"
            )
        return self

    @field_validator("concurrencies")
    @classmethod
    def _positive(cls, value: list[int]) -> list[int]:
        if not value or any(c < 1 for c in value):
            raise ValueError("concurrencies must be a non-empty list of positive integers")
        return sorted(set(value))


class Gates(StrictModel):
    """Serving gates. Quality gates are data: each eval set declares its own (see
    eval_sets/defaults.yaml and the ``gates:`` key of an eval set's task.yaml)."""

    ttft_p95_slo_s: float = Field(
        3.0, gt=0, le=MAX_WAIT_S, description="TTFT p95 at every load level"
    )
    max_error_rate: float = Field(0.01, ge=0, le=1)
    itl_p95_slo_ms: float = Field(
        250,
        gt=0,
        le=MAX_WAIT_S * 1000,
        description="ITL p95 of the SLO goodput is measured against (the highest load level "
        "within TTFT p95, ITL p95 and the error ceiling ranks the candidates); not a gate",
    )


class AnalysisConfig(StrictModel):
    """Canary analysis: the canary against the stable release over the same window of live
    traffic, from Prometheus (queries: src/llm_release/canary/canary_queries.yaml). Each check has
    a tolerance against the stable release and an absolute ceiling; a canary passes only
    what was measured."""

    window_s: int = Field(
        60,
        ge=20,
        le=3600,
        description="analysis window in seconds (60 on CPU: about 12 scrapes at 5 s; at least "
        "4 scrape intervals, or rate() has too few samples)",
    )
    min_canary_requests: int = Field(
        20,
        ge=1,
        le=1_000_000,
        description="fewer canary requests in the window make it inconclusive: the p95 of "
        "fewer than 20 requests is just their slowest one",
    )
    prometheus_url: str | None = Field(
        None,
        description="None: the project's own Prometheus; else the http(s) URL of one that "
        "scrapes the servers with the labels service, release and role",
    )
    query_timeout_s: float = Field(10, gt=0, le=600, description="per PromQL query")
    latency_max_ratio: float = Field(
        1.25,
        ge=1,
        le=1000,
        description="TTFT p95 and ITL p95: the canary may be this many times the stable's",
    )
    latency_slack_s: float = Field(
        0.05,
        ge=0,
        le=MAX_WAIT_S,
        description="latency differences below this are passed whatever the ratio (at tens of "
        "ms, histogram buckets make ratios noise)",
    )
    ttft_p95_ceiling_s: float | None = Field(
        None, gt=0, le=MAX_WAIT_S, description="None: the release's TTFT SLO (gates.ttft_p95_slo_s)"
    )
    itl_p95_ceiling_s: float | None = Field(
        None, gt=0, le=MAX_WAIT_S, description="None: no ceiling"
    )
    error_share_tolerance: float = Field(
        0.01, ge=0, le=1, description="the canary's error share may exceed the stable's by this"
    )
    error_share_ceiling: float | None = Field(
        None,
        ge=0,
        le=1,
        description="for HTTP errors and vLLM abort/error alike. None: the release's "
        "gates.max_error_rate, so the canary is held to the ceiling its measurement passed",
    )
    queue_tolerance: float = Field(
        5,
        ge=0,
        le=MAX_CONCURRENCY,
        description="requests waiting: the canary's max may exceed the stable's by this",
    )
    queue_ceiling: float = Field(
        20, ge=0, le=MAX_CONCURRENCY, description="requests waiting, max over the window"
    )
    kv_cache_tolerance: float = Field(
        0.1, ge=0, le=1, description="KV-cache usage (0-1): canary max minus stable max"
    )
    kv_cache_ceiling: float = Field(0.95, ge=0, le=1, description="KV-cache usage (0-1), max")

    def error_ceiling(self) -> float:
        """The error-share ceiling in force: ReleaseConfig sets it from gates.max_error_rate;
        a canary flow started without a release config holds the gates' default."""
        if self.error_share_ceiling is None:
            return Gates().max_error_rate
        return self.error_share_ceiling

    @field_validator("prometheus_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_endpoint(value)
        except ValueError as exc:
            # check_endpoint speaks of hubs; the rule is the same: a plain http(s) URL.
            raise ValueError(str(exc).split(";")[0].replace("endpoint", "prometheus_url")) from None


class ReviewConfig(StrictModel):
    """A human decides when a gate is inconclusive and its set says ``review``."""

    timeout_s: int = Field(
        3600, ge=1, le=MAX_REVIEW_S, description="no answer within this time rejects"
    )
    auto: Literal["approve", "reject"] | None = Field(
        None,
        description="answer without asking (for unattended demos and tests); the report and "
        "the run's log say the answer was automatic",
    )


class TrafficConfig(StrictModel):
    """Requests the release drives through the load balancer while it analyses the canary.

    A service with users needs none; a demo has no users, so without it every window would
    be inconclusive. It targets only the project's own load balancer on 127.0.0.1."""

    rate_rps: float = Field(2.0, gt=0, le=50, description="requests per second")
    concurrency: int = Field(4, ge=1, le=64, description="requests in flight at most")
    max_tokens: int = Field(16, ge=1, le=1024, description="tokens each answer may have")


class RolloutConfig(StrictModel):
    """The canary's walk: weights follow ``steps``; each step holds until
    ``windows_per_step`` analysis windows in a row pass; the final step (100) waits for an
    approval; failing windows beyond ``failure_limit`` roll back at once."""

    mode: Literal["progressive", "hold"] = Field(
        "progressive",
        description="progressive: analyse, widen and promote or roll back; hold: leave the "
        "canary at the first step for 'llm-release canary promote|rollback'",
    )
    steps: list[Annotated[int, Field(ge=0, le=100)]] = Field(
        default_factory=lambda: [5, 25, 50, 100],
        max_length=MAX_LIST,
        description="canary weights in percent, rising, ending at 100 (= promotion)",
    )
    windows_per_step: int = Field(
        2, ge=1, le=100, description="consecutive passing windows that clear a step"
    )
    failure_limit: int = Field(
        0,
        ge=0,
        le=100,
        description="failing windows tolerated over the whole rollout; one more rolls back",
    )
    inconclusive_limit: int = Field(
        3,
        ge=1,
        le=100,
        description="inconclusive windows within one step before a person is asked",
    )
    warmup_s: float = Field(
        30,
        ge=0,
        le=3600,
        description="seconds the canary serves its first step's share before the first "
        "analysis window: its cold start (a CPU build's first requests of each shape) is "
        "not judged",
    )
    approval: Literal["ask", "approve"] = Field(
        "ask",
        description="before the final step: ask a person in the Prefect UI, or approve "
        "without asking (unattended demos; the report and the log say so)",
    )
    approval_timeout_s: int = Field(
        3600, ge=1, le=MAX_REVIEW_S, description="no answer within this time rolls the canary back"
    )
    analysis: AnalysisConfig = Field(default_factory=lambda: AnalysisConfig())
    traffic: TrafficConfig | None = Field(
        None, description="drive requests through the load balancer while analysing (demo)"
    )

    @field_validator("steps")
    @classmethod
    def _rising_to_100(cls, steps: list[int]) -> list[int]:
        if not steps or steps[-1] != 100:
            raise ValueError(f"steps {steps} must end at 100 (the promotion)")
        if any(not 1 <= w <= 100 for w in steps):
            raise ValueError(f"steps {steps}: every weight is a percent from 1 to 100")
        if any(b <= a for a, b in zip(steps, steps[1:], strict=False)):
            raise ValueError(f"steps {steps} must rise strictly")
        if len(steps) > 1 and steps[0] > 50:
            raise ValueError(f"steps {steps}: the first canary weight is at most 50 percent")
        return steps

    @property
    def first_weight(self) -> int:
        # A one-step walk [100] still starts as a canary, beside the stable release.
        return self.steps[0] if self.steps[0] < 100 else 5


class ReleaseConfig(StrictModel):
    """Everything a release needs: the Prefect UI renders it as the run form."""

    source: SourceConfig
    candidates: list[CandidateConfig] = Field(
        default_factory=lambda: [
            CandidateConfig(name="fp8-dynamic", scheme="FP8_DYNAMIC"),
            CandidateConfig(name="w4a16-awq", scheme="W4A16_AWQ"),
        ],
        max_length=16,
    )
    serving: ServingConfig = Field(default_factory=ServingConfig)
    evaluation: EvalConfig = Field(default_factory=EvalConfig)
    load: LoadProfile = Field(default_factory=LoadProfile)
    gates: Gates = Field(default_factory=Gates)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    review: ReviewConfig = Field(default_factory=ReviewConfig)
    tune: TuneConfig = Field(
        default_factory=TuneConfig, description="serving settings tuned per candidate (off)"
    )
    router_port: int | None = Field(
        None, ge=1024, le=65535, description="the service's load balancer (LLM_RELEASE_ROUTER_PORT)"
    )
    public_name: str | None = Field(
        None,
        description="the model name clients call; default: the repo's last path part",
        pattern=SERVED_NAME_PATTERN,
        max_length=MAX_SERVED_NAME,
    )
    replaces_service: bool = Field(
        False,
        description="this release may replace the model of a service whose stable release "
        "serves another repository or public name (its canary then also answers to the "
        "service's public name)",
    )
    force: bool = Field(False, description="judge again a commit already judged with this config")

    def served_name(self) -> str:
        return self.public_name or self.source.repo_id.split("/")[-1]

    @model_validator(mode="after")
    def _allowed_candidate_args(self) -> ReleaseConfig:
        # Each candidate's arguments join serving.extra_args: the same allow-list, and no
        # flag that a typed serving field sets too.
        for c in self.candidates:
            self.serving.check_args(
                c.extra_serving_args, f"candidates[{c.name}].extra_serving_args"
            )
        return self

    @model_validator(mode="after")
    def _request_tokens_from_the_load(self) -> ReleaseConfig:
        # the batch size a GPU server gets by default is sized for the load the release is
        # measured with
        if self.serving.request_tokens is None:
            tokens = self.load.prompt_tokens + self.load.output_tokens
            prefix = self.load.shared_prefix
            if prefix is not None and not self.serving.enable_prefix_caching:
                # without prefix caching every request holds its own copy of the prefix; with
                # it the prefix's blocks are held once, by every request that shares them
                tokens += prefix.tokens
            self.serving.request_tokens = tokens
        return self

    @model_validator(mode="after")
    def _served_name_is_a_name(self, info: ValidationInfo) -> ReleaseConfig:
        # The default public name is the repo's last part: the same rule as public_name.
        name = self.served_name()
        if self.public_name is None and not _stored(info):
            if len(name) > MAX_SERVED_NAME or not SERVED_NAME.fullmatch(name):
                raise ValueError(
                    f"the repo's name {name[:80]!r} is no public name (public_name: "
                    f"{SERVED_NAME_RULE}): set public_name"
                )
        return self

    @model_validator(mode="after")
    def _canary_error_ceiling_from_gates(self) -> ReleaseConfig:
        analysis = self.rollout.analysis
        if analysis.error_share_ceiling is None:
            analysis.error_share_ceiling = self.gates.max_error_rate
        return self

    @model_validator(mode="after")
    def _unique_candidates(self) -> ReleaseConfig:
        names = [c.name for c in self.candidates]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"candidate names must be unique; repeated: {dupes}")
        if BASELINE in names or CHAMPION in names:
            raise ValueError(
                f"'{BASELINE}' (the unquantized model) and '{CHAMPION}' (the release serving "
                "users now) are reserved candidate names"
            )
        return self


BASELINE = "baseline"
CHAMPION = "champion"
