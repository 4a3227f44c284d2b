"""Quantize: build FP8 and W4A16 (AWQ) candidates with llm-compressor.

Outputs are compressed-tensors checkpoints that vLLM loads directly. A candidate is
cached under a key hashed from everything that determines its bytes (the model's
manifest, the recipe, the calibration data, the library versions), so the same inputs
never quantize twice. Runs on CUDA when present, on CPU otherwise.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from . import hardware, paths
from .config import CandidateConfig
from .errors import ConfigError, QuantizeError
from .fileio import atomic_write_json, sha256_file

RECORD = "llm-release-quantization.json"


@dataclass
class Quantized:
    name: str
    model_dir: Path
    cache_key: str
    cached: bool
    seconds: float
    device: str
    compute_dtype: str = "auto"


def calibration_path(name: str) -> Path:
    path = paths.calibration_dir() / f"{name}.jsonl"
    if not path.exists():
        available = sorted(p.stem for p in paths.calibration_dir().glob("*.jsonl"))
        raise ConfigError(
            f"calibration set {name!r} not found at {path}",
            hint=f"available calibration sets: {', '.join(available) or 'none'}",
        )
    return path


def load_calibration_texts(name: str) -> list[str]:
    texts = []
    for lineno, line in enumerate(calibration_path(name).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("text"), str) or not row["text"].strip():
            raise ConfigError(f"calibration/{name}.jsonl line {lineno}: needs a non-empty 'text'")
        texts.append(row["text"])
    return texts


def _model_fingerprint(model_dir: Path) -> str:
    """Hash of the baseline's manifest (file hashes), or of the files themselves."""
    manifest = model_dir.with_name(model_dir.name + ".manifest.json")
    if manifest.exists():
        files = json.loads(manifest.read_text())["files"]
        listing = sorted((f["path"], f["sha256"]) for f in files)
    else:
        listing = sorted(
            (p.relative_to(model_dir).as_posix(), sha256_file(p))
            for p in model_dir.rglob("*")
            if p.is_file() and ".cache" not in p.parts
        )
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def cache_key(model_dir: Path, candidate: CandidateConfig, compute_dtype: str = "auto") -> str:
    parts = {
        "model": _model_fingerprint(model_dir),
        "recipe": candidate.model_dump(exclude={"name", "extra_serving_args"}),
        "llmcompressor": version("llmcompressor"),
        "compressed_tensors": version("compressed-tensors"),
    }
    if candidate.scheme == "W4A16_AWQ":
        parts["calibration"] = sha256_file(calibration_path(candidate.calibration_set))
    if compute_dtype != "auto":
        # Calibrating in float32 gives (slightly) different scales than in bf16.
        parts["compute_dtype"] = compute_dtype
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def build_recipe(candidate: CandidateConfig, hidden_size: int, intermediate_size: int):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from llmcompressor.modifiers.quantization import QuantizationModifier

    if candidate.scheme == "FP8_DYNAMIC":
        return [
            QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=candidate.ignore)
        ]
    for width in (hidden_size, intermediate_size):
        if width % candidate.group_size:
            raise ConfigError(
                f"W4A16 group size {candidate.group_size} does not divide layer width {width}",
                hint="choose a group size that divides every Linear input width (e.g. 64 for "
                "SmolLM2's 576), or add the layer to 'ignore'",
            )
    from llmcompressor.modifiers.transform.awq import AWQModifier

    scheme = QuantizationScheme(
        targets=["Linear"],
        weights=QuantizationArgs(
            num_bits=4,
            type="int",
            symmetric=candidate.symmetric,
            strategy="group",
            group_size=candidate.group_size,
        ),
    )
    return [
        AWQModifier(),
        QuantizationModifier(config_groups={"group_0": scheme}, ignore=candidate.ignore),
    ]


def _allow_cpu_calibration() -> None:
    """llm-compressor pins calibration tensors for fast host-to-device copies; with no
    accelerator, pin_memory() raises, so pinning becomes a no-op there."""
    import torch
    from llmcompressor.pipelines.cache import IntermediatesCache

    if not torch.accelerator.is_available():
        IntermediatesCache.pin_memory = lambda self, batch_index, input_names=None: None


