"""Benchmark: the coordinate search with the failure's directions (``Tuner.directions``)
against the same search stepping both ways along every dimension, replayed on a grid
measured whole: a results file of ``bench/tune_goodput.py`` with its exhaustive run, under
the SLO it was measured with or another (``--ttft-slo-s``, ``--itl-slo-ms``).

Each setting's levels are the exhaustive sweep's own measurements of it, so both searches
see the same figures and differ only in which settings they start; a start costs far more
than a level (on one H100 103-191 s against ~10 s; on 2 CPU cores 25-90 s against 10-40 s),
so the ratio that matters is starts. Printed: each search's choice, its goodput and output
tokens/s, starts and levels, the steps it left out and why; then the ratios: starts and
levels with directions / without (the reference, replayed in the same run), and the goodput
of each choice / the grid's best under that SLO.

    .venv/bin/python bench/tune_replay.py RESULTS.json [--ttft-slo-s S] [--itl-slo-ms MS]
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tabulate import tabulate  # noqa: E402

from llm_release.load.loadtest import goodput  # noqa: E402
from llm_release.results import LoadLevel, Setting, Slo, TuneResult  # noqa: E402
from llm_release.serving.tune import DIMENSIONS, Grid, Tuner  # noqa: E402


def measured(results: dict) -> tuple[dict[Setting, dict[int, LoadLevel]], dict]:
    """Every setting the exhaustive run measured → its levels by concurrency, and that run."""
    runs = results.get("runs", {})
    if "exhaustive" not in runs:
        raise SystemExit(
            "no exhaustive run in the results file: run bench/tune_goodput.py with "
            "--strategies exhaustive first"
        )
    full = runs["exhaustive"]["result"]
    surface: dict[Setting, dict[int, LoadLevel]] = {}
    for trial in full["trials"]:
        if trial.get("again") or trial.get("error"):
            continue
        levels = [LoadLevel.model_validate(lv) for lv in trial["levels"]]
        surface[Setting.model_validate(trial["setting"])] = {lv.concurrency: lv for lv in levels}
    if not surface:
        raise SystemExit("the exhaustive run measured no setting: nothing to replay")
    return surface, full


def grid_of(surface: dict[Setting, dict[int, LoadLevel]]) -> Grid:
    values = {d: sorted({getattr(s, d) for s in surface}, key=repr) for d in DIMENSIONS}
    return Grid(**values)


def replay(
    surface: dict[Setting, dict[int, LoadLevel]],
    levels: list[int],
    slo: Slo,
    step_tokens: int,
    *,
    directed: bool,
) -> TuneResult:
    """The coordinate search from the top level (the planner's start on a CPU), each start
    answered from ``surface``; a level the sweep did not measure fails the setting."""

    @contextmanager
    def session(setting: Setting):
        def probe(c: int) -> LoadLevel:
            if c not in surface[setting]:
                raise RuntimeError(f"{setting.label()} was not measured at {c} streams")
            return surface[setting][c]

        yield probe

    grid = grid_of(surface)
    tuner = Tuner(
        grid,
        levels,
        slo,
        session,
        lambda s: None if s in surface else "not measured in the sweep",
        step_tokens=step_tokens,
        warmed_up=True,
        directed=directed,
    )
    first = next(iter(surface))
    start = first.model_copy(
        update={"max_num_seqs": max(levels), "max_num_batched_tokens": None, "speculation": None}
    )
    return tuner.coordinate(start)


def grid_best(surface: dict[Setting, dict[int, LoadLevel]], slo: Slo) -> tuple[int, float]:
    found = [goodput(list(levels.values()), slo) for levels in surface.values()]
    best = max(found, key=lambda g: (g.concurrency, g.output_tokens_per_s))
    return best.concurrency, best.output_tokens_per_s


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results file of bench/tune_goodput.py")
    parser.add_argument("--ttft-slo-s", type=float, help="default: the file's")
    parser.add_argument("--itl-slo-ms", type=float, help="default: the file's")
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    surface, full = measured(results)
    slo = Slo.model_validate(full["slo"])
    if args.ttft_slo_s is not None:
        slo = slo.model_copy(update={"ttft_p95_ms": args.ttft_slo_s * 1000})
    if args.itl_slo_ms is not None:
        slo = slo.model_copy(update={"itl_p95_ms": args.itl_slo_ms})
    load = results.get("load", {})
    step_tokens = load.get("prompt_tokens", 0) + load.get("output_tokens", 0)
    levels = sorted(full["levels"])
    searches = {
        name: replay(surface, levels, slo, step_tokens, directed=directed)
        for name, directed in (("with directions", True), ("both ways", False))
    }
    best_c, best_tok_s = grid_best(surface, slo)
    print(
        f"{args.results.name}: {len(surface)} settings x levels {levels}; SLO TTFT p95 "
        f"{slo.ttft_p95_ms:.0f} ms, ITL p95 {slo.itl_p95_ms:.0f} ms; the grid's best: "
        f"goodput {best_c} ({best_tok_s:.1f} output tok/s)"
    )
    rows = [
        (
            name,
            r.chosen.label() if r.chosen else None,
            r.chosen_goodput,
            r.chosen_goodput_tok_s,
            len(r.trials),
            r.levels_measured,
        )
        for name, r in searches.items()
    ]
    print(
        tabulate(
            rows,
            headers=["search", "chosen", "goodput", "output tok/s", "starts", "levels"],
            floatfmt=".1f",
        )
    )
    for note in searches["with directions"].skipped:
        print(f"  left out: {note}")
    directed, both = searches["with directions"], searches["both ways"]
    ratios = {
        "ratio_starts": round(len(directed.trials) / len(both.trials), 3),
        "ratio_levels": round(directed.levels_measured / max(both.levels_measured, 1), 3),
        "ratio_goodput_directed": round(directed.chosen_goodput / best_c, 3) if best_c else 0.0,
        "ratio_goodput_both": round(both.chosen_goodput / best_c, 3) if best_c else 0.0,
    }
    print(
        f"goodput / the grid's best: {ratios['ratio_goodput_directed']:.3f} with directions, "
        f"{ratios['ratio_goodput_both']:.3f} both ways"
    )
    print(
        f"starts with directions / both ways: {ratios['ratio_starts']:.3f} "
        f"(levels {ratios['ratio_levels']:.3f})"
    )
    return ratios


if __name__ == "__main__":
    main()
