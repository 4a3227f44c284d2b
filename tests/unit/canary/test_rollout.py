"""The rollout policy: steps, consecutive passing windows, failure limit, inconclusive
windows, approval. The windows' verdicts are given; how they are measured is tested in
tests/integration/test_prometheus_vllm.py and tests/e2e/test_canary_e2e.py."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.rollout import Answer, evidence_markdown, longest_rollout_s, walk
from llm_release.config import ReleaseConfig, RolloutConfig


def verdict(outcome: str, reason: str = "") -> WindowVerdict:
    return WindowVerdict(
        service="svc",
        prometheus_url="http://127.0.0.1:9090",
        started_at=1_800_000_000.0,
        ended_at=1_800_000_060.0,
        window_s=60,
        canary_requests=20.0,
        stable_requests=380.0,
        checks=[],
        verdict=outcome,
        reason=reason or outcome,
    )


class Script:
    """Answers the walk with scripted verdicts and answers; records what it was asked."""

    def __init__(self, verdicts: list[str], answers: list[bool] | None = None):
        self.verdicts = list(verdicts)
        self.answers = list(answers or [])
        self.log: list[tuple] = []
        self.live = True
        self.looping: str | None = None

    def still_canary(self) -> bool:
        return self.live

    def crash_looping(self) -> str | None:
        return self.looping

    def set_weight(self, weight: int) -> None:
        self.log.append(("weight", weight))

    def warm_up(self, weight: int, seconds: float) -> None:
        self.log.append(("warm-up", weight, seconds))

    def analyze(self, weight: int, index: int) -> WindowVerdict:
        self.log.append(("window", weight, index))
        return verdict(self.verdicts.pop(0))

    def ask(self, question, windows) -> Answer:
        self.log.append(("ask", question, len(windows)))
        approve = self.answers.pop(0)
        return Answer(approve=approve, note="yes" if approve else "no", by="person")

    def promote(self) -> None:
        self.log.append(("promote",))

    def rollback(self, reason: str) -> None:
        self.log.append(("rollback", reason))


def config(**kw) -> RolloutConfig:
    return RolloutConfig.model_validate({"windows_per_step": 2} | kw)


def test_healthy_canary_walks_every_step_then_asks_before_100():
    script = Script(["pass"] * 6, answers=[True])
    out = walk(config(), "r1", script)
    assert out.status == "promoted" and out.reached_weight == 100
    assert [e for e in script.log if e[0] == "weight"] == [("weight", 25), ("weight", 50)]
    assert ("ask", "promote", 6) in script.log and script.log[-1] == ("promote",)
    assert [(w.weight, w.index) for w in out.windows] == [
        (5, 1),
        (5, 2),
        (25, 1),
        (25, 2),
        (50, 1),
        (50, 2),
    ]


def test_a_step_needs_consecutive_passes():
    # pass, inconclusive, pass, pass: the inconclusive window breaks the run of passes.
    script = Script(["pass", "inconclusive", "pass", "pass"] + ["pass"] * 4, answers=[True])
    out = walk(config(), "r1", script)
    assert [w.weight for w in out.windows][:4] == [5, 5, 5, 5]
    assert out.status == "promoted"


def test_failure_beyond_the_limit_rolls_back_at_once_with_the_reason():
    script = Script(["pass", "pass", "fail"])
    out = walk(config(), "r1", script)
    assert out.status == "rolled back" and out.reached_weight == 25
    assert script.log[-1][0] == "rollback" and "25%" in script.log[-1][1]
    assert not any(e[0] == "promote" for e in script.log)


class LoopsAfter(Script):
    """The canary's server starts crash-looping during window ``n`` (a passing one)."""

    def __init__(self, n: int, verdicts: list[str]):
        super().__init__(verdicts)
        self.n = n

    def crash_looping(self) -> str | None:
        windows = sum(1 for e in self.log if e[0] == "window")
        return "6 crashes within 600 s" if windows >= self.n else None


def test_a_crash_looping_canary_is_rolled_back_at_once_whatever_the_windows_say():
    # The failure limit would tolerate one failing window; a crash loop is not a window.
    script = LoopsAfter(3, ["pass"] * 6)
    out = walk(config(failure_limit=1), "r1", script)
    assert out.status == "rolled back" and out.reached_weight == 25
    assert len(out.windows) == 3 and out.windows[-1].verdict.verdict == "pass"
    assert script.log[-1][0] == "rollback"
    assert "crash-looping at 25%" in out.reason and "6 crashes" in out.reason
    assert not any(e[0] in ("promote", "ask") for e in script.log)


def test_a_canary_already_crash_looping_is_rolled_back_before_any_window():
    script = LoopsAfter(0, ["pass"] * 6)
    out = walk(config(), "r1", script)
    assert out.status == "rolled back" and out.windows == []
    assert [e[0] for e in script.log] == ["rollback"]


def test_failures_within_the_limit_are_tolerated_but_reset_the_step():
    script = Script(["fail", "pass", "pass", "pass", "pass", "pass", "pass"], answers=[True])
    out = walk(config(failure_limit=1), "r1", script)
    assert out.status == "promoted" and len(out.windows) == 7


