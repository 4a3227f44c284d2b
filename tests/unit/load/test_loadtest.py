"""Reading GuideLLM's report, and running again a level it closed before all requests ran."""

import json
import time
from pathlib import Path

import pytest
from guidellm.benchmark.schemas.report import GenerativeBenchmarksReport

from llm_release.config import LoadProfile
from llm_release.errors import LoadTestError
from llm_release.load import loadtest
from llm_release.results import LoadLevel

DATA = Path(__file__).parents[1] / "data"
# A real GuideLLM 0.8.1 report (a release on a 2-core host, vLLM CPU): concurrency 1 was
# closed after 2 of 4 requests while the others were still queued (per-request records
# dropped to keep the file small). Read by GuideLLM's own report model.
CLOSED_EARLY = loadtest.read_report(DATA / "guidellm_level_closed_early.json")


def level(concurrency: int, requests: int, planned: int = 4, time_limited=False) -> LoadLevel:
    return LoadLevel(
        concurrency=concurrency,
        requests=requests,
        requests_planned=planned,
        time_limited=time_limited,
        errors=0,
        error_rate=0.0,
        ttft_p50_ms=10.0,
        ttft_p95_ms=20.0 + requests,
        itl_p50_ms=1.0,
        itl_p95_ms=2.0,
        output_tokens_per_s=100.0,
        requests_per_s=1.0,
    )


def test_a_level_closed_early_is_recognised_in_a_real_report():
    levels = loadtest.parse_report(CLOSED_EARLY, requests_planned=4)
    assert [(lv.concurrency, lv.requests) for lv in levels] == [(1, 2), (2, 4)]
    assert not any(lv.time_limited for lv in levels)
    assert levels[0].ttft_p95_ms > 0
    assert loadtest.short_levels(levels) == [1]


def test_a_level_stopped_by_the_time_limit_is_not_run_again():
    report = json.loads((DATA / "guidellm_level_closed_early.json").read_text())
    state = report["benchmarks"][0]["scheduler_state"]
    state["end_queuing_constraints"] = {"max_duration": {"request_queuing": "stop"}}
    levels = loadtest.parse_report(
        GenerativeBenchmarksReport.model_validate(report), requests_planned=4
    )
    assert levels[0].time_limited
    assert loadtest.short_levels(levels) == []


def fake_guidellm(monkeypatch, runs: list[list[LoadLevel]]) -> list[list[int]]:
    """Replace only the subprocess: each call returns the next run's levels."""
    asked: list[list[int]] = []

    def run(base_url, served_name, tokenizer_dir, profile, report_path, log_path, **kwargs):
        asked.append(list(profile.concurrencies))
        return runs[len(asked) - 1]

    monkeypatch.setattr(loadtest, "_run_guidellm", run)
    return asked


PROFILE = LoadProfile(concurrencies=[1, 2], requests_per_level=4)


def test_only_the_short_level_runs_again_and_the_full_measurement_is_kept(monkeypatch, tmp_path):
    asked = fake_guidellm(monkeypatch, [[level(1, 2), level(2, 4)], [level(1, 4)]])
    result = loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")
    assert asked == [[1, 2], [1]]
    assert [(lv.concurrency, lv.requests) for lv in result.levels] == [(1, 4), (2, 4)]
    assert result.attempts == 2 and result.notes == []


def test_a_level_short_in_every_run_is_kept_with_a_note(monkeypatch, tmp_path):
    runs = [[level(1, 2), level(2, 4)], [level(1, 3)], [level(1, 1)]]
    asked = fake_guidellm(monkeypatch, runs)
    result = loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")
    assert asked == [[1, 2], [1], [1]]
    assert result.levels[0].requests == 3
    assert result.notes == [
        "concurrency 1: 3 of 4 requests (GuideLLM closed the level early in each of 3 runs)"
    ]


def test_a_level_never_reported_fails_the_load_test(monkeypatch, tmp_path):
    fake_guidellm(monkeypatch, [[level(1, 4)], [], []])
    with pytest.raises(LoadTestError, match=r"no benchmark for concurrency \[2\]"):
        loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")


