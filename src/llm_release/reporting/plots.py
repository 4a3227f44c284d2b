"""Pictures for the release report: TTFT p95 and output tokens/s against concurrency for
every candidate, and each tuning's Pareto front (matplotlib, Agg: no display needed).

Each plot is written as a PNG into the run folder's ``plots/``; the report links them by a
relative path. matplotlib is in the ``pipeline`` extra; without it no plot is drawn and
the report says so, the rest of the report is unchanged.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from llm_release.results import CandidateResult, TuneResult

log = logging.getLogger(__name__)

DPI = 100
LOAD_SIZE = (10, 4)  # inches: 1000 × 400 px at DPI
PARETO_SIZE = (6, 4.5)  # 600 × 450 px


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: a release runs without a display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    plt = _pyplot()
    try:
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


def load_plot(results: list[CandidateResult], path: Path, ttft_slo_s: float | None = None) -> bool:
    """TTFT p95 (s) and output tokens/s against concurrency, one line per candidate with
    load levels; False when no candidate has any."""
    fig = load_figure(results, ttft_slo_s)
    if fig is None:
        return False
    _save(fig, path)
    return True


def load_figure(results: list[CandidateResult], ttft_slo_s: float | None = None):
    """The load plot's matplotlib Figure (axes: TTFT p95, output throughput), or None when
    no candidate has load levels. The caller saves and closes it."""
    measured = [r for r in results if r.load and r.load.levels]
    if not measured:
        return None
    plt = _pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ticks = sorted({lv.concurrency for r in measured for lv in r.load.levels})
    fig, (ttft, tput) = plt.subplots(1, 2, figsize=LOAD_SIZE, dpi=DPI)
    try:
        for r in measured:
            levels = sorted(r.load.levels, key=lambda lv: lv.concurrency)
            xs = [lv.concurrency for lv in levels]
            ttft.plot(xs, [lv.ttft_p95_ms / 1000 for lv in levels], marker="o", label=r.name)
            tput.plot(xs, [lv.output_tokens_per_s for lv in levels], marker="o", label=r.name)
        if ttft_slo_s:
            ttft.axhline(ttft_slo_s, color="red", linestyle="--", linewidth=1, label="SLO")
        for ax, title, unit in (
            (ttft, "TTFT p95", "seconds"),
            (tput, "Output throughput", "tokens/s"),
        ):
            ax.set_title(title)
            ax.set_xlabel("concurrency (streams)")
            ax.set_ylabel(unit)
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize="small")
    except BaseException:
        plt.close(fig)
        raise
    return fig


def pareto_plot(name: str, tuning: TuneResult, path: Path) -> bool:
    """Every measured (setting, level) of a tuning: output tokens/s against TTFT p95, the
    Pareto front joined, the chosen setting's points marked; False when nothing measured."""
    fig = pareto_figure(name, tuning)
    if fig is None:
        return False
    _save(fig, path)
    return True


def pareto_figure(name: str, tuning: TuneResult):
    """The tuning plot's matplotlib Figure, or None when nothing was measured; the caller
    saves and closes it."""
    points = [(t.setting, lv) for t in tuning.trials for lv in t.levels if lv.requests]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=PARETO_SIZE, dpi=DPI)
    try:
        ax.scatter(
            [lv.ttft_p95_ms / 1000 for _, lv in points],
            [lv.output_tokens_per_s for _, lv in points],
            color="grey",
            alpha=0.6,
            label="measured (setting, level)",
        )
        front = tuning.pareto()
        ax.plot(
            [lv.ttft_p95_ms / 1000 for _, lv in front],
            [lv.output_tokens_per_s for _, lv in front],
            color="tab:blue",
            marker="o",
            label="Pareto front",
        )
        chosen = [lv for s, lv in points if s == tuning.chosen]
        if chosen:
            ax.scatter(
                [lv.ttft_p95_ms / 1000 for lv in chosen],
                [lv.output_tokens_per_s for lv in chosen],
                color="tab:green",
                marker="*",
                s=160,
                zorder=3,
                label=f"chosen: {tuning.chosen.label()}",
            )
        ax.axvline(tuning.slo.ttft_p95_ms / 1000, color="red", linestyle="--", linewidth=1)
        ax.set_title(f"{name}: tuning ({tuning.strategy}, {len(tuning.trials)} settings)")
        ax.set_xlabel("TTFT p95 (s)")
        ax.set_ylabel("output tokens/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    except BaseException:
        plt.close(fig)
        raise
    return fig


def write_plots(
    run_dir: Path, results: list[CandidateResult], ttft_slo_s: float | None = None
) -> dict[str, Path]:
    """The run's plots under ``run_dir/plots``: {caption: path}. Empty without matplotlib
    (logged) or without anything measured."""
    try:
        _pyplot()
    except ImportError:
        log.warning("matplotlib is not installed: the report has no plots (pip install matplotlib)")
        return {}
    out: dict[str, Path] = {}
    folder = Path(run_dir) / "plots"
    path = folder / "load.png"
    if load_plot(results, path, ttft_slo_s):
        out["TTFT p95 and output tokens/s against concurrency"] = path
    for r in results:
        if r.tuning is None:
            continue
        path = folder / f"tune-{re.sub(r'[^a-z0-9_-]+', '_', r.name.lower())}.png"
        if pareto_plot(r.name, r.tuning, path):
            out[f"{r.name}: tuning Pareto front (TTFT p95 vs output tokens/s)"] = path
    return out
