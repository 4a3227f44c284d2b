"""The sizing matrix (issue 35): every row vLLM measured on a GPU from a shape's config.json
alone (docs/gpu-sizing-*.jsonl, scripts/gpu/device_sizing.sh) against what `llm-release plan`
gives today on a header-only stand-in of the same shape, so that a change to the planner is
checked against all of them on a CPU. Every row is held to the issue's bound: within 0.5% of
vLLM's KV tokens and maximum concurrency, never more than 0.25% above."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import sizing_matrix  # noqa: E402
from standins import write_standin  # noqa: E402

from llm_release.hub import hub_headers  # noqa: E402

TOLERANCE = 0.005  # within 0.5% of vLLM
ABOVE = 0.0025  # and never more than 0.25% above it (a promise vLLM does not keep)


def _rows() -> list[dict]:
    rows = []
    for path in sorted((ROOT / "docs").glob("gpu-sizing-*.jsonl")):
        rows += [json.loads(line) | {"file": path.name} for line in path.read_text().splitlines()]
    return rows


ROWS = _rows()


def _id(row: dict) -> str:
    s = row["settings"]
    return f"{row['model']}-{s['max_model_len']}-{s['gpu_memory_utilization']}-{s['flags']}"


def _error(row: dict) -> tuple[float, float, list[str]]:
    s = row["settings"]
    got = sizing_matrix.planner_row(
        row["model"],
        s["max_model_len"],
        s["gpu_memory_utilization"],
        s["flags"],
        row["gpu_total_bytes"],
        row["vllm_version"],
        row.get("prefix_caching_vllm"),
    )
    return (
        got["kv_tokens_planner"] / row["kv_tokens_vllm"] - 1,
        got["max_concurrency_planner"] / row["max_concurrency_vllm"] - 1,
        got["planner_notes"],
    )


def _within(error: float) -> bool:
    return -TOLERANCE <= error <= ABOVE


def test_the_rows_cover_what_the_issue_asks():
    """At least 12 rows on an H200; every family; 0.5 and 0.9; 8k and 32k; eager and graphs;
    an explicit and a default max_num_seqs; fp8 KV."""
    assert sum("H200" in r["device"] for r in ROWS) >= 12
    assert {r["family"] for r in ROWS} >= {
        "dense", "dense-fp8", "dense-w4a16", "sliding-window", "mla-moe", "moe",
        "hybrid-linear-moe",
    }  # fmt: skip
    settings = [r["settings"] for r in ROWS]
    assert {s["gpu_memory_utilization"] for s in settings} >= {0.5, 0.9}
    assert {s["max_model_len"] for s in settings} >= {8192, 32768}
    for present in (True, False):
        assert any(("--enforce-eager" in s["flags"]) is present for s in settings)
        assert any(("--max-num-seqs" in s["flags"]) is present for s in settings)
    assert any("--kv-cache-dtype fp8" in s["flags"] for s in settings)


@pytest.mark.parametrize("row", ROWS, ids=_id)
def test_the_planner_is_within_half_a_percent_of_vllm_and_not_above_it(row, home):
    tokens, concurrency, notes = _error(row)
    assert _within(tokens) and _within(concurrency), (
        f"planner against vLLM: tokens {tokens:+.3%}, concurrency {concurrency:+.3%}; {notes}"
    )


def test_a_stand_in_reads_back_as_its_table(tmp_path):
    """The header-only stand-in is what the planner reads: every tensor of the table, with the
    bytes it promises, and no disk taken for them."""
    table = json.loads((sizing_matrix.TABLES / "llama3.1-8b-w4a16.tensors.json").read_text())
    config = json.loads((sizing_matrix.SHAPES / "llama3.1-8b-w4a16" / "config.json").read_text())
    path = write_standin(config, table, tmp_path / "m")
    files = hub_headers.read_local(tmp_path / "m")
    assert set(files.tensors) == set(table)
    assert files.tensors["model.layers.0.mlp.down_proj.weight_packed"].dtype == "I32"
    promised = sum(t.nbytes for t in files.tensors.values())
    assert path.stat().st_size > promised > 5 * 2**30  # 4-bit Llama-3.1-8B: over 5 GiB
    assert path.stat().st_blocks * 512 < 2**20  # sparse