def hangs_then(monkeypatch, answers: list) -> list[list[int]]:
    """_run_guidellm stood in: each answer a run's levels, or the hang it raises."""
    asked: list[list[int]] = []

    def run(base_url, served_name, tokenizer_dir, profile, report_path, log_path, **kwargs):
        asked.append(list(profile.concurrencies))
        answer = answers[len(asked) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(loadtest, "_run_guidellm", run)
    return asked


def test_a_guidellm_run_that_hung_is_run_again_once(monkeypatch, tmp_path):
    hang = loadtest.GuideLLMHung("GuideLLM ran longer than 123s; see g.log")
    asked = hangs_then(monkeypatch, [hang, [level(1, 4), level(2, 4)]])
    result = loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")
    assert asked == [[1, 2], [1, 2]]  # every level of the run that hung, again
    assert [(lv.concurrency, lv.requests) for lv in result.levels] == [(1, 4), (2, 4)]
    assert result.attempts == 2


def test_a_second_hang_fails_the_load_test(monkeypatch, tmp_path):
    hang = loadtest.GuideLLMHung("GuideLLM ran longer than 123s; see g.log")
    asked = hangs_then(monkeypatch, [[level(1, 2), level(2, 4)], hang, hang])
    with pytest.raises(LoadTestError, match="ran longer than 123s"):
        loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")
    assert asked == [[1, 2], [1], [1]]


def test_a_guidellm_past_its_budget_is_stopped_as_a_hang(monkeypatch, tmp_path):
    import subprocess

    def run(cmd, log_file, env, timeout_s):
        raise subprocess.TimeoutExpired(cmd, timeout_s)

    monkeypatch.setattr(loadtest, "run_in_group", run)
    with pytest.raises(loadtest.GuideLLMHung, match="ran longer than"):
        loadtest._run_guidellm(
            "http://x", "m", tmp_path, PROFILE, tmp_path / "g.json", tmp_path / "g.log"
        )


def guidellm_exiting(monkeypatch, output: str):
    """Replace only the subprocess: GuideLLM prints ``output`` and exits with 1."""

    def run(cmd, log_file, env, timeout_s):
        log_file.write(output.encode())
        return 1

    monkeypatch.setattr(loadtest, "run_in_group", run)


def test_a_level_with_no_request_recorded_is_run_again_not_failed(monkeypatch, tmp_path):
    guidellm_exiting(
        monkeypatch,
        "Traceback (most recent call last):\nValueError: Cannot compile GenerativeMetrics: "
        "No measurement start or end times available.\n",
    )
    levels = loadtest._run_guidellm(
        "http://x", "m", tmp_path, PROFILE, tmp_path / "g.json", tmp_path / "g.log"
    )
    assert levels == []  # run_load_test then runs the level again (see the tests above)


def test_any_other_guidellm_failure_fails_with_its_log_tail(monkeypatch, tmp_path):
    guidellm_exiting(monkeypatch, "ValueError: the backend refused the connection\n")
    with pytest.raises(LoadTestError, match="(?s)exited with 1.*refused the connection"):
        loadtest._run_guidellm(
            "http://x", "m", tmp_path, PROFILE, tmp_path / "g.json", tmp_path / "g.log"
        )


# A real GuideLLM 0.8.1 report, run with the SLO (--metrics slo: ttft_ms 60, tpot_ms 50)
# against GuideLLM's own mock server (TTFT 20 ms, ITL 5 ms, 8 tokens, one request at a time)
# at 1 and 4 streams, 8 requests each, on a busy 2-core host (per-request records dropped to
# keep the file small).
WITH_SLO = loadtest.read_report(DATA / "guidellm_slo_report.json")


def alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"  # a zombie has stopped


def test_a_run_past_its_time_is_stopped_with_every_process_it_started(tmp_path):
    """A real process tree (a main process and a worker it forked, as GuideLLM's): past
    the time limit both are gone, not only the main one."""
    import subprocess

    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $! > {pids}; echo started; wait"
    with (tmp_path / "g.log").open("wb") as log_file, pytest.raises(subprocess.TimeoutExpired):
        loadtest.run_in_group(["sh", "-c", script], log_file, {"PATH": "/usr/bin:/bin"}, 2)
    worker = int(pids.read_text())
    # a SIGKILL is delivered, not waited for: the worker may take a moment to exit
    deadline = time.monotonic() + 5
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)
    assert (tmp_path / "g.log").read_text() == "started\n"


