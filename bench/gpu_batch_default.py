"""Benchmark (GPU): the project's default max_num_seqs against vLLM's own default on the
seeds' workload — full-size shapes from config.json alone (``--load-format dummy``),
max_model_len 32,768, 512 prompt + 256 output tokens, GuideLLM at 10 / 50 / 100 streams.

Each setting is one server started by the project's own code (``VllmServer``: the
project's argv, the plan, the batch chooser of ``sizing/batch.py``), measured by the
project's load test (GuideLLM), then stopped:

  project-default  max_num_seqs left to the project (ServingConfig.max_num_seqs None;
                   request_tokens 768, what a release with this load profile sets)
  vllm-default     max_num_seqs 1024, vLLM's own default on a GPU of >= 70 GiB (what a
                   plain ``vllm serve`` gets; the project passes every other flag alike)
  vllm-default-moe-sibling
                   vllm-default with the fused-MoE tile config vLLM ships for the other
                   Hopper (H100 80GB <-> H200) where it ships none for this GPU and the
                   shape's experts (E, N at one GPU), given by VLLM_TUNED_CONFIG_FOLDER
                   (vLLM 0.26 has E=128,N=768 for the H200 only, E=256,N=512 for the
                   H100 only; without one the kernel runs on a generic tile config)
  start-only       the project's default started and stopped once its KV lines are
                   printed (where vLLM's own default refused to start)
  tuned            the project's tuner (``tune.tune_candidate``, coordinate search from
                   the project's start) over ``--tune-seqs`` x ``--tune-batched`` under the
                   SLO ``--ttft-slo-s`` / ``--itl-slo-ms`` at 10 / 50 / 100 streams, then its
                   choice started once more and measured as the others are (its search,
                   SLO and trials in the row's ``tune``); a choice the search measured at
                   every level from its own start is not started again (its row says
                   ``measured_in_search``)

One JSON line per setting goes to ``--jsonl`` (keys of docs/gpu-release-<date>.jsonl:
workload, model, settings, max_num_seqs, load [concurrency, output_tok_s, ttft_p95_s,
itl_p95_ms, errors], plus the KV report), and the ratio project-default / vllm-default per
level is printed once both are in the file. Runs on the device through
``scripts/gpu/device_run.sh batch ...``:

    python3 bench/gpu_batch_default.py --shape moe-full --settings project-default,vllm-default \\
        --jsonl /tmp/proof/batch.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))
sys.path.insert(0, str(ROOT))

LEVELS = [10, 50, 100]
SETTINGS = ("project-default", "vllm-default", "vllm-default-moe-sibling", "start-only", "tuned")
# Hopper siblings of one SM count (132): a tile config of one is a measured guess for the other.
MOE_SIBLINGS = {"NVIDIA_H100_80GB_HBM3": "NVIDIA_H200", "NVIDIA_H200": "NVIDIA_H100_80GB_HBM3"}
# The seeds' TTFT (3.8 s p95 on their own serving) and a decode ceiling a chat user reads at.
TTFT_SLO_S = 3.8
ITL_SLO_MS = 100.0


def serving_for(setting: str, util: float, flags: list[str]):
    from llm_release.config import ServingConfig

    seqs = 1024 if setting.startswith("vllm-default") else None
    return ServingConfig(
        max_model_len=32768,
        max_num_seqs=seqs,
        request_tokens=768,
        gpu_memory_utilization=util,
        dtype="bfloat16",
        extra_args=flags,
        startup_timeout_s=540,
    )


def seeds_load(requests: int):
    """The seeds' workload: 512 prompt + 256 output tokens at 10 / 50 / 100 streams."""
    from llm_release.config import LoadProfile

    return LoadProfile(
        concurrencies=LEVELS,
        requests_per_level=requests,
        prompt_tokens=512,
        output_tokens=256,
        max_seconds_per_level=120,
    )


def tune_config(seqs: str, batched: str, itl_slo_ms: float, max_settings: int = 6):
    """The tuner's grid for ``tuned``: '256,1024' and 'default,16384' (default: vLLM's), at
    most ``max_settings`` server starts."""
    from llm_release.config import TuneConfig

    return TuneConfig(
        enabled=True,
        strategy="coordinate",
        max_num_seqs=[int(v) for v in seqs.split(",") if v],
        max_num_batched_tokens=[
            None if v == "default" else int(v) for v in batched.split(",") if v
        ],
        itl_p95_slo_ms=itl_slo_ms,
        max_settings=max_settings,
    )


