"""The report's plots: real PNGs from LoadResult-shaped data, linked from the markdown."""

from __future__ import annotations

import struct

from llm_release.plots import write_plots
from llm_release.report import tuning_section, with_plots
from llm_release.results import (
    CandidateResult,
    LoadLevel,
    LoadResult,
    Setting,
    Slo,
    Trial,
    TuneResult,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def levels(slowdown: float) -> list[LoadLevel]:
    return [
        LoadLevel(
            concurrency=c,
            requests=8,
            requests_planned=8,
            errors=0,
            error_rate=0.0,
            ttft_p50_ms=300 * c * slowdown,
            ttft_p95_ms=500 * c * slowdown,
            itl_p50_ms=30,
            itl_p95_ms=45,
            output_tokens_per_s=20 * c / slowdown,
            requests_per_s=0.6 * c / slowdown,
        )
        for c in (1, 4, 8)
    ]


def test_load_and_pareto_plots_are_pngs_linked_from_the_report(tmp_path) -> None:
    chosen = Setting(max_num_seqs=8)
    tuning = TuneResult(
        strategy="coordinate",
        slo=Slo(ttft_p95_ms=3000, itl_p95_ms=250, max_error_rate=0.01),
        levels=[1, 4, 8],
        chosen=chosen,
        chosen_goodput=4,
        chosen_goodput_tok_s=80.0,
        trials=[
            Trial(setting=chosen, levels=levels(1.0), goodput=4, goodput_tok_s=80.0, seconds=90),
            Trial(setting=Setting(max_num_seqs=4), levels=levels(1.5)[1:2], below=4, seconds=80),
        ],
        grid_size=4,
        seconds=170,
        levels_measured=4,
    )
    results = [
        CandidateResult(
            name="baseline",
            scheme="bf16",
            status="measured",
            tuning=tuning,
            load=LoadResult(levels=levels(1.0)),
        ),
        CandidateResult(
            name="fp8-dynamic",
            scheme="FP8_DYNAMIC",
            status="measured",
            load=LoadResult(levels=levels(3.0)),
        ),
        CandidateResult(name="w4a16", scheme="W4A16_AWQ", status="skipped"),
    ]
    plots = write_plots(tmp_path, results, ttft_slo_s=3.0)
    assert len(plots) == 2
    load_png, tune_png = plots.values()
    assert load_png == tmp_path / "plots" / "load.png"
    assert png_size(load_png.read_bytes()) == (1000, 400)
    assert png_size(tune_png.read_bytes()) == (600, 450)
    # the front keeps only points no other beats on both throughput and TTFT
    front = tuning.pareto()
    assert front and all(s == chosen for s, _ in front)

    markdown = with_plots("# r\n\n## Load test\n\n## Rule\n\nx\n", plots, tmp_path)
    assert "](plots/load.png)" in markdown and "](plots/tune-baseline.png)" in markdown
    assert markdown.index("## Plots") < markdown.index("## Rule")
    section = "\n".join(tuning_section(results))
    assert "| baseline | seqs=8 batched=default prefix=on | 4 | 80.0 | 2 | 4 |" in section


def test_no_measured_levels_no_plot(tmp_path) -> None:
    results = [CandidateResult(name="a", scheme="x", status="failed")]
    assert write_plots(tmp_path, results) == {}
    assert not (tmp_path / "plots").exists()