def test_a_run_that_ends_in_time_gives_its_exit_code(tmp_path):
    with (tmp_path / "g.log").open("wb") as log_file:
        code = loadtest.run_in_group(["sh", "-c", "echo hi; exit 3"], log_file, {}, 30)
    assert code == 3 and (tmp_path / "g.log").read_text() == "hi\n"


def test_guidellm_is_given_the_slo_and_its_attainment_is_read_back():
    from llm_release.config import Gates

    slo = loadtest.slo_for(Gates(ttft_p95_slo_s=0.06, itl_p95_slo_ms=50))
    cmd = loadtest.build_command(
        "http://x", "m", Path("/tok"), LoadProfile(), Path("/r.json"), slo=slo
    )
    metrics = json.loads(cmd[cmd.index("--metrics") + 1])
    assert metrics == {"kind": "generative", "slo": {"ttft_ms": 60.0, "tpot_ms": 50.0}}
    # the report GuideLLM wrote with that argument says it measured against the same SLO
    assert all(b.config.slo.ttft_ms == 60.0 for b in WITH_SLO.benchmarks)
    levels = loadtest.parse_report(WITH_SLO, requests_planned=8)
    assert [(lv.concurrency, lv.slo_attainment) for lv in levels] == [(1, 0.75), (4, 1.0)]
    assert 4 < levels[0].goodput_rps < 5 and 34 < levels[1].goodput_rps < 35
    # no SLO given: no --metrics, and a report without it parses to None
    assert "--metrics" not in loadtest.build_command(
        "http://x", "m", Path("/tok"), LoadProfile(), Path("/r.json")
    )
    without = WITH_SLO.model_copy(deep=True)
    for bench in without.benchmarks:
        bench.metrics.slo_attainment = bench.metrics.request_goodput = None
    assert [(lv.slo_attainment, lv.goodput_rps) for lv in loadtest.parse_report(without)] == [
        (None, None),
        (None, None),
    ]


def test_a_warm_up_level_runs_first_at_the_top_concurrency_and_is_left_out():
    profile = LoadProfile(concurrencies=[1, 4], requests_per_level=8)
    cmd = loadtest.build_command("http://x", "m", Path("/tok"), profile, Path("/r"), warm_up=4)
    # GuideLLM runs the streams in their order: the warm-up's level is its first benchmark
    assert cmd[cmd.index("--profile") + 1] == "kind=concurrent,streams=4"
    assert cmd[cmd.index("profile.streams") + 1] == "4,1,4"
    # one wave: a request a stream, then the profile's count for every level after it
    counts = [json.loads(a) for a in cmd if a.startswith('{"kind": "max_requests"')]
    assert counts == [{"kind": "max_requests", "count": [4, 8, 8]}]
    few = profile.model_copy(update={"requests_per_level": 2})
    cmd = loadtest.build_command("http://x", "m", Path("/tok"), few, Path("/r"), warm_up=4)
    assert '{"kind": "max_requests", "count": [2, 2, 2]}' in cmd
    cold = loadtest.build_command("http://x", "m", Path("/tok"), profile, Path("/r"))
    assert cold[cold.index("profile.streams") + 1] == "1,4"
    assert "kind=max_requests,count=8" in cold
    # read from a real report whose first benchmark stands for the warm-up (1 stream): only
    # the level after it is a result
    levels = loadtest.parse_report(WITH_SLO, requests_planned=8, skip=1)
    assert [lv.concurrency for lv in levels] == [4]
    assert levels[0] == loadtest.parse_report(WITH_SLO, requests_planned=8)[1]


