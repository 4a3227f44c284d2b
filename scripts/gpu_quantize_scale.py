"""Prove the quantize stage on a GPU at scale: MoE recipes, and models larger than the GPU.

Each step is one process (a fresh CUDA context, so the peak-memory figures and the memory cap
belong to that step alone) and prints one JSON line:

    moe      a random Qwen3-MoE with 64 experts, FP8 and W4A16 through quantize(); the
             served format is checked (compressed-tensors config, experts quantized, gates
             not) from the safetensors headers.
    gen      a random-weight Llama of --gb GB, written shard by shard from random tensors
             made on the GPU (never a whole model in memory).
    run      one quantization of that model through quantize(), the path chosen by the
             stage itself; --cap F caps this process's GPU memory at F x the model's size
             (torch.cuda.set_per_process_memory_fraction). Reports the path, seconds, seconds
             per decoder layer, peak GPU memory and its ratio to the model's size, then
             fingerprints the output (FP8: a sha256 per tensor; AWQ: the packed weights and
             scales of three layers kept in a side file) and deletes it (the disk holds the
             model and one output at a time).
    compare  the capped and uncapped outputs: FP8 tensors equal; AWQ int4 codes equal
             fraction and largest relative scale difference.
    copies   host<->GPU copy rates of one decoder layer's weights held three ways in host
             memory: a private file mapping (what transformers' default loader leaves), read
             into anonymous memory, and pinned. Explains the sequential path's write-back.

    run --trace-offload also sums the time and bytes of compressed-tensors' CPU offload
    cache (onload: host to GPU; update_offload: the write-back of changed weights).

    python scripts/gpu_quantize_scale.py STEP --work DIR --tokenizer DIR [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path


def emit(args, row: dict) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


def moe(args) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig

    from llm_release.config import CandidateConfig
    from llm_release.quantization.quantize import model_bytes, quantize

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=2048,
        moe_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=64,
        num_experts=64,
        num_experts_per_tok=8,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    built = args.work / "moe-built"
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(built)
    model_dir = args.work / "moe64"
    AutoModelForCausalLM.from_pretrained(built, dtype=torch.bfloat16).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    shutil.rmtree(built)
    for candidate in (
        CandidateConfig(name="moe-fp8", scheme="FP8_DYNAMIC"),
        CandidateConfig(
            name="moe-w4a16",
            scheme="W4A16_AWQ",
            group_size=128,
            num_calibration_samples=32,
            max_seq_length=256,
        ),
    ):
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        result = quantize(model_dir, candidate, args.work / "candidates")
        record = json.loads((result.model_dir / "llm-release-quantization.json").read_text())
        qconfig = json.loads((result.model_dir / "config.json").read_text())["quantization_config"]
        dtypes = {}
        for shard in result.model_dir.glob("*.safetensors"):
            with safe_open(shard, "pt") as f:
                dtypes |= {k: f.get_slice(k).get_dtype() for k in f.keys()}
        leaf = "weight" if candidate.scheme == "FP8_DYNAMIC" else "weight_packed"
        experts = [
            f"model.layers.{i}.mlp.experts.{e}.{p}"
            for i in range(4)
            for e in range(64)
            for p in ("gate_proj", "up_proj", "down_proj")
        ]
        experts_quantized = sum(
            f"{n}.weight_scale" in dtypes and dtypes.get(f"{n}.{leaf}") in ("F8_E4M3", "I32")
            for n in experts
        )
        gates = {dtypes.get(f"model.layers.{i}.mlp.gate.weight") for i in range(4)}
        gate_scales = sum(f"model.layers.{i}.mlp.gate.weight_scale" in dtypes for i in range(4))
        emit(
            args,
            {
                "step": "moe",
                "candidate": candidate.name,
                "model": "random Qwen3-MoE, 4 layers, 64 experts (top-8), hidden 1024",
                "model_bytes": model_bytes(model_dir),
                "path": result.path,
                "seconds": round(result.seconds, 2),
                "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if torch.cuda.is_available()
                else None,
                "quant_method": qconfig["quant_method"],
                "format": qconfig.get("format"),
                "experts_quantized": f"{experts_quantized}/{len(experts)}",
                "gate_dtypes": sorted(g or "missing" for g in gates),
                "gates_with_scale": gate_scales,
                "quantized_layers": record["layers"]["quantized_count"],
                "not_quantized": sorted(
                    {v.split(" (")[0] for v in record["layers"]["not_quantized"].values()}
                ),
                "awq_mappings": record["awq_mappings"],
                "saved_ignore_count": len(qconfig.get("ignore") or []),
            },
        )
        shutil.rmtree(result.model_dir)


def gen(args) -> None:
    """A Llama of hidden 8192 / intermediate 28672 (a 70B-class layer, 1.71 GB in bf16) with
    as many layers as --gb needs, written shard by shard."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    model_dir = args.work / "big"
    if (model_dir / "model.safetensors.index.json").exists():
        emit(args, {"step": "gen", "reused": True})
        return
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    # --small: the same shapes' code path at a size a CPU runs in seconds (a local check).
    dims = (256, 512, 4, 2, 64) if args.small else (8192, 28672, 64, 8, 128)
    hidden, inter, heads, kv, head_dim = dims
    vocab = len(tokenizer)
    layer_bytes = 2 * (
        2 * hidden * heads * head_dim + 2 * hidden * kv * head_dim + 3 * hidden * inter
    )
    layers = -(-int(args.gb * 1e9 - 2 * 2 * vocab * hidden) // layer_bytes)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        dtype="bfloat16",
    )
    config.architectures = ["LlamaForCausalLM"]
    shutil.rmtree(model_dir, ignore_errors=True)
    model_dir.mkdir(parents=True)
    started = time.monotonic()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen_ = torch.Generator(device=device).manual_seed(0)

    def rand(*shape, std=0.02):
        t = torch.randn(*shape, device=device, dtype=torch.bfloat16, generator=gen_) * std
        return t.cpu()

    weight_map, total = {}, 0
    n = layers + 2

    def write(index: int, tensors: dict) -> None:
        nonlocal total
        name = f"model-{index + 1:05d}-of-{n:05d}.safetensors"
        save_file(tensors, model_dir / name, metadata={"format": "pt"})
        for key, tensor in tensors.items():
            weight_map[key] = name
            total += tensor.numel() * tensor.element_size()

    write(0, {"model.embed_tokens.weight": rand(vocab, hidden)})
    for i in range(layers):  # one decoder layer in host memory at a time
        p = f"model.layers.{i}."
        write(
            i + 1,
            {
                p + "input_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=torch.bfloat16),
                p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv * head_dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv * head_dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                p + "mlp.gate_proj.weight": rand(inter, hidden),
                p + "mlp.up_proj.weight": rand(inter, hidden),
                p + "mlp.down_proj.weight": rand(hidden, inter),
            },
        )
    write(
        layers + 1,
        {
            "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16),
            "lm_head.weight": rand(vocab, hidden),
        },
    )
    (model_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    config.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    emit(
        args,
        {
            "step": "gen",
            "model": f"random Llama, {layers} layers, hidden {hidden}, intermediate {inter}",
            "layers": layers,
            "model_bytes": total,
            "seconds": round(time.monotonic() - started, 1),
        },
    )


def _fingerprint(model_dir: Path, scheme: str, keep: Path) -> dict:
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    hashes, kept = {}, {}
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    sample = {f"model.layers.{i}." for i in (0, layers // 2, layers - 1)}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in f.keys():
                t = f.get_tensor(key)
                raw = t.contiguous().view(-1).view(torch.uint8).numpy()
                hashes[key] = hashlib.sha256(raw).hexdigest()
                if scheme == "W4A16_AWQ" and any(key.startswith(s) for s in sample):
                    kept[key] = t.contiguous()
    if kept:
        save_file(kept, keep)
    return hashes


def copies(args) -> None:
    """GB/s of host->GPU and GPU->host copies of one decoder layer's weights (its shard of the
    gen model), with the host copy in a private file mapping, anonymous memory, or pinned."""
    import mmap

    import torch
    from safetensors import safe_open
    from safetensors.torch import load as load_bytes

    model_dir = args.work / "big"
    index = json.loads((model_dir / "model.safetensors.index.json").read_text())
    shard = model_dir / index["weight_map"]["model.layers.0.mlp.up_proj.weight"]
    with safe_open(shard, "pt") as f:
        keys = [k for k in f.keys() if k.endswith("proj.weight")]
    with open(shard, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
    base = 8 + size

    def sync_time(fn) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def mapped() -> dict:
        # As transformers' mmap loader: a private (copy-on-write), writable file mapping.
        fh = open(shard, "rb")
        mm = mmap.mmap(
            fh.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE
        )
        out = {}
        for k in keys:
            start, end = header[k]["data_offsets"]
            t = torch.frombuffer(
                mm, dtype=torch.bfloat16, count=(end - start) // 2, offset=base + start
            )
            out[k] = t.view(header[k]["shape"])
        return out

    started = time.perf_counter()
    ways = {"private file mapping": mapped()}
    setup = {"private file mapping": time.perf_counter() - started}
    started = time.perf_counter()
    ways["anonymous (read)"] = {
        k: v for k, v in load_bytes(shard.read_bytes()).items() if k in keys
    }
    setup["anonymous (read)"] = time.perf_counter() - started
    started = time.perf_counter()
    ways["pinned"] = {k: v.pin_memory() for k, v in ways["anonymous (read)"].items()}
    setup["pinned"] = time.perf_counter() - started
    nbytes = sum(v.numel() * v.element_size() for v in ways["pinned"].values())
    on_gpu = {k: v.to("cuda") for k, v in ways["pinned"].items()}
    for name, host in ways.items():
        h2d = sync_time(lambda host=host: [host[k].to("cuda") for k in keys])
        d2h_first = sync_time(lambda host=host: [host[k].copy_(on_gpu[k]) for k in keys])
        d2h_again = sync_time(lambda host=host: [host[k].copy_(on_gpu[k]) for k in keys])
        emit(
            args,
            {
                "step": "copies",
                "host_memory": name,
                "bytes": nbytes,
                "setup_s": round(setup[name], 3),
                "h2d_gb_s": round(nbytes / h2d / 1e9, 2),
                "d2h_first_write_gb_s": round(nbytes / d2h_first / 1e9, 2),
                "d2h_again_gb_s": round(nbytes / d2h_again / 1e9, 2),
            },
        )


def _trace_offload(no_pin: bool = False) -> dict:
    """Wrap compressed-tensors' CPU offload cache: seconds and bytes each way, the write-back
    split into waiting for the GPU (a synchronize first) and the copy itself, and the kinds
    of host memory written to (pinned or not, dtypes)."""
    import torch
    from compressed_tensors.offload.cache.cpu import CPUCache

    totals = {
        "onload_s": 0.0,
        "onload_bytes": 0,
        "onload_calls": 0,
        "onload_pinned_bytes": 0,
        "write_back_s": 0.0,
        "write_back_sync_wait_s": 0.0,
        "write_back_bytes": 0,
        "write_back_calls": 0,
        "write_back_pinned_bytes": 0,
        "write_back_kinds": {},
        "write_back_slowest": [],
    }
    onload, update = CPUCache.onload, CPUCache.update_offload

    def traced_onload(self, offloaded):
        t = time.perf_counter()
        out = onload(self, offloaded)
        totals["onload_s"] += time.perf_counter() - t
        if offloaded is not None:
            n = offloaded.numel() * offloaded.element_size()
            totals["onload_bytes"] += n
            totals["onload_calls"] += 1
            totals["onload_pinned_bytes"] += n if offloaded.is_pinned() else 0
        return out

    def traced_update(self, offloaded, data):
        t0 = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        update(self, offloaded, data)
        t2 = time.perf_counter()
        totals["write_back_sync_wait_s"] += t1 - t0
        totals["write_back_s"] += t2 - t1
        if data is not None:
            n = data.numel() * data.element_size()
            totals["write_back_bytes"] += n
            totals["write_back_calls"] += 1
            totals["write_back_pinned_bytes"] += n if offloaded.is_pinned() else 0
            kind = (
                f"{data.device.type}:{data.dtype}->{offloaded.device.type}:{offloaded.dtype}"
                f"{' contiguous' if offloaded.is_contiguous() else ' strided'}"
            )
            k = totals["write_back_kinds"].setdefault(kind, [0, 0, 0.0])
            k[0], k[1], k[2] = k[0] + 1, k[1] + n, round(k[2] + t2 - t1, 3)
            slow = totals["write_back_slowest"]
            slow.append([round(t2 - t1, 3), list(data.shape)])
            slow.sort(reverse=True)
            del slow[5:]

    CPUCache.onload, CPUCache.update_offload = traced_onload, traced_update

    from llm_release.quantization import quantize

    pin = quantize.pin_host_copy

    def traced_pin(model, **kwargs):
        t = time.perf_counter()
        totals["pinned"] = False if no_pin else pin(model, **kwargs)
        totals["pin_s"] = time.perf_counter() - t
        return totals["pinned"]

    quantize.pin_host_copy = traced_pin
    return totals


def run(args) -> None:
    import torch

    from llm_release.config import CandidateConfig
    from llm_release.quantization.quantize import model_bytes, quantize

    model_dir = args.work / "big"
    size = model_bytes(model_dir)
    cuda = torch.cuda.is_available()
    total = torch.cuda.get_device_properties(0).total_memory if cuda else 0
    if args.cap:
        torch.cuda.set_per_process_memory_fraction(args.cap * size / total, 0)
    if args.scheme == "FP8_DYNAMIC":
        candidate = CandidateConfig(name="big-fp8", scheme="FP8_DYNAMIC")
    else:
        candidate = CandidateConfig(
            name="big-awq",
            scheme="W4A16_AWQ",
            group_size=128,
            num_calibration_samples=args.samples,
            max_seq_length=args.seq,
        )
    label = f"{candidate.name}-{'capped' if args.cap else 'uncapped'}{'-unpinned' if args.no_pin else ''}"
    traced = _trace_offload(args.no_pin) if args.trace_offload else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    result = quantize(model_dir, candidate, args.work / "candidates")
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    record = json.loads((result.model_dir / "llm-release-quantization.json").read_text())
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    fp_started = time.monotonic()
    hashes = _fingerprint(
        result.model_dir, candidate.scheme, args.work / f"{label}.keep.safetensors"
    )
    (args.work / f"{label}.hashes.json").write_text(json.dumps(hashes))
    out_bytes = sum(p.stat().st_size for p in result.model_dir.glob("*.safetensors"))
    shutil.rmtree(result.model_dir)
    emit(
        args,
        {
            "step": "run",
            "run": label,
            "scheme": candidate.scheme,
            "cap_bytes": int(args.cap * size) if args.cap else None,
            "gpu_total_bytes": total,
            "model_bytes": size,
            "path": result.path,
            "path_reason": record["path_reason"],
            "seconds": round(result.seconds, 2),
            "seconds_per_layer": round(result.seconds / layers, 2),
            "peak_gpu_bytes": peak,
            "peak_over_model": round(peak / size, 4),
            "output_bytes": out_bytes,
            "quantized_layers": record["layers"]["quantized_count"],
            "calibration": None
            if candidate.scheme == "FP8_DYNAMIC"
            else f"{args.samples} x {args.seq} tokens",
            "fingerprint_s": round(time.monotonic() - fp_started, 1),
        }
        | ({"offload_trace": _rounded(traced)} if traced else {}),
    )


def _rounded(trace: dict) -> dict:
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in trace.items()}


def compare(args) -> None:
    from safetensors import safe_open

    for name in ("big-fp8", "big-awq"):
        a_path = args.work / f"{name}-capped.hashes.json"
        b_path = args.work / f"{name}-uncapped.hashes.json"
        if not (a_path.exists() and b_path.exists()):
            emit(args, {"step": "compare", "run": name, "missing": True})
            continue
        a, b = json.loads(a_path.read_text()), json.loads(b_path.read_text())
        row = {
            "step": "compare",
            "run": name,
            "tensors": len(a),
            "same_names": sorted(a) == sorted(b),
            "equal_tensors": sum(a[k] == b.get(k) for k in a),
        }
        keep_a = args.work / f"{name}-capped.keep.safetensors"
        keep_b = args.work / f"{name}-uncapped.keep.safetensors"
        if keep_a.exists() and keep_b.exists():
            codes_equal = codes = 0
            worst_scale = 0.0
            with safe_open(keep_a, "pt") as fa, safe_open(keep_b, "pt") as fb:
                for key in fa.keys():
                    x, y = fa.get_tensor(key), fb.get_tensor(key)
                    if key.endswith("weight_packed"):
                        # eight int4 codes per int32
                        for shift in range(0, 32, 4):
                            cx, cy = (x >> shift) & 0xF, (y >> shift) & 0xF
                            codes_equal += int((cx == cy).sum())
                            codes += cx.numel()
                    elif key.endswith("weight_scale"):
                        rel = (x.float() - y.float()).abs() / y.float().abs().clamp_min(1e-12)
                        worst_scale = max(worst_scale, float(rel.max()))
            row |= {
                "sampled_layers": "first, middle, last",
                "int4_codes_equal_fraction": round(codes_equal / max(codes, 1), 6),
                "max_rel_scale_diff": worst_scale,
            }
        emit(args, row)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("step", choices=["moe", "gen", "run", "compare", "copies"])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--gb", type=float, default=40.0)
    parser.add_argument("--scheme", default="FP8_DYNAMIC")
    parser.add_argument("--cap", type=float, default=0.0, help="GPU cap as a fraction of model")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--small", action="store_true", help="tiny shapes, for a CPU check")
    parser.add_argument("--trace-offload", action="store_true", help="time the CPU offload cache")
    parser.add_argument(
        "--no-pin", action="store_true", help="with --trace-offload: leave the host copy pageable"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("LLM_RELEASE_HOME", str(args.work / "home"))
    steps = {"moe": moe, "gen": gen, "run": run, "compare": compare, "copies": copies}
    steps[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
