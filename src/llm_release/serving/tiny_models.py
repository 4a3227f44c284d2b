"""Tiny random-weight models (a Llama and a Qwen3-MoE) with a real tokenizer: what the
scheme probe quantizes and serves to learn whether the runtime runs a scheme on this host,
and what the tests serve to stay fast. torch and transformers are imported on use.
"""

from __future__ import annotations

import shutil
from pathlib import Path

# SmolLM2's own ChatML template, used when the GGUF carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def finish_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def _tiny_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    finish_tokenizer(tokenizer)
    return tokenizer


def _save_tiny(model, tokenizer, out_dir: Path, what: str, **save_kwargs) -> Path:
    """Generation defaults from the tokenizer, then stage-then-rename into ``out_dir``."""
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, **save_kwargs)
    tokenizer.save_pretrained(staging)
    write_readme(staging, f"Tiny random-weight {what} for tests.")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


def build_tiny_model(
    out_dir: Path, tokenizer_dir: Path, *, seed: int = 0, hidden_size: int = 128, layers: int = 2
) -> Path:
    """A random-weight Llama with a real tokenizer; widths divide the W4A16 group size."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _tiny_tokenizer(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Small shards so the tiny model exercises the multi-shard path like a real one.
    return _save_tiny(model, tokenizer, Path(out_dir), "Llama", max_shard_size="10MB")


def build_tiny_moe_model(
    out_dir: Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    layers: int = 2,
    experts: int = 4,
) -> Path:
    """A random-weight Qwen3-MoE (router gate + ``experts`` experts per layer, top-2) with a
    real tokenizer; the experts' width is ``hidden_size // 2``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    out_dir = Path(out_dir)
    tokenizer = _tiny_tokenizer(tokenizer_dir)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        moe_intermediate_size=hidden_size // 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        num_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    built = out_dir.with_name(out_dir.name + ".from-config")
    shutil.rmtree(built, ignore_errors=True)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(built)
    # A MoE built with from_config fails llm-compressor's expert linearization (design.md
    # section 4): saved and loaded back, as a real checkpoint is loaded.
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.bfloat16)
    shutil.rmtree(built, ignore_errors=True)
    return _save_tiny(model, tokenizer, out_dir, "Qwen3-MoE")


def write_readme(directory: Path, text: str) -> None:
    (directory / "README.md").write_text(f"# {directory.name}\n\n{text}\n")