def check_artifact(model_dir: Path, scheme: str) -> None:
    """The contract of a candidate: compressed-tensors config, weights, tokenizer."""
    config_path = model_dir / "config.json"
    if not config_path.exists():
        raise QuantizeError(f"{model_dir} has no config.json after quantization")
    qconfig = json.loads(config_path.read_text()).get("quantization_config") or {}
    if qconfig.get("quant_method") != "compressed-tensors":
        raise QuantizeError(
            f"{model_dir}: quantization_config is not compressed-tensors: {qconfig}"
        )
    if not list(model_dir.glob("*.safetensors")):
        raise QuantizeError(f"{model_dir} has no safetensors weights")
    if not (model_dir / "tokenizer_config.json").exists():
        raise QuantizeError(f"{model_dir} has no tokenizer")


def quantize(
    model_dir: Path,
    candidate: CandidateConfig,
    out_root: Path | None = None,
    *,
    host: hardware.Hardware | None = None,
) -> Quantized:
    """``host`` decides the device and the dtype of the math: the checkpoint's own dtype on a
    GPU or a CPU with native bf16, float32 on a CPU without (see ``hardware.compute_dtype``).
    The artifact is saved in the checkpoint's dtype either way."""
    model_dir = Path(model_dir)
    host = host or hardware.detect()
    compute_dtype = hardware.compute_dtype(host)
    out_root = Path(out_root) if out_root else paths.home() / "candidates"
    key = cache_key(model_dir, candidate, compute_dtype)
    out_dir = out_root / f"{candidate.name}-{key[:16]}"
    record_path = out_dir / RECORD
    if record_path.exists():
        record = json.loads(record_path.read_text())
        return Quantized(
            candidate.name,
            out_dir,
            key,
            True,
            0.0,
            record.get("device", "?"),
            record.get("compute_dtype", "auto"),
        )

    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _allow_cpu_calibration()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32 if compute_dtype == "float32" else "auto",
        device_map=device if device == "cuda" else None,
    )
    config = model.config
    saved_dtype = _checkpoint_dtype(model_dir, torch)
    recipe = build_recipe(candidate, config.hidden_size, config.intermediate_size)
    kwargs = {}
    if candidate.scheme == "W4A16_AWQ":
        texts = load_calibration_texts(candidate.calibration_set)
        kwargs = {
            "dataset": Dataset.from_dict({"text": texts}),
            "num_calibration_samples": min(candidate.num_calibration_samples, len(texts)),
            "max_seq_length": candidate.max_seq_length,
            "shuffle_calibration_samples": False,
        }
    try:
        oneshot(model=model, processor=tokenizer, recipe=recipe, **kwargs)
    except Exception as exc:
        raise QuantizeError(
            f"llm-compressor failed for {candidate.name} ({candidate.scheme}): "
            f"{type(exc).__name__}: {exc}",
        ) from exc
    staging = out_root / f".{out_dir.name}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    if saved_dtype is not None and compute_dtype == "float32":
        # Back to the checkpoint's dtype: the unquantized layers (embeddings, norms, lm_head)
        # and the scales are then stored as a bf16 run stores them, at half the float32 size.
        model.to(saved_dtype)
        model.config.dtype = saved_dtype
    model.save_pretrained(staging, save_compressed=True)
    tokenizer.save_pretrained(staging)
    for extra in ("generation_config.json", "chat_template.jinja"):
        if (model_dir / extra).exists() and not (staging / extra).exists():
            shutil.copy2(model_dir / extra, staging / extra)
    check_artifact(staging, candidate.scheme)
    seconds = time.monotonic() - started
    atomic_write_json(
        staging / RECORD,
        {
            "candidate": candidate.model_dump(),
            "cache_key": key,
            "source_model": str(model_dir),
            "device": device,
            "compute_dtype": compute_dtype,
            "host": host.describe(),
            "seconds": round(seconds, 2),
            "llmcompressor": version("llmcompressor"),
        },
    )
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return Quantized(candidate.name, out_dir, key, False, seconds, device, compute_dtype)


def _checkpoint_dtype(model_dir: Path, torch):
    """The dtype the checkpoint declares (``dtype`` or the older ``torch_dtype``), or None."""
    config = json.loads((model_dir / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype")
    value = getattr(torch, name, None) if isinstance(name, str) else None
    return value if isinstance(value, torch.dtype) else None


def dir_size(model_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(model_dir).rglob("*.safetensors"))