def tuned_serving(
    serving,
    model_dir: Path,
    tokenizer: Path,
    shape: str,
    run: Path,
    requests: int,
    tune,
    ttft_slo_s: float,
) -> tuple:
    """The tuner's choice for this shape (its search record beside it)."""
    from llm_release.config import Gates
    from llm_release.hardware import detect
    from llm_release.serving.tune import tune_candidate

    load = seeds_load(requests)
    return tune_candidate(
        tune,
        model_dir=model_dir,
        tokenizer_dir=tokenizer,
        served_names=[shape],
        serving=serving,
        load=load,
        gates=Gates(ttft_p95_slo_s=ttft_slo_s),
        host=detect(),
        out_dir=run / "tune",
    )


def run_setting(
    shape: str,
    setting: str,
    util: float,
    work: Path,
    requests: int,
    tune=None,
    ttft_slo_s: float = TTFT_SLO_S,
) -> dict:
    from release_proof import DUMMY_MODELS, models_for, serving_flags_for

    from llm_release.errors import ReleaseError
    from llm_release.load.loadtest import run_load_test
    from llm_release.serving.serve import Owner, VllmServer
    from llm_release.sizing.vllm_report import parse_vllm_kv_report

    tok = Path(os.environ.get("TOKENIZER_DIR", "/tmp/tok"))
    description, model_dir, tokenizer = models_for(shape, work, tok if tok.is_dir() else None)
    serving = serving_for(setting, util, serving_flags_for(shape))
    run = work / "runs" / f"batch-{shape}-{setting}-{util}"
    run.mkdir(parents=True, exist_ok=True)
    tuned = None
    if setting == "tuned":
        began = time.monotonic()
        tuned, serving = tuned_serving(
            serving, model_dir, tokenizer, shape, run, requests, tune, ttft_slo_s
        )
        tune_s = round(time.monotonic() - began, 1)
    row: dict = {
        "workload": "seeds-shape",
        "model": DUMMY_MODELS[shape][1],
        "settings": setting,
        "gpu_memory_utilization": util,
        "max_model_len": serving.max_model_len,
        "prompt_tokens": 512,
        "output_tokens": 256,
    }
    if tuned is not None:
        row["tune"] = {
            "chosen": tuned.chosen.label() if tuned.chosen else None,
            "chosen_goodput": tuned.chosen_goodput,
            "chosen_goodput_tok_s": tuned.chosen_goodput_tok_s,
            "slo": tuned.slo.model_dump(mode="json"),
            "server_starts": len(tuned.trials),
            "levels_measured": tuned.levels_measured,
            "seconds": tune_s,
        }
    searched = measured_in_search(tuned) if tuned is not None else None
    if searched is not None:
        # the choice was measured at every level from its own fresh start, as every row is:
        # that is its row (starting it once more would only add one more sample of noise)
        row["tune"]["measured_in_search"] = True
        row["max_num_seqs"] = searched.setting.max_num_seqs
        row["load"] = load_rows(searched.levels)
        row["healthy"] = True
        row["wall_s"] = round(searched.seconds, 1)
        return row
    if setting == "vllm-default-moe-sibling":
        import torch

        try:
            folder, row["moe_config"] = moe_sibling_folder(
                model_dir, work, torch.cuda.get_device_name(0).replace(" ", "_")
            )
        except ValueError as exc:
            return {**row, "healthy": False, "error": str(exc)}
        os.environ["VLLM_TUNED_CONFIG_FOLDER"] = str(folder)  # the server's env is ours
    else:
        os.environ.pop("VLLM_TUNED_CONFIG_FOLDER", None)
    server = VllmServer(
        model_dir, [shape], serving, run / "vllm.log", owner=Owner(candidate=setting)
    )
    started = time.monotonic()
    try:
        with server:
            endpoint = server.endpoint()
            row["startup_s"] = round(time.monotonic() - started, 1)
            row["max_num_seqs"] = server.serving.max_num_seqs
            report = parse_vllm_kv_report(server.log_text())
            if report is not None:
                row["kv_tokens_vllm"] = report.kv_cache_tokens
                row["max_concurrency_vllm"] = report.max_concurrency
            if setting != "start-only":
                profile = seeds_load(requests)
                result = run_load_test(
                    endpoint.base_url, endpoint.served_name, tokenizer, profile, run, max_attempts=1
                )
                row["load"] = load_rows(result.levels)
        row["healthy"] = True
    except ReleaseError as exc:
        row["healthy"] = False
        row["error"] = str(exc).splitlines()[0][:600]
        row.setdefault("max_num_seqs", server.serving.max_num_seqs)
    row["wall_s"] = round(time.monotonic() - started, 1)
    return row


