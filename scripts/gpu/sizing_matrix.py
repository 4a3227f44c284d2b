"""The sizing matrix: vLLM's KV figures from device_sizing.sh next to the planner's, one JSON
line a row in docs/gpu-sizing-<date>.jsonl.

    .venv/bin/python scripts/gpu/sizing_matrix.py RESULTS_DIR docs/gpu-sizing-DATE.jsonl

RESULTS_DIR is what device_sizing.sh wrote ($OUT): sizing.jsonl, one log per row and
device.json (the card's memory as torch reads it). The planner side is the project's own
``llm-release plan`` command on a header-only stand-in of the shape
(scripts/gpu/standins.py, its tensor table under tests/unit/data/gpu/shapes/), with the row's
serving flags that are plan options and ``--vllm-version`` the served one; every other flag
(``--language-model-only``...) changes no memory the planner models and is left out.
tests/unit/sizing/test_sizing_matrix.py runs the same ``planner_row`` for every committed row.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "scripts" / "gpu" / "shapes"
TABLES = ROOT / "tests" / "unit" / "data" / "gpu" / "shapes"
GiB = 2**30
# plan options that take a value / that are switches, as `llm-release plan` spells them
PLAN_VALUE_FLAGS = {"--max-num-seqs", "--kv-cache-dtype", "--max-num-batched-tokens", "--dtype"}
PLAN_SWITCHES = {
    "--enforce-eager",
    "--no-enable-prefix-caching",
    "--enable-prefix-caching",
    "--language-model-only",
}


def family(config: dict) -> str:
    """The attention family a shape stands for (the matrix's coverage, not the planner's)."""
    text = config.get("text_config", config)
    if "quantization_config" in config:
        bits = config["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"]
        return "dense-fp8" if bits == 8 else "dense-w4a16"
    if text.get("kv_lora_rank"):
        return "mla-moe"
    if text.get("linear_num_value_heads") or text.get("layer_types", [""])[0] == "linear_attention":
        return "hybrid-linear-moe"
    if any(t == "sliding_attention" for t in text.get("layer_types", [])):
        return "sliding-window"
    if text.get("num_experts") or text.get("n_routed_experts"):
        return "moe"
    return "dense"


def plan_args(flags: str) -> list[str]:
    """The row's vLLM flags that are also `llm-release plan` options."""
    words, out = shlex.split(flags), []
    for i, word in enumerate(words):
        if word in PLAN_VALUE_FLAGS:
            out += [word, words[i + 1]]
        elif word in PLAN_SWITCHES:
            out.append(word)
    return out


def planner_row(
    shape: str,
    max_model_len: int,
    utilization: float,
    flags: str,
    gpu_bytes: int,
    version: str,
    prefix_caching: bool | None = None,
) -> dict:
    """The planner's KV tokens and maximum concurrency for one row, through the CLI.
    ``prefix_caching``: what vLLM's engine config said it used (a row's flags may leave it to
    vLLM's default, which vLLM 0.26 turns off for hybrid models), passed to the plan as the
    project's server passes it to vLLM; None leaves the plan's default."""
    sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
    from standins import write_standin

    from llm_release import cli

    config = json.loads((SHAPES / shape / "config.json").read_text())
    table = json.loads((TABLES / f"{shape}.tensors.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / shape
        write_standin(config, table, folder)
        argv = ["plan", str(folder), "--gpus", "1", "--json"]
        argv += ["--gpu-memory-gib", repr(gpu_bytes / GiB), "--max-model-len", str(max_model_len)]
        argv += ["--gpu-memory-utilization", str(utilization), "--vllm-version", version]
        argv += plan_args(flags)
        if prefix_caching is not None and "prefix-caching" not in flags:
            argv.append(
                "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"
            )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cli.main(argv)
    plan = json.loads(out.getvalue())
    (option,) = plan["options"]
    return {
        "kv_tokens_planner": option["kv_cache_tokens"],
        "max_concurrency_planner": round(option["max_concurrency"], 2),
        "planner_notes": plan["notes"],
    }


def build(results: Path) -> list[dict]:
    from llm_release.sizing.vllm_report import parse_vllm_kv_report

    device = json.loads((results / "device.json").read_text())
    rows = []
    for line in (results / "sizing.jsonl").read_text().splitlines():
        got = json.loads(line)
        log = (results / f"{got['row']}.log").read_text(errors="replace")
        report = parse_vllm_kv_report(log)
        if report is None:
            print(f"{got['row']}: no KV report (see its log)", file=sys.stderr)
            continue
        version = (report.vllm_version or "").split("+")[0]
        config = json.loads((SHAPES / got["shape"] / "config.json").read_text())
        prefix = re.search(r"enable_prefix_caching=(True|False)", log)
        row = {
            "model": got["shape"],
            "family": family(config),
            "settings": {
                "max_model_len": got["max_model_len"],
                "gpu_memory_utilization": got["gpu_memory_utilization"],
                "flags": got["flags"],
            },
            "device": device["name"],
            "gpu_total_bytes": device["total_memory"],
            "vllm_version": version,
            "kv_tokens_vllm": report.kv_cache_tokens,
            "max_concurrency_vllm": report.max_concurrency,
            "kv_memory_gib_vllm": report.kv_memory_gib,
            "weights_gib_vllm": report.weights_gib,
            "profile_vllm": report.profile.model_dump() if report.profile else None,
            "prefix_caching_vllm": prefix.group(1) == "True" if prefix else None,
            "log": f"{got['row']}.log",
        }
        row |= planner_row(
            got["shape"],
            got["max_model_len"],
            got["gpu_memory_utilization"],
            got["flags"],
            device["total_memory"],
            version,
            row["prefix_caching_vllm"],
        )
        row["tokens_error"] = round(row["kv_tokens_planner"] / row["kv_tokens_vllm"] - 1, 5)
        row["concurrency_error"] = round(
            row["max_concurrency_planner"] / row["max_concurrency_vllm"] - 1, 5
        )
        rows.append(row)
    return rows


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    rows = build(Path(argv[0]))
    Path(argv[1]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for r in rows:
        print(
            f"{r['model']:<22} {r['settings']['max_model_len']:>6} "
            f"{r['settings']['gpu_memory_utilization']:<4} {r['settings']['flags'][:40]:<40} "
            f"vLLM {r['kv_tokens_vllm']:>9,} planner {r['kv_tokens_planner']:>9,} "
            f"{r['tokens_error']:+.2%}  conc {r['concurrency_error']:+.2%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
