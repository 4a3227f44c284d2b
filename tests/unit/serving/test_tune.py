"""The tuner's search on synthetic goodput surfaces: it finds the grid's optimum with fewer
measurements than the exhaustive sweep and never starts a setting that cannot fit."""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from llm_release.config import Gates, LoadProfile, ServingConfig, Speculation, TuneConfig
from llm_release.hardware import CpuInfo, Hardware
from llm_release.results import LoadLevel, Setting, Slo, TuneResult
from llm_release.serving.tune import (
    Grid,
    Tuner,
    apply_setting,
    drop_flag,
    start_seqs,
    static_problem,
    tune_candidate,
)

SLO = Slo(ttft_p95_ms=3000, itl_p95_ms=200, max_error_rate=0.01)
LEVELS = [1, 2, 4, 8, 16, 32]


def level(c: int, ttft_ms: float, rps: float = 1.0) -> LoadLevel:
    return LoadLevel(
        concurrency=c,
        requests=8,
        errors=0,
        error_rate=0.0,
        ttft_p50_ms=ttft_ms / 2,
        ttft_p95_ms=ttft_ms,
        itl_p50_ms=20,
        itl_p95_ms=40,
        output_tokens_per_s=rps * 32,
        requests_per_s=rps,
    )


class Surface:
    """A server whose TTFT grows once the load passes what the setting can serve."""

    def __init__(self, capacity) -> None:
        self.capacity = capacity  # setting -> highest concurrency served under the SLO
        self.started: list[Setting] = []
        self.levels = 0

    @contextmanager
    def session(self, setting: Setting):
        self.started.append(setting)

        def probe(c: int) -> LoadLevel:
            self.levels += 1
            cap = self.capacity(setting)
            return level(c, 1000 if c <= cap else 5000, rps=c * 0.5 + setting.max_num_seqs * 0.01)

        yield probe


