"""scripts/gpu/demo_rows.py: the GPU demo's rows read from what a trip brought back."""

from __future__ import annotations

import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu" / "demo_rows.py"


def _load():
    spec = importlib.util.spec_from_file_location("demo_rows", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def report(run_id: str, results: list[dict], canary: dict | None = None) -> dict:
    return {
        "run_id": run_id,
        "source": {"commit": "c" * 40},
        "config": {"rollout": {"steps": [25, 50, 100]}},
        "host": {
            "host": {"gpus": ["NVIDIA H200"]},
            "runtime": {"vllm": "0.26.0+sm90lean", "torch": "2.11.0+cu130"},
        },
        "results": results,
        "decision": {"summary": f"decided {run_id}", "winner": results[-1]["name"]},
        "stage_seconds": {"plan": 1.0, "measure": 2.0},
        "deployment": {"stable": "s"},
        "canary": canary,
    }


def measured(name: str, **extra) -> dict:
    level = {
        "concurrency": 10,
        "output_tokens_per_s": 638.45,
        "ttft_p95_ms": 142.7,
        "itl_p95_ms": 17.77,
        "errors": 0,
    }
    return {
        "name": name,
        "status": "measured",
        "stage_seconds": {"serve_start": 55.4},
        "evals": [{"eval_set": "kb", "metrics": {"numeric_match": {"value": 0.73751}}}],
        "load": {"levels": [level]},
        **extra,
    }


def pack(folder: Path, files: dict[str, str], demo_log: str, worker_log: str) -> None:
    folder.mkdir()
    with tarfile.open(folder / "demo.tgz", "w:gz") as tar:
        for name, text in {**files, ".llm-release/worker.log": worker_log}.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (folder / "demo.log").write_text(demo_log)


WORKER = (
    "11:48:23.286 | INFO | Flow run 'chocolate-chimera' - Finished in state Completed()\n"
    "11:55:01.000 | INFO | Flow run 'lazy-lynx' - Finished in state Failed('x')\n"
)
DEMO_LOG = "release wall time (after setup): 690 s\n...\nupdate wall time: 301 s\n"


def test_a_release_and_its_update_each_give_a_row_with_what_item_2_asks(tmp_path):
    canary = {
        "status": "rolled back",
        "reached_weight": 50,
        "reason": "ttft",
        "windows": [{"weight": 25, "verdict": {"verdict": "pass", "canary_requests": 40.0}}],
    }
    first = report("r1", [measured("baseline")])
    second = report(
        "r2", [measured("champion", reused_from="r1"), measured("baseline")], canary=canary
    )
    pack(
        tmp_path / "trip",
        {
            ".llm-release/demo-result.json": json.dumps({"run_id": "r1"}),
            ".llm-release/demo-update.json": json.dumps(
                {"status": "judged", "release": {"run_id": "r2"}}
            ),
            ".llm-release/runs/r1/report.json": json.dumps(first),
            ".llm-release/runs/r2/report.json": json.dumps(second),
        },
        DEMO_LOG,
        WORKER,
    )
    release, update = _load().rows(tmp_path / "trip")
    assert (release["flow"], release["wall_s"], release["prefect_state"]) == (
        "release",
        690,
        "Completed",
    )
    assert (update["flow"], update["wall_s"], update["prefect_state"]) == (
        "model-update",
        301,
        "Failed",
    )
    assert release["device"] == "NVIDIA H200" and release["vllm_version"] == "0.26.0+sm90lean"
    assert release["stages"] == {"plan": 1.0, "measure": 2.0}
    assert release["scores"] == {"baseline": {"kb/numeric_match": 0.7375}}
    assert release["load"]["baseline"] == [
        {
            "concurrency": 10,
            "output_tok_s": 638.5,
            "ttft_p95_ms": 143,
            "itl_p95_ms": 17.8,
            "errors": 0,
        }
    ]
    assert release["canary"] is None and release["decision"] == "decided r1"
    assert update["measure"]["champion"] == "reused from r1"
    assert update["canary"]["steps"] == [25, 50, 100]
    assert update["canary"]["final"] == "rolled_back" and update["canary"]["reached_weight"] == 50
    assert update["canary"]["windows"] == [
        {"weight": 25, "verdict": "pass", "canary_requests": 40.0}
    ]


def test_an_update_that_found_nothing_new_gives_no_row_and_no_log_line_gives_none(tmp_path):
    pack(
        tmp_path / "trip",
        {
            ".llm-release/demo-result.json": json.dumps({"run_id": "r1"}),
            ".llm-release/demo-update.json": json.dumps({"status": "up-to-date", "release": None}),
            ".llm-release/runs/r1/report.json": json.dumps(report("r1", [measured("baseline")])),
        },
        "the release was cut before it ended\n",
        "",
    )
    (only,) = _load().rows(tmp_path / "trip")
    assert only["flow"] == "release" and only["wall_s"] is None and only["prefect_state"] is None


def test_a_member_that_leaves_the_folder_is_refused(tmp_path):
    pack(tmp_path / "trip", {"../outside.json": "{}"}, DEMO_LOG, WORKER)
    with pytest.raises(tarfile.OutsideDestinationError):
        _load().rows(tmp_path / "trip")
    assert not (tmp_path / "outside.json").exists()
