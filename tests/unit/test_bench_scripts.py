"""Every benchmark under bench/ still imports against the package it measures (a renamed
function broke canary_reliability.py unseen), and says how to run it."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRIPTS = sorted(p for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_the_scan_sees_the_benchmarks():
    assert {"side_by_side.py", "canary_reliability.py", "tune_goodput.py"} <= {
        p.name for p in SCRIPTS
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_a_benchmark_imports_and_has_a_main(script, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{script.name} has no main()"
    assert module.__doc__ and ".py" in module.__doc__, f"{script.name} says not how to run it"


def _load(name: str, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_seeds_shape_benchs_tuned_setting_is_the_tuners_grid_and_its_ratio(monkeypatch):
    bench = _load("gpu_batch_default", monkeypatch)
    tune = bench.tune_config("100,256,1024", "default,16384", 100.0)
    assert tune.enabled and tune.strategy == "coordinate"
    assert tune.max_num_seqs == [100, 256, 1024] and tune.max_num_batched_tokens == [None, 16384]
    assert tune.itl_p95_slo_ms == 100.0
    level = {"concurrency": 100, "ttft_p95_s": 1.0}
    rows = [
        {
            "model": "m",
            "gpu_memory_utilization": 0.9,
            "settings": name,
            "max_num_seqs": seqs,
            "load": [level | {"output_tok_s": tok_s}],
        }
        for name, seqs, tok_s in (
            ("vllm-default", 1024, 4000.0),
            ("project-default", 416, 3900.0),
            ("tuned", 256, 4600.0),
        )
    ]
    lines = bench.ratios(rows)
    assert any(
        "c100: tuned 4,600 tok/s (max_num_seqs 256) / vllm-default 4,000 = 1.15x" in line
        for line in lines
    ), lines
    assert any("c100: project-default 3,900" in line and "= 0.97x" in line for line in lines), lines


def test_the_tuners_choice_is_started_again_only_when_the_search_raced_it(monkeypatch):
    from llm_release.results import LoadLevel, Setting, Trial, TuneResult

    bench = _load("gpu_batch_default", monkeypatch)

    def level(c):
        return LoadLevel(
            concurrency=c,
            requests=100,
            errors=0,
            error_rate=0,
            ttft_p50_ms=1,
            ttft_p95_ms=900,
            itl_p50_ms=9,
            itl_p95_ms=20,
            output_tokens_per_s=10.0 * c,
            requests_per_s=1,
        )

    start, other = (
        Setting(max_num_seqs=100),
        Setting(max_num_seqs=100, max_num_batched_tokens=16384),
    )
    full = Trial(setting=start, levels=[level(c) for c in (10, 50, 100)])
    raced = Trial(setting=other, levels=[level(50), level(100)])

    def result(chosen, *trials):
        return TuneResult(
            strategy="coordinate",
            slo={"ttft_p95_ms": 3800, "itl_p95_ms": 100, "max_error_rate": 0.01},
            levels=[10, 50, 100],
            chosen=chosen,
            trials=list(trials),
            grid_size=2,
            seconds=1.0,
            levels_measured=5,
        )

    assert bench.measured_in_search(result(start, full, raced)) is full
    assert bench.measured_in_search(result(other, full, raced)) is None  # raced: started again
    again = full.model_copy(update={"again": True})
    assert bench.measured_in_search(result(start, again)) is None
    rows = bench.load_rows(full.levels)
    assert rows[-1] == {
        "concurrency": 100,
        "requests": 100,
        "output_tok_s": 1000.0,
        "ttft_p95_s": 0.9,
        "itl_p95_ms": 20.0,
        "errors": 0,
    }


def test_the_tune_benchs_lever_flags_reach_the_grid_and_the_load(monkeypatch):
    bench = _load("tune_goodput", monkeypatch)
    args = bench.parse_args(
        [
            "--prefix-caching",
            "on,off",
            "--speculation",
            "none,ngram:3:4,mtp:1",
            "--shared-prefix",
            "1024:0.9:4",
        ]
    )
    tune = bench.tune_config(args, "exhaustive")
    assert sorted(tune.enable_prefix_caching) == [False, True]
    labels = [s.label() for s in tune.speculation if s]
    assert labels == ["ngram:3/4", "mtp:1"]
    serving, load, _ = bench.setup(args, bench.detect())
    assert load.shared_prefix.tokens == 1024 and load.shared_prefix.distinct == 4
    # vLLM's defaults stay one point: caching on, no speculation
    defaults = bench.tune_config(args, "defaults")
    assert defaults.enable_prefix_caching == [True]
    assert not [s for s in defaults.speculation if s]


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--speculation", "ngram:x"),
        ("--speculation", "eagle:2"),
        ("--speculation", "ngram:3:4:5"),
        ("--prefix-caching", "maybe"),
        ("--shared-prefix", "1024:0.9"),
        ("--shared-prefix", "1024:2:4"),
    ],
)
def test_the_tune_bench_refuses_a_malformed_lever_in_one_line(monkeypatch, capsys, flag, value):
    bench = _load("tune_goodput", monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        bench.parse_args([flag, value])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_tune_bench_prints_each_trials_levels_with_hits_and_the_answer_check(monkeypatch):
    bench = _load("tune_goodput", monkeypatch)
    level = {
        "concurrency": 10,
        "ttft_p95_ms": 40.0,
        "itl_p95_ms": 9.0,
        "output_tokens_per_s": 800.0,
        "prefix_cache_hit_rate": 0.62,
    }
    result = {
        "trials": [
            {
                "setting": {
                    "max_num_seqs": 256,
                    "max_num_batched_tokens": 2048,
                    "enable_prefix_caching": True,
                    "speculation": None,
                },
                "levels": [level],
                "goodput": 10,
                "again": False,
                "answers_changed": None,
                "error": None,
            },
            {
                "setting": {
                    "max_num_seqs": 256,
                    "enable_prefix_caching": False,
                    "speculation": {"method": "ngram", "num_speculative_tokens": 3},
                },
                "levels": [level | {"prefix_cache_hit_rate": None}],
                "goodput": 10,
                "again": False,
                "answers_changed": "2 of 6 greedy answers differ",
                "error": None,
            },
        ]
    }
    rows = bench.trial_rows(result)
    assert rows[0][0] == "seqs=256 batched=2048 prefix=on" and rows[0][5] == "62%"
    assert rows[0][7] == ""
    assert rows[1][0] == "seqs=256 batched=default prefix=off spec=ngram:3" and rows[1][5] == "—"
    assert rows[1][7] == "2 of 6 greedy answers differ"


def test_the_demo_graphs_bench_compares_each_mode_with_the_first_and_refuses_an_unknown_one(
    monkeypatch, capsys
):
    bench = _load("gpu_demo_graphs", monkeypatch)
    rows = [
        {"mode": "eager", "healthy": True, "start_s": 55, "total_s": 200.0},
        {"mode": "graphs", "healthy": True, "start_s": 95, "total_s": 150.0},
        {"mode": "graphs", "healthy": False, "error": "vLLM exited", "total_s": 30.0},
    ]
    lines = bench.summary(rows)
    assert "total / eager" in lines[0]
    assert "| 0.75x" in lines[3] and "| 1.00x" in lines[2], lines
    assert "vLLM exited" in lines[4]
    with pytest.raises(SystemExit):
        bench.main(["--modes", "eager,compiled"])
    assert "--modes: choose from eager, graphs" in capsys.readouterr().err


def _swept(figures) -> dict:
    """A tune_goodput results file whose exhaustive run measured a 3 x 3 grid at 50 / 100 /
    200 streams, each level's TTFT and ITL p95 from ``figures(seqs, budget, streams)``."""
    from llm_release.results import LoadLevel, Setting

    trials = []
    for seqs in (64, 128, 1024):
        for budget in (1024, 2048, None):
            levels = []
            for c in (50, 100, 200):
                ttft, itl = figures(seqs, budget or 8192, c)
                levels.append(
                    LoadLevel(
                        concurrency=c,
                        requests=100,
                        errors=0,
                        error_rate=0.0,
                        ttft_p50_ms=ttft,
                        ttft_p95_ms=ttft,
                        itl_p50_ms=itl,
                        itl_p95_ms=itl,
                        output_tokens_per_s=c * 10.0,
                        requests_per_s=c / 10,
                    ).model_dump(mode="json")
                )
            setting = Setting(max_num_seqs=seqs, max_num_batched_tokens=budget)
            trials.append({"setting": setting.model_dump(mode="json"), "levels": levels})
    slo = {"ttft_p95_ms": 1000.0, "itl_p95_ms": 10.0, "max_error_rate": 0.01}
    return {
        "load": {"prompt_tokens": 512, "output_tokens": 128},
        "runs": {
            "exhaustive": {"result": {"slo": slo, "levels": [50, 100, 200], "trials": trials}}
        },
    }