def test_too_many_inconclusive_windows_ask_a_person_who_can_roll_back():
    script = Script(["inconclusive"] * 3, answers=[False])
    out = walk(config(inconclusive_limit=3), "r1", script)
    assert ("ask", "inconclusive", 3) in script.log
    assert out.status == "rolled back" and "inconclusive" in out.reason


def test_a_person_can_accept_an_inconclusive_step():
    script = Script(["inconclusive"] * 3 + ["pass"] * 4, answers=[True, True])
    out = walk(config(inconclusive_limit=3), "r1", script)
    assert out.status == "promoted"
    assert [e[1] for e in script.log if e[0] == "ask"] == ["inconclusive", "promote"]


def test_a_rejected_or_unanswered_promotion_rolls_back():
    script = Script(["pass"] * 6, answers=[False])
    out = walk(config(), "r1", script)
    assert out.status == "rolled back" and "not approved" in out.reason
    assert not any(e[0] == "promote" for e in script.log)


def test_a_manual_override_ends_the_walk_without_touching_the_router():
    script = Script(["pass"] * 6)
    script.live = False
    out = walk(config(), "r1", script)
    assert out.status == "overridden" and script.log == []


def test_hold_mode_does_nothing():
    script = Script([])
    out = walk(config(mode="hold"), "r1", script)
    assert out.status == "held" and script.log == []


def test_a_resumed_walk_starts_at_the_current_weight():
    script = Script(["pass"] * 2, answers=[True])
    out = walk(config(), "r1", script, current_weight=50)
    assert [w.weight for w in out.windows] == [50, 50] and out.status == "promoted"


@pytest.mark.parametrize("steps", [[5, 25, 50], [25, 5, 100], [0, 100], [5, 5, 100], [60, 100], []])
def test_bad_steps_are_refused_with_the_rule(steps):
    with pytest.raises(ValidationError):
        RolloutConfig(steps=steps)


def test_release_config_has_the_rollout_defaults():
    cfg = ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}})
    assert cfg.rollout.steps == [5, 25, 50, 100] and cfg.rollout.first_weight == 5
    assert cfg.rollout.approval == "ask" and cfg.rollout.mode == "progressive"


def test_traffic_bound_covers_the_longest_walk():
    cfg = config(windows_per_step=2, inconclusive_limit=3, failure_limit=1)
    per_window = cfg.analysis.window_s
    # three steps below 100, each up to 2 + 3 windows, plus one tolerated failure
    assert longest_rollout_s(cfg) >= per_window * (3 * 5 + 1)
    # The quality probes after each window lengthen every window alike.
    assert longest_rollout_s(cfg, probe_s=30) == longest_rollout_s(cfg) + 30 * (3 * 5 + 1)


def test_evidence_lists_every_window_and_escapes_cells():
    from llm_release.canary.rollout import WindowRecord

    records = [WindowRecord(weight=5, index=1, verdict=verdict("fail", "TTFT | 3x"))]
    text = evidence_markdown(records)
    assert table_rows(text)[0][:2] == ["5%", "1"] and "TTFT \\| 3x" in text
    # Each row splits into exactly the seven columns: the escaped '|' stays inside its cell.
    assert table_rows(text) == [
        ["5%", "1", "**verdict**", "20 req", "380 req", "60 s window", "**fail**: TTFT \\| 3x"]
    ]


def table_rows(markdown: str) -> list[list[str]]:
    """The body cells of a markdown table (header and separator lines left out)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")][2:]
    return [[c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]


def test_evidence_shows_each_check_under_its_window_with_the_reason_of_a_miss():
    from llm_release.canary.analysis import CheckResult
    from llm_release.canary.rollout import WindowRecord

    checks = [
        CheckResult(
            name="ttft_p95",
            canary=0.123456,
            stable=None,
            rule="canary <= 1.5 x stable | 0.2",
            outcome="fail",
            reason="3x\nslower",
        ),
        CheckResult(
            name="errors", canary=0.0, stable=0.0, rule="<= 1%", outcome="pass", reason="ok"
        ),
    ]
    record = WindowRecord(
        weight=25, index=2, verdict=verdict("fail").model_copy(update={"checks": checks})
    )
    assert table_rows(evidence_markdown([record]))[1:] == [
        [
            "",
            "",
            "ttft_p95",
            "0.1235",
            "no data",
            "canary <= 1.5 x stable \\| 0.2",
            "fail: 3x slower",
        ],
        ["", "", "errors", "0", "0", "<= 1%", "pass"],
    ]
    assert evidence_markdown([]) == "_No analysis window ran._\n"


def test_the_canary_warms_up_once_before_the_first_window_only():
    script = Script(["pass"] * 6, answers=[True])
    walk(config(warmup_s=45), "r1", script)
    assert script.log[0] == ("warm-up", 5, 45)
    assert [e for e in script.log if e[0] == "warm-up"] == [("warm-up", 5, 45)]
    assert script.log[1] == ("window", 5, 1)


def test_no_warm_up_when_it_is_zero():
    script = Script(["pass"] * 6, answers=[True])
    walk(config(warmup_s=0), "r1", script)
    assert not any(e[0] == "warm-up" for e in script.log)
