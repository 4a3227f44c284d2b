"""The vLLM arguments a release may set: an allow-list of tuning flags, each value checked.

``serving.extra_args`` and a candidate's ``extra_serving_args`` come from the run form, so
they are hostile: vLLM's command line can re-bind the server, import a class by its
qualified name (``--scheduler-cls``, ``--kv-transfer-config``'s connector module,
``-O``'s passes), read files (``--log-config-file``, ``--generation-config``) or load
another model, and it grows with every release. A deny-list of it always lags behind; this
list names what a release tunes (batching, memory, parallel sizes, KV dtype, chunked
prefill, eager mode, the few backends a model needs) and refuses everything else, in any
spelling: only the exact long name passes (``--flag value`` or ``--flag=value``); '_' for
'-', upper case, abbreviations, dotted JSON keys (``--hf-overrides.x``), short options
(``-O3``, ``-tp``) and values without a flag are refused with one line naming the flag and
the list. The settings ServingConfig types itself (``--max-model-len`` …) are refused here
and pointed at their field, so the planner and vLLM never read two different values.

The operator (not a run) may add flags: ``LLM_RELEASE_ALLOW_SERVING_FLAGS`` is a comma-
separated list of long flag names whose values are passed unchecked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from llm_release.settings import settings

OPERATOR_FLAGS_ENV = "LLM_RELEASE_ALLOW_SERVING_FLAGS"
_LONG_NAME = re.compile(r"--[a-z0-9][a-z0-9-]*")


@dataclass(frozen=True)
class Flag:
    """A flag of the allow-list: ``check`` is None for a switch (it takes no value)."""

    check: Callable[[str], bool] | None
    what: str = "no value"


SWITCH = Flag(None)


def _int(low: int, high: int) -> Flag:
    def check(value: str) -> bool:
        return re.fullmatch(r"[0-9]{1,12}", value) is not None and low <= int(value) <= high

    return Flag(check, f"an integer from {low} to {high}")


def _float(low: float, high: float) -> Flag:
    def check(value: str) -> bool:
        if not re.fullmatch(r"[0-9]{1,6}(\.[0-9]{1,6})?", value):
            return False
        number = float(value)
        return math.isfinite(number) and low <= number <= high

    return Flag(check, f"a number from {low:g} to {high:g}")


def _choice(*values: str) -> Flag:
    return Flag(lambda value: value in values, "one of " + ", ".join(values))


def _name(pattern: str, what: str) -> Flag:
    compiled = re.compile(pattern)
    return Flag(lambda value: compiled.fullmatch(value) is not None, what)


# What a release may tune, checked as vLLM 0.32 (the pinned runtime) reads it. vLLM checks
# again; these checks keep values that are not numbers or names out of its parser.
ALLOWED: dict[str, Flag] = {
    # batching
    "--max-num-batched-tokens": _int(1, 16_777_216),
    "--enable-chunked-prefill": SWITCH,
    "--no-enable-chunked-prefill": SWITCH,
    # memory
    "--cpu-offload-gb": _float(0, 4096),
    "--kv-cache-memory-bytes": _int(1, 2**50),
    "--block-size": _choice("1", "8", "16", "32", "64", "128", "256"),
    "--kv-cache-dtype": _choice("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
    # parallelism (GPUs are claimed for tensor_parallel_size: set that field instead of
    # --tensor-parallel-size when serving.gpus is auto)
    "--tensor-parallel-size": _int(1, 64),
    "--pipeline-parallel-size": _int(1, 64),
    "--data-parallel-size": _int(1, 64),
    "--enable-expert-parallel": SWITCH,
    # kernels and the model's own needs
    "--quantization": _name(r"[a-z0-9][a-z0-9_-]{0,39}", "a quantization method name"),
    "--enforce-eager": SWITCH,
    "--attention-backend": _name(r"[A-Z][A-Z0-9_]{0,39}", "a backend name (FLASH_ATTN, …)"),
    "--gdn-prefill-backend": _choice("triton", "flashinfer"),
    "--language-model-only": SWITCH,
    "--reasoning-parser": _name(r"[a-z0-9][a-z0-9_-]{0,39}", "a reasoning parser name"),
    "--seed": _int(0, 2**32 - 1),
}

# Flags ServingConfig sets from its own typed, range-checked fields (serve.vllm_args);
# given again in extra_args they would override the field the planner sizes with.
TYPED: dict[str, str] = {
    "--max-model-len": "serving.max_model_len",
    "--max-num-seqs": "serving.max_num_seqs",
    "--gpu-memory-utilization": "serving.gpu_memory_utilization",
    "--device-memory-utilization": "serving.gpu_memory_utilization",  # vLLM's alias
    "--dtype": "serving.dtype",
    "--enable-prefix-caching": "serving.enable_prefix_caching",
    "--no-enable-prefix-caching": "serving.enable_prefix_caching",
    # a JSON that may name a draft model or a path: only the typed shapes pass
    "--speculative-config": "serving.speculation",
}


def operator_flags() -> set[str]:
    """Long flag names the operator allows beyond the list (``LLM_RELEASE_ALLOW_SERVING_FLAGS``)."""
    names = set(settings().allow_serving_flags)
    bad = sorted(n for n in names if not _LONG_NAME.fullmatch(n))
    if bad:
        raise ValueError(
            f"{OPERATOR_FLAGS_ENV}: {_show(bad[0])} is not a long flag name "
            "(--lower-case-words, comma-separated)"
        )
    return names


def _show(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def allowed_list() -> str:
    return ", ".join(sorted(ALLOWED))


def parse(args: list[str], where: str) -> list[tuple[str, str | None]]:
    """``args`` as (flag, value) pairs; ValueError (one line) on anything not allowed."""
    extra = operator_flags()
    pairs: list[tuple[str, str | None]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        name, has_value, value = arg.partition("=")
        if name in TYPED:
            raise ValueError(
                f"{where}: {name} is set by {TYPED[name]}: set it there (one value for "
                "vLLM and the planner)"
            )
        if name in extra:
            if not has_value and i < len(args) and not args[i].startswith("-"):
                value, has_value, i = args[i], "=", i + 1
            pairs.append((name, value if has_value else None))
            continue
        flag = ALLOWED.get(name)
        if flag is None:
            raise ValueError(
                f"{where}: {_refusal(arg)}; allowed: {allowed_list()} (the operator adds "
                f"others with {OPERATOR_FLAGS_ENV})"
            )
        if flag.check is None:
            if has_value:
                raise ValueError(f"{where}: {name} takes no value (write {name} alone)")
            pairs.append((name, None))
            continue
        if not has_value:
            if i >= len(args):
                raise ValueError(f"{where}: {name} needs a value: {flag.what}")
            value = args[i]
            i += 1
        if not flag.check(value):
            raise ValueError(f"{where}: {name} {_show(value)}: the value must be {flag.what}")
        pairs.append((name, value))
    return pairs


def _refusal(arg: str) -> str:
    name = arg.partition("=")[0]
    if not arg.startswith("-"):
        return f"{_show(arg)} is a value with no flag before it"
    spelled = "--" + name.lstrip("-").replace("_", "-").lower()
    if spelled != name and spelled in TYPED:
        return f"{_show(name)} is set by {TYPED[spelled]}: set it there"
    if spelled != name and spelled in ALLOWED:
        return f"{_show(name)} is not allowed as written: write {spelled}"
    return f"{_show(name)} is not a vLLM flag a release may set"


def check_serving_args(args: list[str], where: str) -> list[tuple[str, str | None]]:
    """The parsed ``args``; ValueError (one line) on the first flag or value not allowed."""
    return parse(list(args), where)


def flag_value(pairs: list[tuple[str, str | None]], name: str) -> str | None:
    """The last value given for ``name`` (vLLM keeps the last); '' for a switch."""
    found = None
    for flag, value in pairs:
        if flag == name:
            found = "" if value is None else value
    return found