def test_the_replay_bench_counts_the_starts_the_directions_save_at_the_same_goodput(
    monkeypatch, tmp_path, capsys
):
    """vLLM's scheduler in round figures (queued requests lengthen TTFT, running ones and a
    large budget lengthen ITL): the start (128 sequences, vLLM's budget) breaks ITL alone at
    200 streams; the search without directions also starts 1,024 sequences (4 starts, 3)."""

    def figures(seqs, budget, c):
        running = min(seqs, c)
        ttft = 100 + 600 * (c - running) / seqs + 300 * 2048 / budget
        return ttft, 2 + 0.04 * running + budget / 2048

    bench = _load("tune_replay", monkeypatch)
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(_swept(figures)))
    ratios = bench.main([str(path)])
    out = capsys.readouterr().out
    assert ratios["ratio_goodput_directed"] == ratios["ratio_goodput_both"] == 1.0
    assert ratios["ratio_starts"] == 0.75, out  # 3 starts against 4
    assert "left out: max_num_seqs up from seqs=128" in out and "ITL p95 11 ms > 10 ms" in out
    # under an ITL objective nothing breaks, the search stops at its start either way
    assert bench.main([str(path), "--itl-slo-ms", "100"])["ratio_starts"] == 1.0


def test_the_replay_bench_needs_an_exhaustive_run(monkeypatch, tmp_path):
    bench = _load("tune_replay", monkeypatch)
    path = tmp_path / "tune.json"
    path.write_text(json.dumps({"runs": {"coordinate": {}}}))
    with pytest.raises(SystemExit, match="--strategies exhaustive"):
        bench.main([str(path)])


def test_the_moe_sibling_setting_borrows_the_other_hoppers_shipped_tile_config(
    monkeypatch, tmp_path
):
    """The installed vLLM ships E=128,N=768 (the Qwen3-30B-A3B shape at one GPU) for the H200
    and not for the H100: an H100 gets the H200's under its own name; an H200 has its own."""
    bench = _load("gpu_batch_default", monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(
        json.dumps({"num_experts": 128, "moe_intermediate_size": 768})
    )
    folder, note = bench.moe_sibling_folder(model, tmp_path, "NVIDIA_H100_80GB_HBM3")
    borrowed = json.loads(
        (folder / "E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json").read_text()
    )
    assert "1" in borrowed and "BLOCK_SIZE_M" in borrowed["1"]
    assert note.startswith("E=128,N=768,device_name=NVIDIA_H200.json as ")
    with pytest.raises(ValueError, match="ships E=128,N=768,device_name=NVIDIA_H200.json"):
        bench.moe_sibling_folder(model, tmp_path, "NVIDIA_H200_NVL")
    with pytest.raises(ValueError, match="no Hopper sibling"):
        bench.moe_sibling_folder(model, tmp_path, "NVIDIA_L40S")