def test_only_a_load_tests_first_run_warms_up(monkeypatch, tmp_path):
    warm: list[int | None] = []

    def run(base_url, served_name, tokenizer_dir, profile, *args, warm_up=None, **kwargs):
        warm.append(warm_up)
        # the first run closes level 1 early: it runs again, on a server already warm
        return [level(c, 2 if len(warm) == 1 and c == 1 else 4) for c in profile.concurrencies]

    monkeypatch.setattr(loadtest, "_run_guidellm", run)
    result = loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "load")
    assert warm == [2, None] and result.warm_up == 2 and result.attempts == 2
    # the tuner's levels, one at a time, warm up at the top of the whole sweep
    loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "t", warm_up_at=100)
    assert warm[2] == 100
    off = PROFILE.model_copy(update={"warm_up": False})
    result = loadtest.run_load_test("http://x", "m", tmp_path, off, tmp_path / "off")
    assert warm[3] is None and result.warm_up is None


def test_no_run_of_a_server_resends_an_earlier_runs_prompts(monkeypatch, tmp_path):
    """GuideLLM draws synthetic prompts from its seed: a second run with the same seed sends
    the first run's prompts again and vLLM's prefix cache serves them (97% of the prompt
    tokens at every level after a server's first in the tuner's sweeps on an H100). A
    server's first run keeps GuideLLM's own seed; every later run and every retry gets one
    of its own."""
    seeds: list[int | None] = []

    def run(base_url, served_name, tokenizer_dir, profile, *args, prompt_seed=None, **kwargs):
        seeds.append(prompt_seed)
        # each run's first try closes level 1 early: it is tried again
        return [level(c, 2 if len(seeds) % 2 and c == 1 else 4) for c in profile.concurrencies]

    monkeypatch.setattr(loadtest, "_run_guidellm", run)
    for index in range(3):
        loadtest.run_load_test(
            "http://x", "m", tmp_path, PROFILE, tmp_path / f"r{index}", run_index=index
        )
    assert seeds[0] is None and len(seeds) == 6
    assert len(set(seeds)) == 6 and all(s % loadtest.PROMPT_SEED_STRIDE == 42 for s in seeds[1:])
    cmd = loadtest.build_command(
        "http://x", "m", Path("/tok"), PROFILE, Path("/r"), prompt_seed=seeds[1]
    )
    assert cmd[cmd.index("--seed") + 1] == f"kind=static,value={seeds[1]}"
    assert "--seed" not in loadtest.build_command(
        "http://x", "m", Path("/tok"), PROFILE, Path("/r")
    )


def test_a_file_that_is_not_a_guidellm_report_is_one_line(tmp_path):
    path = tmp_path / "guidellm.json"
    path.write_text('{"benchmarks": [{"config": {}}]}')
    with pytest.raises(LoadTestError, match="is not a GuideLLM report") as caught:
        loadtest.read_report(path)
    assert "\n" not in caught.value.one_line()


def test_goodput_of_a_real_report_is_the_highest_level_within_the_slo():
    from llm_release.results import Slo

    levels = loadtest.parse_report(WITH_SLO, requests_planned=8)
    # TTFT p95 272 ms at 1 stream (its first requests met a cold server), 53 ms at 4;
    # ITL p95 12.7 ms and 11.9 ms
    tight = loadtest.goodput(levels, Slo(ttft_p95_ms=60, itl_p95_ms=50, max_error_rate=0.01))
    # 4 streams meet this SLO, but a level above a missed one does not count
    assert tight.concurrency == 0 and tight.failures == {1: "TTFT p95 272 ms > 60 ms"}
    loose = loadtest.goodput(levels, Slo(ttft_p95_ms=300, itl_p95_ms=50, max_error_rate=0.01))
    assert loose.concurrency == 4 and loose.failures == {}
    assert loose.output_tokens_per_s == levels[1].output_tokens_per_s
    itl = loadtest.goodput(levels, Slo(ttft_p95_ms=300, itl_p95_ms=12, max_error_rate=0.01))
    assert (itl.concurrency, itl.failures) == (0, {1: "ITL p95 13 ms > 12 ms"})