def moe_sibling_folder(model_dir: Path, work: Path, device: str) -> tuple[Path, str]:
    """A VLLM_TUNED_CONFIG_FOLDER holding the sibling GPU's shipped fused-MoE config under
    this GPU's file name (vLLM's get_config_file_name: E, N at one GPU, no dtype for bf16),
    and what it holds; ValueError where vLLM ships this GPU's own or no sibling's."""
    import subprocess

    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    experts, n = config["num_experts"], config["moe_intermediate_size"]
    device = "NVIDIA_H200" if "H200" in device.split("_") else device
    sibling = MOE_SIBLINGS.get(device)
    if sibling is None:
        raise ValueError(f"no Hopper sibling known for {device}")
    python = os.environ.get("LLM_RELEASE_VLLM_PYTHON", str(ROOT / ".venv-vllm/bin/python"))
    find = "import importlib.util as u, os; print(os.path.dirname(u.find_spec('vllm').origin))"
    vllm_dir = Path(subprocess.check_output([python, "-c", find], text=True).strip())
    shipped = vllm_dir / "model_executor/layers/fused_moe/configs"
    name = f"E={experts},N={n},device_name={{}}.json"
    if (shipped / name.format(device)).exists():
        raise ValueError(f"vLLM ships {name.format(device)}: nothing to borrow")
    source = shipped / name.format(sibling)
    if not source.exists():
        raise ValueError(f"vLLM ships no {source.name} to borrow")
    folder = work / "moe-configs"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name.format(device)).write_text(source.read_text())
    return folder, f"{source.name} as {name.format(device)}"


def load_rows(levels) -> list[dict]:
    return [
        {
            "concurrency": lv.concurrency,
            "requests": lv.requests,
            "output_tok_s": round(lv.output_tokens_per_s, 1),
            "ttft_p95_s": round(lv.ttft_p95_ms / 1000, 4),
            "itl_p95_ms": round(lv.itl_p95_ms, 3),
            "errors": lv.errors,
        }
        for lv in levels
    ]


def measured_in_search(tuned):
    """The chosen setting's trial when the search measured it at every level from its own
    first start (not raced from a higher level, not a second start); else None."""
    for trial in tuned.trials:
        if (
            trial.setting == tuned.chosen
            and not trial.again
            and trial.error is None
            and [lv.concurrency for lv in trial.levels] == LEVELS
        ):
            return trial
    return None


def ratios(rows: list[dict]) -> list[str]:
    """Every other setting / vllm-default output tok/s per level, per model and
    utilization."""
    lines = []
    by = {
        (r["model"], r["gpu_memory_utilization"], r["settings"]): r for r in rows if r.get("load")
    }
    for (model, util, setting), row in by.items():
        if setting in ("vllm-default", "start-only") or (model, util, "vllm-default") not in by:
            continue
        base = {lv["concurrency"]: lv for lv in by[(model, util, "vllm-default")]["load"]}
        for lv in row["load"]:
            ref = base.get(lv["concurrency"])
            if ref and ref["output_tok_s"]:
                lines.append(
                    f"{model[:32]} u{util} c{lv['concurrency']}: {setting} "
                    f"{lv['output_tok_s']:,.0f} tok/s (max_num_seqs {row['max_num_seqs']}) / "
                    f"vllm-default {ref['output_tok_s']:,.0f} = "
                    f"{lv['output_tok_s'] / ref['output_tok_s']:.2f}x; TTFT p95 "
                    f"{lv['ttft_p95_s']:.2f} vs {ref['ttft_p95_s']:.2f} s"
                )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=["moe-full", "hybrid"], required=True)
    parser.add_argument("--settings", default="project-default,vllm-default")
    parser.add_argument("--utilization", type=float, default=0.9)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--work", type=Path, default=Path("/tmp/proof"))
    parser.add_argument("--jsonl", type=Path, required=True)
    parser.add_argument("--tune-seqs", default="100,256,1024", help="tuned: max_num_seqs grid")
    parser.add_argument("--tune-batched", default="default,16384", help="tuned: batched tokens")
    parser.add_argument(
        "--tune-max-settings", type=int, default=6, help="tuned: at most this many server starts"
    )
    parser.add_argument("--ttft-slo-s", type=float, default=TTFT_SLO_S)
    parser.add_argument("--itl-slo-ms", type=float, default=ITL_SLO_MS)
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s and s != "none"]
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; choose from {', '.join(SETTINGS)}")
    # the operator of this benchmark allows --load-format (not on the run-form allow-list)
    os.environ["LLM_RELEASE_ALLOW_SERVING_FLAGS"] = "--load-format"
    if not settings:
        print("gpu_batch_default: no settings to run (an install trip)")
        return 0
    for setting in settings:
        tune = tune_config(
            args.tune_seqs, args.tune_batched, args.itl_slo_ms, args.tune_max_settings
        )
        row = run_setting(
            args.shape, setting, args.utilization, args.work, args.requests, tune, args.ttft_slo_s
        )
        with args.jsonl.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    rows = [json.loads(line) for line in args.jsonl.read_text().splitlines() if line.strip()]
    for line in ratios(rows):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
