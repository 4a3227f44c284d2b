"""The rows of docs/gpu-release-<date>.jsonl (issue 34, item 2) from what a GPU demo brought
back: ``device_demo.sh``'s ``demo.tgz`` (the runs' report.json, the worker's log), its
``demo.log`` (make demo's own output: the wall times) and ``steps.log`` (setup).

    python scripts/gpu/demo_rows.py FOLDER [--date 2026-12-07] [--note TEXT] >> docs/...jsonl

FOLDER holds demo.tgz (unpacked here into FOLDER/unpacked), demo.log and steps.log, as a trip
of device_demo.sh leaves them under its files_at. One row per run that has a report: the
release (demo-result.json) and the model-update (demo-update.json), each with the fields
item 2 asks for (flow, device, vllm_version, wall_s, stages, decision, canary with its steps
and final, prefect_state) and the per-contender figures the earlier rows carry. Figures are
read, never made up: a field the folder does not tell is null.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

FLOWS = (("release", "demo-result.json"), ("model-update", "demo-update.json"))
WALL = {
    "release": r"release wall time \(after setup\): (\d+) s",
    "model-update": r"update wall time: (\d+) s",
}


def unpacked(folder: Path) -> Path:
    """demo.tgz's .llm-release, unpacked once (members checked: no path leaves the folder)."""
    target = folder / "unpacked"
    if not target.exists():
        with tarfile.open(folder / "demo.tgz") as tar:
            tar.extractall(target, filter="data")
    return target / ".llm-release"


def flow_states(worker_log: str) -> list[tuple[str, str]]:
    """Each flow run's final state as the worker logged it, in order: (run name, state)."""
    found = re.findall(r"Flow run '([^']+)' - Finished in state (\w+)\(", worker_log)
    return [(name, state) for name, state in found]


def load_rows(result: dict) -> list[dict]:
    levels = (result.get("load") or {}).get("levels") or []
    return [
        {
            "concurrency": lv["concurrency"],
            "output_tok_s": round(lv["output_tokens_per_s"], 1),
            "ttft_p95_ms": round(lv["ttft_p95_ms"]),
            "itl_p95_ms": round(lv["itl_p95_ms"], 1),
            "errors": lv["errors"],
        }
        for lv in levels
    ]


def canary_of(report: dict) -> dict | None:
    canary = report.get("canary")
    if not canary:
        return None
    return {
        "steps": report["config"]["rollout"]["steps"],
        "windows": [
            {
                "weight": w["weight"],
                "verdict": (w.get("verdict") or {}).get("verdict"),
                "canary_requests": (w.get("verdict") or {}).get("canary_requests"),
            }
            for w in canary.get("windows", [])
        ],
        # item 2's words: "promoted" or "rolled_back" (the rollout says "rolled back")
        "final": canary["status"].replace(" ", "_"),
        "reached_weight": canary.get("reached_weight"),
        "reason": canary.get("reason"),
    }


def row(flow: str, report: dict, demo_log: str, state: str | None) -> dict:
    host = report["host"]
    wall = re.search(WALL[flow], demo_log)
    results = report["results"]
    return {
        "flow": flow,
        "run_id": report["run_id"],
        "commit": report["source"]["commit"],
        "device": ", ".join(host["host"].get("gpus") or []) or None,
        "vllm_version": host["runtime"]["vllm"],
        "torch": host["runtime"].get("torch"),
        "wall_s": int(wall.group(1)) if wall else None,
        "stages": report["stage_seconds"],
        "measure": {
            r["name"]: (
                f"reused from {r['reused_from']}"
                if r.get("reused_from")
                else r.get("stage_seconds")
            )
            for r in results
        },
        "status": {r["name"]: r["status"] for r in results},
        "scores": {
            r["name"]: {
                f"{e['eval_set']}/{m}": round(v["value"], 4)
                for e in r.get("evals", [])
                for m, v in (e.get("metrics") or {}).items()
            }
            for r in results
            if r.get("evals")
        },
        "load": {r["name"]: load_rows(r) for r in results if load_rows(r)},
        "decision": report["decision"]["summary"],
        "winner": report["decision"].get("winner"),
        "deployment": report.get("deployment"),
        "canary": canary_of(report),
        "prefect_state": state,
    }


def rows(folder: Path) -> list[dict]:
    home = unpacked(folder)
    demo_log = (folder / "demo.log").read_text(errors="replace")
    worker = home / "worker.log"
    states = flow_states(worker.read_text(errors="replace")) if worker.exists() else []
    out = []
    for index, (flow, outcome) in enumerate(FLOWS):
        path = home / outcome
        if not path.exists():
            continue
        outcome_json = json.loads(path.read_text())
        run = outcome_json.get("release", outcome_json) or {}
        run_id = run.get("run_id")
        if not run_id:  # an update that found nothing new: no run of its own
            continue
        report = json.loads((home / "runs" / run_id / "report.json").read_text())
        state = states[index][1] if index < len(states) else None
        out.append(row(flow, report, demo_log, state))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--date")
    parser.add_argument("--note")
    args = parser.parse_args(argv)
    for found in rows(args.folder):
        extra = {k: v for k, v in (("date", args.date), ("note", args.note)) if v}
        print(json.dumps(extra | found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
