"""Recipes derived from a model's ``config.json``: what to quantize, what to leave, and why.

The quantize stage used to name only ``lm_head``; on a mixture-of-experts model the router
gates stayed in bf16 only because transformers' router is not a ``Linear`` (issue 11). Here
the ignore list comes from the architecture the config describes, so the gates are left by
the recipe, not by a library's class layout:

- ``lm_head`` and the token embeddings: every upstream quantized checkpoint keeps them.
- Router gates (``mlp.gate``) and shared-expert gates (``mlp.shared_expert_gate``): a few
  rows that pick experts; an error there reroutes tokens. llm-compressor's own MoE examples
  ignore ``re:.*mlp.gate$`` and ``re:.*shared_expert_gate$`` (examples/quantization_w8a8_fp8/
  qwen3_5_moe.py).
- Hybrid linear-attention models (Qwen3-Next ``full_attention_interval``, Qwen3.5
  ``layer_types``): the Gated DeltaNet's small b/a projections (``linear_attn.in_proj_ba``,
  or ``in_proj_b``/``in_proj_a`` where they are split) stay in full precision, as Qwen's
  Qwen3-Next-80B-A3B-Instruct-FP8 leaves them (its ``modules_to_not_convert`` lists every
  layer's ``linear_attn.in_proj_ba``; found with the code search, a vLLM config test). They
  are 2 x num_value_heads rows wide: nothing to save, and they set the decay of the state.
  llm-compressor's Qwen3.5-397B FP8 example goes further and ignores all of ``linear_attn``;
  the large ``in_proj_qkvz``/``out_proj`` are quantized here, as upstream's FP8 does.

Expert weights (``mlp.experts.N.{gate,up,down}_proj``) are quantized: they are most of an
MoE model's bytes.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from llm_release.errors import ConfigError

# Pattern -> why it is left in full precision. Order is the record's order.
ALWAYS = {
    "lm_head": "output head: every upstream quantized checkpoint keeps it",
    "re:.*embed_tokens$": "token embeddings: a lookup, not a matmul",
}
MOE = {
    "re:.*mlp.gate$": "router gate: picks the experts; an error reroutes tokens",
    "re:.*shared_expert_gate$": "shared-expert gate: one row that scales the shared expert",
}
HYBRID = {
    "re:.*linear_attn.in_proj_ba$": "linear-attention b/a projection (Qwen3-Next FP8 keeps it)",
    "re:.*linear_attn.in_proj_b$": "linear-attention b projection (split form of in_proj_ba)",
    "re:.*linear_attn.in_proj_a$": "linear-attention a projection (split form of in_proj_ba)",
}


@dataclass(frozen=True)
class RecipeChoice:
    """What the config says about the model, and the recipe's decisions from it."""

    architecture: str
    moe: bool
    hybrid: bool
    num_experts: int
    ignore: dict[str, str] = field(default_factory=dict)
    # Linear input widths by role: W4A16 groups run along the input dimension.
    input_widths: dict[str, int] = field(default_factory=dict)

    @property
    def ignore_patterns(self) -> list[str]:
        return list(self.ignore)

    def reason_for(self, module: str) -> str | None:
        """Why ``module`` (a dotted name) is left unquantized by the recipe, or None."""
        for pattern, why in self.ignore.items():
            if _matches(module, pattern):
                return why
        return None


def _matches(name: str, pattern: str) -> bool:
    # compressed-tensors' rule: 're:' is a regex matched from the start; otherwise the
    # pattern names the module or its last components.
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern or name.endswith("." + pattern)