def test_the_tuner_and_the_ranking_share_one_goodput():
    from llm_release.decision import select
    from llm_release.serving import tune

    assert tune.goodput is loadtest.goodput and select.goodput is loadtest.goodput
    assert tune.level_verdict is loadtest.level_verdict


def test_a_pinned_client_runs_on_its_cpus_only():
    """The wrapper the load test runs GuideLLM through: a real process, its real affinity."""
    import os
    import subprocess
    import sys

    from llm_release.load.loadtest import pinned

    allowed = sorted(os.sched_getaffinity(0))
    probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    assert pinned(probe, None) == probe
    out = subprocess.run(pinned(probe, allowed[:1]), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(allowed[:1])
    free = subprocess.run(probe, capture_output=True, text=True, check=True)
    assert free.stdout.strip() == str(allowed)


SYSTEM = {"role": "system", "content": "Answer from the passage."}


def chat(text: str, system: bool = True) -> list[dict[str, str]]:
    return ([SYSTEM] if system else []) + [{"role": "user", "content": text}]


def test_an_eval_sets_prompts_become_guidellms_data_file_cycled_over_the_sweep(tmp_path):
    profile = LoadProfile(
        concurrencies=[1, 2], requests_per_level=3, output_tokens=7, prompts_from="kb"
    )
    path = loadtest.write_prompts(
        [chat("q1"), chat("q2", system=False)], profile, tmp_path / "p.jsonl"
    )
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 6  # a row for each request of the sweep
    assert [r["prompt"] for r in rows] == ["q1", "q2"] * 3
    assert rows[0]["system_prompt"] == "Answer from the passage." and "system_prompt" not in rows[1]
    assert {r["output_tokens_count"] for r in rows} == {7}
    data = json.loads(loadtest.data_arg(profile, path))
    assert data == {"kind": "json_file", "path": str(path)}
    command = loadtest.build_command(
        "http://x", "m", tmp_path, profile, tmp_path / "r.json", prompts_file=path
    )
    assert command[command.index("--data") + 1] == json.dumps(data)
    # a server's next run (the tuner's next level) goes on where this one left off: with
    # more items than a run's requests, the next run's are items not sent yet
    texts = [chat(f"q{i}") for i in range(10)]
    few = profile.model_copy(update={"requests_per_level": 2})  # 4 requests a run
    runs = [
        loadtest.write_prompts(texts, few, tmp_path / f"{i}.jsonl", run_index=i) for i in (0, 1)
    ]
    sent = [[json.loads(x)["prompt"] for x in f.read_text().splitlines()][:4] for f in runs]
    assert sent == [["q0", "q1", "q2", "q3"], ["q4", "q5", "q6", "q7"]]


def test_prompts_from_a_set_that_gave_none_is_one_line_before_guidellm(monkeypatch, tmp_path):
    asked = fake_guidellm(monkeypatch, [[level(1, 4)]])
    profile = LoadProfile(concurrencies=[1], requests_per_level=4, prompts_from="kb")
    with pytest.raises(LoadTestError, match="prompts_from 'kb' gave no prompts"):
        loadtest.run_load_test("http://x", "m", tmp_path, profile, tmp_path / "load")
    assert asked == []


def test_the_sweep_is_handed_the_prompts_file(monkeypatch, tmp_path):
    seen = []

    def run(base_url, served_name, tokenizer_dir, profile, *args, prompts_file=None, **kwargs):
        seen.append(prompts_file)
        return [level(c, 4) for c in profile.concurrencies]

    monkeypatch.setattr(loadtest, "_run_guidellm", run)
    profile = LoadProfile(concurrencies=[1], requests_per_level=4, prompts_from="kb")
    loadtest.run_load_test(
        "http://x", "m", tmp_path, profile, tmp_path / "load", prompts=[chat("q")]
    )
    assert seen == [tmp_path / "load" / "prompts.jsonl"] and seen[0].exists()
    loadtest.run_load_test("http://x", "m", tmp_path, PROFILE, tmp_path / "synthetic")
    assert seen[1] is None