def capacity(setting: Setting) -> int:
    # More seqs help up to 8; a small batch budget hurts; prefix caching is neutral.
    cap = min(setting.max_num_seqs, 8)
    if setting.max_num_batched_tokens is not None and setting.max_num_batched_tokens < 512:
        cap = max(1, cap // 2)
    return cap


GRID = Grid(
    max_num_seqs=[1, 2, 4, 8, 16, 32, 64],
    max_num_batched_tokens=[256, 1024, None],
    enable_prefix_caching=[True, False],
)


def test_coordinate_finds_the_optimum_with_fewer_measurements() -> None:
    full_surface, tuned_surface = Surface(capacity), Surface(capacity)
    full = Tuner(GRID, LEVELS, SLO, full_surface.session, lambda s: None, step_tokens=160)
    best = full.exhaustive()
    tuner = Tuner(
        GRID, LEVELS, SLO, tuned_surface.session, lambda s: None, step_tokens=160, max_settings=20
    )
    start = Setting(max_num_seqs=2, max_num_batched_tokens=256)  # a poor start on purpose
    found = tuner.coordinate(start)
    assert best.chosen_goodput == 8
    assert found.chosen_goodput == best.chosen_goodput
    assert len(tuned_surface.started) < len(full_surface.started) / 3
    assert tuned_surface.levels < full_surface.levels / 3
    # equivalent settings (seqs ≥ the top level) were measured once at most
    assert len(set(tuned_surface.started)) == len(tuned_surface.started)


@pytest.mark.parametrize(
    ("challenger", "warmed_up", "levels", "below"),
    [(16, False, [8, 16], 16), (8, False, [8], 8), (16, True, [16], 16), (8, True, [16], 16)],
)
def test_racing_starts_a_challenger_at_the_goodput_level_then_stops_it(
    challenger: int, warmed_up: bool, levels: list[int], below: int
) -> None:
    """A raced setting is measured from the best setting's goodput and stops at its first
    failure at or below it. Where the session does not warm its servers up, the level below
    comes first (a server's first level after its start is slower); where it does
    (``load.warm_up``), that level would be measured for nothing."""
    caps = {32: 16, 16: 8, 8: 2}
    surface = Surface(lambda s: caps[s.max_num_seqs])
    seen: list[tuple[int, int]] = []

    @contextmanager
    def session(setting: Setting):
        with surface.session(setting) as probe:

            def recorded(streams: int) -> LoadLevel:
                seen.append((setting.max_num_seqs, streams))
                return probe(streams)

            yield recorded

    grid = Grid(max_num_seqs=[8, 16, 32])
    tuner = Tuner(grid, LEVELS, SLO, session, lambda s: None, step_tokens=160, warmed_up=warmed_up)
    best = tuner.measure(Setting(max_num_seqs=32))
    raced = tuner.measure(Setting(max_num_seqs=challenger), start_at=best.goodput)
    assert best.goodput == 16
    assert [c for seqs, c in seen if seqs == challenger] == levels
    assert raced.below == below and raced.goodput == 0


def test_never_starts_a_setting_the_planner_refuses() -> None:
    refused = {s for s in GRID.points() if s.max_num_seqs >= 8}

    def fits(setting: Setting) -> str | None:
        return "KV cache holds 0.5 sequences" if setting in refused else None

    for strategy in ("coordinate", "exhaustive"):
        surface = Surface(capacity)
        tuner = Tuner(GRID, LEVELS, SLO, surface.session, fits, step_tokens=160, max_settings=50)
        result = (
            tuner.coordinate(Setting(max_num_seqs=32))
            if strategy == "coordinate"
            else (tuner.exhaustive())
        )
        assert surface.started and not refused & set(surface.started)
        assert result.chosen is not None and result.chosen not in refused
        assert result.chosen_goodput == 4  # the best of what fits
        assert any(p.setting in refused for p in result.pruned)


class Scheduler:
    """A server that schedules as vLLM does, in round figures: at most ``max_num_seqs``
    requests run and the rest wait (TTFT grows with the queue), each step carries at most
    ``max_num_batched_tokens`` tokens (a small budget delays prefills, a large one lengthens
    the steps that carry them: ITL), and every running sequence lengthens a step."""

    def __init__(self) -> None:
        self.started: list[Setting] = []
        self.levels = 0

    @staticmethod
    def figures(setting: Setting, c: int) -> tuple[float, float]:
        seqs, budget = setting.max_num_seqs, setting.max_num_batched_tokens or 8192
        running = min(seqs, c)
        ttft = 100 + 600 * (c - running) / seqs + 300 * 2048 / budget
        itl = 2 + 0.04 * running + budget / 2048
        return ttft, itl

    @contextmanager
    def session(self, setting: Setting):
        self.started.append(setting)

        def probe(c: int) -> LoadLevel:
            self.levels += 1
            ttft, itl = self.figures(setting, c)
            out = level(c, ttft, rps=c / 10)
            return out.model_copy(update={"itl_p95_ms": itl})

        yield probe


def test_vllms_default_budget_sorts_where_vllms_own_value_is():
    """A step of the budget dimension goes to the next larger budget: vLLM's default (None)
    is 8,192 tokens on an H100, smaller than an explicit 16,384."""
    grid = Grid(max_num_seqs=[8], max_num_batched_tokens=[16384, None, 1024, 8192])
    assert grid.values("max_num_batched_tokens") == [1024, 8192, 16384, None]
    on_h100 = grid.model_copy(update={"default_batched_tokens": 8192})
    assert on_h100.values("max_num_batched_tokens") == [1024, 8192, None, 16384]
    start = Setting(max_num_seqs=8, max_num_batched_tokens=None)
    assert on_h100.neighbour(start, "max_num_batched_tokens", 1).max_num_batched_tokens == 16384
    assert on_h100.neighbour(start, "max_num_batched_tokens", -1).max_num_batched_tokens == 8192


def test_vllms_default_budget_and_the_same_budget_stated_are_one_server():
    """On an H100 vLLM's default budget is 8,192: a grid holding both None and 8,192 starts
    one server for the two; a budget every level fits in is measured as the smallest such."""
    from llm_release.serving.tune import representative

    grid = Grid(
        max_num_seqs=[8], max_num_batched_tokens=[None, 8192, 16384], default_batched_tokens=8192
    )
    unset = Setting(max_num_seqs=8, max_num_batched_tokens=None)
    assert representative(unset, 4, 100, grid).max_num_batched_tokens == 8192
    # 8 streams of 2,000 tokens: 16,000 fit in 16,384, not in 8,192
    assert representative(unset, 8, 2000, grid).max_num_batched_tokens == 8192
    # 4 streams of 1,000 tokens: every budget holds them, the smallest is measured
    small = Grid(max_num_seqs=[8], max_num_batched_tokens=[None, 4096], default_batched_tokens=8192)
    assert representative(unset, 4, 1000, small).max_num_batched_tokens == 4096
    # vLLM's default unknown: None is its own server
    unknown = grid.model_copy(update={"default_batched_tokens": None})
    assert representative(unset, 4, 100, unknown).max_num_batched_tokens is None


SEEDS_SLO = Slo(ttft_p95_ms=1000, itl_p95_ms=10, max_error_rate=0.01)
GRID_3X3 = Grid(max_num_seqs=[64, 128, 1024], max_num_batched_tokens=[1024, 2048, None])


def test_on_a_3x3_grid_the_search_starts_a_third_of_it_where_the_failure_names_the_way():
    """The 2026-12-03 grid's shape (levels 50 / 100 / 200, TTFT p95 1 s, ITL p95 10 ms):
    the planner's start (128 sequences, vLLM's batch budget) holds 100 streams and breaks
    the ITL objective at 200: fewer sequences or a smaller budget, never more sequences."""
    full, tuned = Scheduler(), Scheduler()
    best = Tuner(
        GRID_3X3, [50, 100, 200], SEEDS_SLO, full.session, lambda s: None, step_tokens=640
    ).exhaustive()
    tuner = Tuner(
        GRID_3X3,
        [50, 100, 200],
        SEEDS_SLO,
        tuned.session,
        lambda s: None,
        step_tokens=640,
        warmed_up=True,
    )
    found = tuner.coordinate(Setting(max_num_seqs=200))
    assert best.chosen == Setting(max_num_seqs=128, max_num_batched_tokens=2048)
    assert (found.chosen, found.chosen_goodput) == (best.chosen, 200)
    assert len(tuned.started) * 3 <= len(full.started) and tuned.levels * 3 < full.levels
    assert Setting(max_num_seqs=1024) not in tuned.started  # more sequences: longer steps
    assert any(
        note.startswith("max_num_seqs up from") and "ITL p95 11 ms > 10 ms at 200 streams" in note
        for note in found.skipped
    )


def failed_at(seqs: int, c: int, ttft_ms: float, itl_ms: float, errors: int = 0):
    from llm_release.results import Trial

    measured = level(c, ttft_ms).model_copy(
        update={"itl_p95_ms": itl_ms, "errors": errors, "error_rate": errors / 8}
    )
    return Trial(setting=Setting(max_num_seqs=seqs), levels=[measured], failures={c: "broke"})


@pytest.mark.parametrize(
    ("trial", "seqs_steps", "batched_steps", "notes"),
    [
        (failed_at(128, 200, 4000, 5), (1,), (1,), 2),  # queued: more sequences, more budget
        (failed_at(128, 100, 4000, 5), (1, -1), (1,), 1),  # all running: no queue to read
        # steps too long: fewer sequences, a smaller budget (vLLM's is the largest: no note)
        (failed_at(128, 200, 500, 15), (-1,), (-1,), 1),
        (failed_at(128, 200, 4000, 15), (1, -1), (1, -1), 0),  # both objectives: either way
        (failed_at(128, 200, 500, 5, errors=4), (1, -1), (1, -1), 0),  # errors: no latency
    ],
)
def test_the_direction_of_each_step_comes_from_why_the_best_setting_failed(
    trial, seqs_steps, batched_steps, notes
) -> None:
    tuner = Tuner(
        GRID_3X3, [50, 100, 200], SEEDS_SLO, Scheduler().session, lambda s: None, step_tokens=640
    )
    assert tuner.directions(trial, "max_num_seqs") == seqs_steps
    assert tuner.directions(trial, "max_num_batched_tokens") == batched_steps
    assert tuner.directions(trial, "enable_prefix_caching") == (1, -1)
    # a note for each direction left out where the grid has a step that way
    assert len(tuner.skipped) == notes, tuner.skipped


def test_static_problem_and_serving_args() -> None:
    assert static_problem(Setting(max_num_seqs=16, max_num_batched_tokens=8))
    assert static_problem(Setting(max_num_seqs=16, max_num_batched_tokens=16)) is None
    serving = ServingConfig(extra_args=["--max-num-batched-tokens=64", "--enforce-eager"])
    tuned = apply_setting(
        serving,
        Setting(max_num_seqs=4, max_num_batched_tokens=512, enable_prefix_caching=False),
    )
    assert tuned.extra_args == ["--enforce-eager", "--max-num-batched-tokens", "512"]
    assert (tuned.max_num_seqs, tuned.enable_prefix_caching) == (4, False)
    assert drop_flag(["--max_num_batched_tokens", "8", "-x"], "--max-num-batched-tokens") == ["-x"]


def test_tune_config_is_off_and_strict() -> None:
    assert TuneConfig().enabled is False
    with pytest.raises(ValueError):
        TuneConfig(max_num_seqs=[])
    with pytest.raises(ValueError):
        TuneConfig(unknown=1)


NGRAM = Speculation(method="ngram", num_speculative_tokens=3)


def speculation_helps(setting: Setting) -> int:
    return 16 if setting.speculation is not None else 4


def tune_with_speculation(strategy: str, answers) -> tuple[Surface, TuneResult]:
    """A grid of one max_num_seqs with and without ngram speculation, which serves 16
    streams where none serves 4; ``answers`` what each setting's server answered."""
    surface = Surface(speculation_helps)
    grid = Grid(max_num_seqs=[16], speculation=[None, NGRAM])
    tuner = Tuner(
        grid, LEVELS, SLO, surface.session, lambda s: None, step_tokens=160, answers=answers
    )
    if strategy == "coordinate":
        return surface, tuner.coordinate(Setting(max_num_seqs=16))
    return surface, tuner.exhaustive()


@pytest.mark.parametrize("strategy", ["coordinate", "exhaustive"])
def test_speculation_is_taken_when_it_pays_and_keeps_the_answers(strategy) -> None:
    surface, result = tune_with_speculation(strategy, lambda s: ["same", "answers"])
    assert surface.started[0].speculation is None  # the reference is measured first
    assert result.chosen == Setting(max_num_seqs=16, speculation=NGRAM)
    assert result.chosen_goodput == 16
    assert "spec=ngram:3" in result.chosen.label()


@pytest.mark.parametrize("strategy", ["coordinate", "exhaustive"])
@pytest.mark.parametrize(
    ("answers", "why"),
    [
        ({None: ["a", "b"], NGRAM: ["a", "c"]}, "1 of 2 greedy answers differ"),
        ({None: ["a", "b"]}, "no greedy answers to compare"),
        ({NGRAM: ["a", "b"]}, "no greedy answers to compare"),
    ],
)
def test_speculation_that_changes_or_cannot_show_its_answers_is_never_chosen(
    strategy, answers, why
) -> None:
    _, result = tune_with_speculation(strategy, lambda s: answers.get(s.speculation))
    assert result.chosen == Setting(max_num_seqs=16)  # without speculation, though slower
    assert result.chosen_goodput == 4
    (speculative,) = [t for t in result.trials if t.setting.speculation is not None]
    assert speculative.goodput == 16 and why in speculative.answers_changed


def test_none_is_always_a_speculation_choice_and_the_setting_reaches_serving() -> None:
    assert TuneConfig().speculation == [None]
    assert TuneConfig(speculation=[NGRAM, NGRAM]).speculation == [None, NGRAM]
    tuned = apply_setting(ServingConfig(), Setting(max_num_seqs=4, speculation=NGRAM))
    assert tuned.speculation == NGRAM
    off = apply_setting(ServingConfig(speculation=NGRAM), Setting(max_num_seqs=4))
    assert off.speculation is None


def test_the_plan_names_speculation_as_unmodelled_and_ngram_turns_async_scheduling_off():
    from llm_release.sizing import request_for_serving

    request = request_for_serving(ServingConfig(speculation=NGRAM, dtype="bfloat16"), device="gpu")
    assert request.async_scheduling is False  # vLLM 0.32: none with ngram speculation
    assert any("speculative decoding ngram:3" in note for note in request.unmodelled)
    plain = request_for_serving(ServingConfig(dtype="bfloat16"), device="gpu")
    assert plain.async_scheduling is None and plain.unmodelled == []


class Noisy:
    """Every setting holds 8 streams and no more; output tokens/s per start of a setting
    from ``tok_s`` (setting's max_num_seqs → one figure per start, in order)."""

    def __init__(self, tok_s: dict[int, list[float]]) -> None:
        self.tok_s = tok_s
        self.started: list[int] = []

    @contextmanager
    def session(self, setting: Setting):
        seqs = setting.max_num_seqs
        figure = self.tok_s[seqs][self.started.count(seqs)]
        self.started.append(seqs)

        def probe(c: int) -> LoadLevel:
            return level(c, 1000 if c <= 8 else 5000, rps=figure / 32)

        yield probe


@pytest.mark.parametrize(
    ("best_again", "chosen", "starts"),
    [
        (1300.0, 4, [4, 8, 4]),  # the best setting's second start is as fast: a tie, kept
        (1000.0, 8, [4, 8, 4]),  # slower again: the lead holds, the challenger is taken
    ],
)
def test_a_lead_by_tokens_alone_is_confirmed_against_the_best_setting_started_again(
    best_again: float, chosen: int, starts: list[int]
) -> None:
    surface = Noisy({4: [1000.0, best_again], 8: [1200.0]})
    grid = Grid(max_num_seqs=[4, 8])
    tuner = Tuner(grid, LEVELS, SLO, surface.session, lambda s: None, step_tokens=160)
    result = tuner.coordinate(Setting(max_num_seqs=4))
    assert surface.started == starts
    assert result.chosen == Setting(max_num_seqs=chosen)
    again = [t for t in result.trials if t.again]
    assert [t.setting.max_num_seqs for t in again] == [4]
    # measured again at the levels the challenger had: the level below the goodput, the goodput
    assert [lv.concurrency for lv in again[0].levels] == [4, 8, 16]
    assert result.seconds == sum(t.seconds for t in result.trials)


def test_without_confirmation_or_a_start_left_the_lead_is_taken_or_the_best_kept() -> None:
    grid = Grid(max_num_seqs=[4, 8])
    surface = Noisy({4: [1000.0, 1300.0], 8: [1200.0]})
    unconfirmed = Tuner(
        grid, LEVELS, SLO, surface.session, lambda s: None, step_tokens=160, confirm=False
    ).coordinate(Setting(max_num_seqs=4))
    assert surface.started == [4, 8] and unconfirmed.chosen == Setting(max_num_seqs=8)
    surface = Noisy({4: [1000.0, 1000.0], 8: [1200.0]})
    capped = Tuner(
        grid, LEVELS, SLO, surface.session, lambda s: None, step_tokens=160, max_settings=2
    ).coordinate(Setting(max_num_seqs=4))
    assert surface.started == [4, 8] and capped.chosen == Setting(max_num_seqs=4)


HYBRID = Path(__file__).parents[1] / "data" / "gpu" / "qwen3.5-35b-a3b-shape.config.json"
H100 = Hardware(
    cpu=CpuInfo(model_name="cpu", cores=16, flags=["avx2"]),
    machine="x86_64",
    gpus=["NVIDIA H100 80GB HBM3"],
)


def test_on_a_gpu_the_search_starts_from_the_untuned_server_not_above_it(tmp_path, monkeypatch):
    """The hybrid shape on one H100 at 32k: the plan's batch default (what its KV cache holds
    of 768-token requests, about 60) is below the top level, 100; the search starts there
    and measures it, where it started at 128 (100 snapped to the grid) before."""
    from llm_release import hardware
    from llm_release.serving import capacity

    monkeypatch.setattr(hardware, "gpu_memory_gib", lambda: 79.18)
    folder = tmp_path / "hybrid"
    folder.mkdir()
    shutil.copy(HYBRID, folder / "config.json")
    serving = ServingConfig(max_model_len=32768, gpu_memory_utilization=0.9, request_tokens=768)
    untuned = capacity.resolve_batch(folder, serving, H100).max_num_seqs
    assert untuned is not None and 30 < untuned < 100
    assert start_seqs([10, 50, 100], folder, serving, H100) == untuned
    assert start_seqs([10, 50], folder, serving, H100) == 50  # the top level when lower
    explicit = serving.model_copy(update={"max_num_seqs": 40})
    assert start_seqs([10, 50, 100], folder, explicit, H100) == 40
    cpu = H100.model_copy(update={"gpus": []})
    assert start_seqs([10, 50, 100], folder, serving, cpu) == 100  # a CPU: the top level

    surface = Surface(lambda s: min(s.max_num_seqs, 50))
    load = LoadProfile(concurrencies=[10, 50, 100], prompt_tokens=512, output_tokens=256)
    result, _ = tune_candidate(
        TuneConfig(enabled=True, max_num_seqs=[128], max_settings=2),
        model_dir=folder,
        tokenizer_dir=folder,
        served_names=["hybrid"],
        serving=serving,
        load=load,
        gates=Gates(ttft_p95_slo_s=3.0),
        host=H100,
        out_dir=tmp_path / "tune",
        session=surface.session,
    )
    assert surface.started[0].max_num_seqs == untuned  # measured, though not on the grid given
    assert {t.setting.max_num_seqs for t in result.trials} <= {untuned, 128}


class StandInServer:
    """A vLLM server stood in for: GuideLLM (stood in too) is the one that would call it."""

    base_url = "http://x"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_a_servers_first_level_alone_follows_a_warm_up_at_the_top_level(monkeypatch, tmp_path):
    from llm_release.serving import tune

    asked: list[tuple[list[int], bool, int | None]] = []
    runs: list[int] = []

    def load_test(base_url, name, tokenizer_dir, profile, out_dir, **kwargs):
        asked.append((profile.concurrencies, profile.warm_up, kwargs.get("warm_up_at")))
        runs.append(kwargs["run_index"])
        return type("Result", (), {"levels": [level(profile.concurrencies[0], 100)]})

    monkeypatch.setattr(tune, "make_server", lambda *args, **kwargs: StandInServer())
    monkeypatch.setattr(tune, "run_load_test", load_test)
    monkeypatch.setattr(tune.reasoning, "request_body", lambda *args: {})
    profile = LoadProfile(concurrencies=[1, 4, 16])
    session = tune.vllm_session(tmp_path, ["m"], ServingConfig(), tmp_path, profile, tmp_path)
    for _ in range(2):  # two servers: each one's first level only is warmed up
        with session(Setting(max_num_seqs=4)) as probe:
            probe(1)
            probe(4)
    assert asked == [([1], True, 16), ([4], False, 16)] * 2
    # each level of a server is a run of its own with prompts the server has not seen
    assert runs == [0, 1] * 2
    off = profile.model_copy(update={"warm_up": False})
    with tune.vllm_session(tmp_path, ["m"], ServingConfig(), tmp_path, off, tmp_path)(
        Setting(max_num_seqs=4)
    ) as probe:
        probe(1)
    assert asked[-1] == ([1], False, 16)


def test_a_raced_server_that_is_warmed_up_is_measured_from_the_goodput_level(monkeypatch, tmp_path):
    """Through ``tune_candidate``'s own vLLM sessions (the server and GuideLLM stood in): the
    warm-up level stands for the level below, so a raced setting's first measured level is
    the best setting's goodput; with ``load.warm_up`` off the level below comes first."""
    from llm_release import hardware
    from llm_release.serving import tune

    monkeypatch.setattr(hardware, "gpu_memory_gib", lambda: 79.18)
    folder = tmp_path / "hybrid"
    folder.mkdir()
    shutil.copy(HYBRID, folder / "config.json")
    serving = ServingConfig(max_model_len=32768, gpu_memory_utilization=0.9, request_tokens=768)
    servers: list[int] = []
    asked: list[tuple[int, int, bool]] = []  # (server, streams, warmed up first)

    def make_server(model_dir, names, serving, log_path):
        servers.append(serving.max_num_seqs)
        return StandInServer()

    def load_test(base_url, name, tokenizer_dir, profile, out_dir, **kwargs):
        c = profile.concurrencies[0]
        asked.append((len(servers), c, profile.warm_up))
        return type("Result", (), {"levels": [level(c, 100 if c <= 50 else 9000)]})

    monkeypatch.setattr(tune, "make_server", make_server)
    monkeypatch.setattr(tune, "run_load_test", load_test)
    monkeypatch.setattr(tune.reasoning, "request_body", lambda *args: {})
    for warm_up, second in ((True, [(2, 50, True), (2, 100, False)]), (False, [(2, 10, False)])):
        servers.clear()
        asked.clear()
        tune_candidate(
            TuneConfig(enabled=True, max_num_seqs=[128], max_settings=2, confirm_ties=False),
            model_dir=folder,
            tokenizer_dir=folder,
            served_names=["hybrid"],
            serving=serving,
            load=LoadProfile(
                concurrencies=[10, 50, 100], prompt_tokens=512, output_tokens=256, warm_up=warm_up
            ),
            gates=Gates(ttft_p95_slo_s=3.0),
            host=H100,
            out_dir=tmp_path / f"tune-{warm_up}",
        )
        assert len(servers) == 2 and servers[1] == 128
        assert [a for a in asked if a[0] == 2][: len(second)] == second