def text_config(config: dict) -> dict:
    """Qwen3.5 nests the language model's fields under ``text_config``."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _hybrid(cfg: dict) -> bool:
    types = cfg.get("layer_types")
    if isinstance(types, list) and any("linear" in str(t) for t in types):
        return True
    return bool(cfg.get("full_attention_interval")) or "linear_num_value_heads" in cfg


def choose_recipe(config: dict, extra_ignore: list[str] | tuple[str, ...] = ()) -> RecipeChoice:
    """The recipe choice from ``config.json`` alone (no weights, no model class)."""
    cfg = text_config(config)
    architecture = (config.get("architectures") or ["?"])[0]
    num_experts = int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)
    moe = num_experts > 0
    hybrid = _hybrid(cfg)
    ignore = dict(ALWAYS)
    if moe:
        ignore.update(MOE)
    if hybrid:
        ignore.update(HYBRID)
    for pattern in extra_ignore:
        if pattern not in ignore and not (pattern == "re:.*lm_head" and "lm_head" in ignore):
            ignore[pattern] = "named in the candidate's 'ignore'"

    hidden = int(cfg["hidden_size"])
    widths = {"hidden_size (q/k/v, gate/up, experts' gate/up)": hidden}
    heads, head_dim = cfg.get("num_attention_heads"), cfg.get("head_dim")
    if heads:
        widths["num_attention_heads x head_dim (o_proj)"] = int(heads) * int(
            head_dim or hidden // int(heads)
        )
    sparse_step = int(cfg.get("decoder_sparse_step") or 1)
    dense_layers = not moe or bool(cfg.get("mlp_only_layers")) or sparse_step > 1
    if dense_layers and cfg.get("intermediate_size"):
        widths["intermediate_size (dense down_proj)"] = int(cfg["intermediate_size"])
    if moe and cfg.get("moe_intermediate_size"):
        widths["moe_intermediate_size (experts' down_proj)"] = int(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        widths["shared_expert_intermediate_size (shared expert down_proj)"] = int(
            cfg["shared_expert_intermediate_size"]
        )
    if hybrid and cfg.get("linear_num_value_heads") and cfg.get("linear_value_head_dim"):
        widths["linear_num_value_heads x linear_value_head_dim (linear_attn.out_proj)"] = int(
            cfg["linear_num_value_heads"]
        ) * int(cfg["linear_value_head_dim"])
    return RecipeChoice(architecture, moe, hybrid, num_experts, ignore, widths)


def choose_recipe_for_model(model_dir: Path, extra_ignore=()) -> RecipeChoice:
    return choose_recipe(json.loads((Path(model_dir) / "config.json").read_text()), extra_ignore)


GROUP_SIZES = (128, 64, 32, 16)  # the group sizes W4A16 kernels are built for, largest first


def check_group_size(choice: RecipeChoice, group_size: int) -> None:
    """Every quantized Linear's input width must divide by the W4A16 group size, and the
    group size must be positive (0 divided nothing and failed deep in the quantizer; a
    negative size divided every width)."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ConfigError(
            f"W4A16 group size {group_size!r} is not a positive whole number",
            hint=f"use a group size that divides every layer width, {_suggestion(choice)}",
        )
    bad = {role: w for role, w in choice.input_widths.items() if w % group_size}
    if bad:
        listing = ", ".join(f"{role} = {w}" for role, w in bad.items())
        raise ConfigError(
            f"W4A16 group size {group_size} does not divide the Linear input widths: {listing}",
            hint=f"choose a group size that divides every Linear input width, "
            f"{_suggestion(choice)}, or add those layers to 'ignore'",
        )


def _suggestion(choice: RecipeChoice) -> str:
    widths = [w for w in choice.input_widths.values() if w > 0]
    fits = [g for g in GROUP_SIZES if all(w % g == 0 for w in widths)]
    if fits:
        return f"e.g. {fits[0]} for this model's widths {sorted(set(widths))}"
    return f"e.g. {math.gcd(*widths) if widths else 1} (this model's widths {sorted(set(widths))})"


