"""Header-only stand-ins of the sizing shapes (scripts/gpu/shapes/*/config.json): the tensor
table a real checkpoint of that config would carry, so that the planner reads the weights
through the same safetensors headers it reads on a real folder.

    .venv/bin/python scripts/gpu/standins.py tables    # tests/unit/data/gpu/shapes/*.tensors.json
    .venv/bin/python scripts/gpu/standins.py write SHAPE DIR   # DIR/config.json + model.safetensors

The table comes from transformers: the config's model built on the meta device (no memory),
its state dict's names, shapes and dtypes. A ``quantization_config`` of compressed-tensors is
applied as llm-compressor writes its checkpoints: every Linear but ``lm_head`` (and the MoE
router) replaced by its packed weight and scales (float-quantized: F8_E4M3 weight and one
BF16 scale per output channel; pack-quantized: 4-bit weights packed eight to an I32, a BF16
scale per group and the I32 weight_shape). A table is a JSON object name -> [dtype, shape].
The written model.safetensors is its header and a sparse tail of the promised length: it reads
as the checkpoint's header and takes no disk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "scripts" / "gpu" / "shapes"
TABLES = ROOT / "tests" / "unit" / "data" / "gpu" / "shapes"
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1, "I32": 4, "I64": 8}
TORCH_NAMES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def _bf16_table(config: dict) -> dict[str, list]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(config)
    cfg.pop("quantization_config", None)
    if "text_config" in cfg:  # served --language-model-only: the text model's weights
        cfg = cfg["text_config"]
    kind = cfg["model_type"]
    hf = AutoConfig.for_model(kind, **{k: v for k, v in cfg.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    table = {}
    for name, tensor in model.state_dict().items():
        table[name] = [TORCH_NAMES[str(tensor.dtype).removeprefix("torch.")], list(tensor.shape)]
    if getattr(hf, "tie_word_embeddings", False):
        table.pop("lm_head.weight", None)
    return table


def _is_quantized_linear(name: str, shape: list[int]) -> bool:
    if not name.endswith(".weight") or len(shape) != 2:
        return False
    skip = ("lm_head", "embed_tokens", "norm", ".gate.weight", "router")
    return not any(s in name for s in skip)


def quantize_table(table: dict[str, list], qcfg: dict) -> dict[str, list]:
    """The compressed-tensors checkpoint's table for one config group over Linear layers."""
    if qcfg.get("quant_method") != "compressed-tensors":
        raise SystemExit(f"only compressed-tensors stand-ins are written, not {qcfg}")
    (group,) = qcfg["config_groups"].values()
    weights = group["weights"]
    out: dict[str, list] = {}
    for name, (dtype, shape) in table.items():
        if not _is_quantized_linear(name, shape):
            out[name] = [dtype, shape]
            continue
        base = name.removesuffix(".weight")
        rows, cols = shape
        if weights["type"] == "float" and weights["num_bits"] == 8:
            out[name] = ["F8_E4M3", shape]
            out[base + ".weight_scale"] = ["BF16", [rows, 1]]
        elif weights["type"] == "int" and weights["num_bits"] == 4:
            group_size = weights["group_size"]
            out[base + ".weight_packed"] = ["I32", [rows, cols // 8]]
            out[base + ".weight_scale"] = ["BF16", [rows, cols // group_size]]
            out[base + ".weight_shape"] = ["I64", [2]]
            if not weights.get("symmetric", True):
                out[base + ".weight_zero_point"] = ["I32", [rows // 8, cols // group_size]]
        else:
            raise SystemExit(f"no stand-in rule for weights {weights}")
    return out


def table_for(shape: str) -> dict[str, list]:
    config = json.loads((SHAPES / shape / "config.json").read_text())
    table = _bf16_table(config)
    if "quantization_config" in config:
        table = quantize_table(table, config["quantization_config"])
    return table


def write_standin(config: dict, table: dict[str, list], folder: Path) -> Path:
    """``folder``/config.json and a header-only model.safetensors of ``table``."""
    import math

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    header, offset = {}, 0
    for name, (dtype, shape) in sorted(table.items()):
        size = math.prod(shape) * DTYPE_BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    path = folder / "model.safetensors"
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        f.truncate(8 + len(raw) + offset)  # sparse: promised, never written
    return path


def main(argv: list[str]) -> int:
    if argv[:1] == ["tables"]:
        TABLES.mkdir(parents=True, exist_ok=True)
        for folder in sorted(p for p in SHAPES.iterdir() if (p / "config.json").is_file()):
            table = table_for(folder.name)
            out = TABLES / f"{folder.name}.tensors.json"
            out.write_text(json.dumps(table, sort_keys=True, separators=(",", ":")) + "\n")
            total = sum(math_prod(s) * DTYPE_BYTES[d] for d, s in table.values())
            print(f"{folder.name}: {len(table)} tensors, {total / 2**30:.2f} GiB")
        return 0
    if argv[:1] == ["write"] and len(argv) == 3:
        config = json.loads((SHAPES / argv[1] / "config.json").read_text())
        print(write_standin(config, table_for(argv[1]), Path(argv[2])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


def math_prod(shape: list[int]) -> int:
    import math

    return math.prod(shape)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
