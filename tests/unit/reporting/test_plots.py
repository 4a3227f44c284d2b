"""The report's plots: real PNGs from LoadResult-shaped data, linked from the markdown."""

from __future__ import annotations

import struct

from llm_release.reporting.plots import load_figure, pareto_figure, write_plots
from llm_release.reporting.report import tuning_section, with_plots
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


def tuning_and_results() -> tuple[TuneResult, list[CandidateResult]]:
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
    return tuning, results


def lines_by_label(ax) -> dict[str, tuple[list[float], list[float]]]:
    return {
        line.get_label(): (
            [float(x) for x in line.get_xdata()],
            [float(y) for y in line.get_ydata()],
        )
        for line in ax.get_lines()
    }


def test_the_load_plot_draws_each_candidates_measured_levels_and_the_slo() -> None:
    import matplotlib.pyplot as plt

    _, results = tuning_and_results()
    fig = load_figure(results, ttft_slo_s=3.0)
    try:
        ttft, tput = fig.axes
        drawn_ttft, drawn_tput = lines_by_label(ttft), lines_by_label(tput)
        # One line per measured candidate (the skipped one has none), plus the SLO.
        assert set(drawn_ttft) == {"baseline", "fp8-dynamic", "SLO"}
        assert set(drawn_tput) == {"baseline", "fp8-dynamic"}
        for r in results[:2]:
            xs = [float(lv.concurrency) for lv in r.load.levels]
            assert drawn_ttft[r.name] == (xs, [lv.ttft_p95_ms / 1000 for lv in r.load.levels])
            assert drawn_tput[r.name] == (xs, [lv.output_tokens_per_s for lv in r.load.levels])
        # fp8 at 3x slowdown: TTFT p95 at concurrency 8 is 12 s, a third of the throughput.
        assert drawn_ttft["fp8-dynamic"][1] == [1.5, 6.0, 12.0]
        assert drawn_tput["fp8-dynamic"][1] == [20 / 3, 80 / 3, 160 / 3]
        assert drawn_ttft["SLO"][1] == [3.0, 3.0]
        assert [float(t) for t in ttft.get_xticks()] == [1.0, 4.0, 8.0]
        assert (ttft.get_title(), tput.get_title()) == ("TTFT p95", "Output throughput")
    finally:
        plt.close(fig)
    assert load_figure([results[2]]) is None


def test_the_tuning_plot_draws_every_measured_point_the_front_and_the_choice() -> None:
    import matplotlib.pyplot as plt

    tuning, _ = tuning_and_results()
    fig = pareto_figure("baseline", tuning)
    try:
        (ax,) = fig.axes
        measured, chosen = (c.get_offsets().tolist() for c in ax.collections)
        points = [
            [lv.ttft_p95_ms / 1000, lv.output_tokens_per_s]
            for t in tuning.trials
            for lv in t.levels
        ]
        assert measured == points  # 3 levels of the chosen setting, 1 of the other
        assert chosen == points[:3]
        front = lines_by_label(ax)["Pareto front"]
        assert front == (
            [lv.ttft_p95_ms / 1000 for _, lv in tuning.pareto()],
            [lv.output_tokens_per_s for _, lv in tuning.pareto()],
        )
        slo = [line for line in ax.get_lines() if line.get_label() != "Pareto front"]
        assert [float(x) for x in slo[0].get_xdata()] == [3.0, 3.0]
    finally:
        plt.close(fig)


def test_the_saved_png_is_the_drawn_figure(tmp_path) -> None:
    import matplotlib.image as mpimg
    import matplotlib.pyplot as plt
    import numpy as np

    _, results = tuning_and_results()
    plots = write_plots(tmp_path, results, ttft_slo_s=3.0)
    saved = mpimg.imread(plots["TTFT p95 and output tokens/s against concurrency"])
    fig = load_figure(results, ttft_slo_s=3.0)
    try:
        fig.tight_layout()
        fig.canvas.draw()
        drawn = np.asarray(fig.canvas.buffer_rgba(), dtype=np.float32) / 255
    finally:
        plt.close(fig)
    assert saved.shape == drawn.shape == (400, 1000, 4)
    assert np.abs(saved - drawn).max() < 1 / 255 + 1e-6


def test_load_and_pareto_plots_are_pngs_linked_from_the_report(tmp_path) -> None:
    tuning, results = tuning_and_results()
    chosen = tuning.chosen
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
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in tuning_section(results)
        if line.startswith("| baseline ")
    ]
    assert rows[0][:6] == ["baseline", "seqs=8 batched=default prefix=on", "4", "80.0", "2", "4"]


def test_no_measured_levels_no_plot(tmp_path) -> None:
    results = [CandidateResult(name="a", scheme="x", status="failed")]
    assert write_plots(tmp_path, results) == {}
    assert not (tmp_path / "plots").exists()