def check_candidates(candidates, config: dict) -> None:
    """The group size of every W4A16 candidate against the model's ``config.json`` (the
    planning stage calls this before the download; quantization checks again)."""
    for candidate in candidates:
        if candidate.scheme != "W4A16_AWQ":
            continue
        try:
            choice = choose_recipe(config, candidate.ignore)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
            raise ConfigError(
                f"candidate {candidate.name!r}: config.json does not give the layer widths "
                f"W4A16 groups run along ({type(exc).__name__}: {str(exc)[:100]})",
                hint="quantize this model with FP8_DYNAMIC, or fix its config.json",
            ) from None
        try:
            check_group_size(choice, candidate.group_size)
        except ConfigError as exc:
            raise ConfigError(
                f"candidate {candidate.name!r}: {exc.message}", hint=exc.hint
            ) from None


def awq_mappings(choice: RecipeChoice):
    """AWQ's smoothing mappings: llm-compressor's registry for the architectures it knows
    (Qwen3MoeForCausalLM's balance the router gate with the experts' gate/up, so the gate's
    output is unchanged by the smoothing), derived MLP-only mappings for hybrid MoE models
    the registry lacks (their linear-attention layers have no q/k/v for the attention
    mapping to match), else None (the library's default)."""
    from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY, AWQMapping

    if choice.architecture in AWQ_MAPPING_REGISTRY:
        return None  # AWQModifier resolves the registry itself, by the model's class name
    if choice.moe and choice.hybrid:
        return [
            AWQMapping(
                "re:.*post_attention_layernorm$",
                [
                    "re:.*mlp.gate$",
                    "re:.*mlp.experts.*.gate_proj$",
                    "re:.*mlp.experts.*.up_proj$",
                    "re:.*mlp.shared_expert.gate_proj$",
                    "re:.*mlp.shared_expert.up_proj$",
                ],
            ),
            AWQMapping("re:.*mlp.experts.*.up_proj$", ["re:.*mlp.experts.*.down_proj$"]),
            AWQMapping("re:.*shared_expert.up_proj$", ["re:.*shared_expert.down_proj$"]),
        ]
    return None


def mappings_source(choice: RecipeChoice) -> str:
    from llmcompressor.modifiers.transform.awq.mappings import AWQ_MAPPING_REGISTRY

    if choice.architecture in AWQ_MAPPING_REGISTRY:
        return f"llm-compressor registry: {choice.architecture}"
    if choice.moe and choice.hybrid:
        return "derived: MLP/expert smoothing only (hybrid MoE, not in the registry)"
    return "llm-compressor default mappings"


QUANT_SUFFIXES = (".weight_scale", ".weight_packed")


def layer_report(model_dir: Path, choice: RecipeChoice) -> dict:
    """Which layers the saved artifact quantized and which it left, each with the reason, read
    from the safetensors headers (no tensor is loaded) and the saved ``quantization_config``."""
    from safetensors import safe_open

    quantized: set[str] = set()
    weights: dict[str, str] = {}
    for shard in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in f.keys():
                module, _, leaf = key.rpartition(".")
                if leaf in ("weight_scale", "weight_packed"):
                    quantized.add(module)
                elif leaf == "weight":
                    weights[module] = f.get_slice(key).get_dtype()
    config = json.loads((Path(model_dir) / "config.json").read_text())
    saved_ignore = (config.get("quantization_config") or {}).get("ignore") or []
    left: dict[str, str] = {}
    for module in sorted(set(weights) - quantized):
        reason = choice.reason_for(module)
        if reason is None:
            if module in saved_ignore:
                reason = "in the saved quantization_config's ignore"
            elif "norm" in module.rsplit(".", 1)[-1]:
                reason = "normalization weight: not a Linear"
            else:
                reason = "not a Linear layer (not targeted by the scheme)"
        left[module] = f"{reason} ({weights[module]})"
    return {
        "ignore": choice.ignore,
        "saved_ignore": saved_ignore,
        "quantized_count": len(quantized),
        "not_quantized_count": len(left),
        "quantized": sorted(quantized),
        "not_quantized": left,
    }
