"""The supervisor's policy and loop without processes: backoff doubling to its cap, a crash
loop after more than ``limit`` crashes in the window (older ones forgotten), a failed first
start reported rather than retried, a stop obeyed in every state. Effects are a script."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_release.serving.supervise import (
    Exit,
    RestartPolicy,
    after_exit,
    backoff_s,
    hung,
    supervise,
)

POLICY = RestartPolicy(backoff_s=2, backoff_max_s=10, limit=3, window_s=100)


def test_backoff_doubles_from_the_first_wait_up_to_the_cap():
    assert [backoff_s(POLICY, n) for n in range(0, 6)] == [0, 2, 4, 8, 10, 10]


def test_crashes_within_the_limit_restart_after_the_backoff():
    decision = after_exit(POLICY, [10.0], 20.0, -9, ever_healthy=True)
    assert decision.action == "restart" and decision.wait_s == 4
    assert decision.crashes == [10.0, 20.0]
    assert "exit code -9" in decision.reason and "crash 2" in decision.reason


def test_one_crash_more_than_the_limit_within_the_window_is_a_crash_loop():
    decision = after_exit(POLICY, [10.0, 20.0, 30.0], 40.0, 1, ever_healthy=True)
    assert decision.action == "give up"
    assert "4 crashes within 100 s" in decision.reason and "last exit code 1" in decision.reason


def test_crashes_older_than_the_window_are_forgotten_and_the_backoff_starts_over():
    decision = after_exit(POLICY, [10.0, 20.0, 30.0], 200.0, 1, ever_healthy=True)
    assert decision.action == "restart" and decision.crashes == [200.0]
    assert decision.wait_s == 2


def test_a_limit_of_zero_never_restarts():
    decision = after_exit(POLICY.model_copy(update={"limit": 0}), [], 5.0, 1, ever_healthy=True)
    assert decision.action == "give up"


def test_a_server_never_healthy_failed_to_start_and_is_not_retried():
    decision = after_exit(POLICY, [], 5.0, 2, ever_healthy=False)
    assert decision.action == "fail" and "before it was ever healthy" in decision.reason


def test_the_policy_refuses_nonsense():
    with pytest.raises(ValidationError):
        RestartPolicy(backoff_s=0)
    with pytest.raises(ValidationError):
        RestartPolicy(limit=-1)
    with pytest.raises(ValidationError):
        RestartPolicy(oops=1)


class Script:
    """The server's runs, scripted: each an Exit; the clock moves 30 s per run."""

    def __init__(self, runs: list[Exit], stop_during_sleep: int | None = None) -> None:
        self.runs = list(runs)
        self.clock = 0.0
        self.log: list[tuple] = []
        self.stop_during_sleep = stop_during_sleep
        self.reports: list[tuple[str, str]] = []

    def now(self) -> float:
        return self.clock

    def start(self) -> None:
        self.log.append(("start",))

    def watch(self) -> Exit:
        self.clock += 30
        return self.runs.pop(0)

    def reap(self) -> None:
        self.log.append(("reap",))

    def sleep(self, seconds: float) -> bool:
        self.log.append(("sleep", seconds))
        sleeps = sum(1 for e in self.log if e[0] == "sleep")
        return sleeps != self.stop_during_sleep

    def wait_for_stop(self) -> None:
        self.log.append(("wait for stop",))

    def report(self, state, **details) -> None:
        self.log.append(("report", state))
        self.reports.append((state, details.get("reason", "")))

    def count_restart(self) -> None:
        self.log.append(("restart",))


def events(script: Script, kind: str) -> list[tuple]:
    return [e for e in script.log if e[0] == kind]


def test_every_exit_is_reaped_and_a_crash_loop_waits_for_the_stop():
    script = Script([Exit(0, healthy=True), Exit(-9), Exit(-9), Exit(-9)])
    out = supervise(POLICY, script)
    assert out.state == "crash-looping" and out.restarts == 3
    assert len(events(script, "start")) == len(events(script, "reap")) == 4
    assert [e[1] for e in events(script, "sleep")] == [2, 4, 8]
    assert ("report", "crash-looping") in script.log
    assert script.log[-2:] == [("wait for stop",), ("report", "stopped")]


def test_a_first_start_that_dies_is_a_failure_with_its_exit_status():
    script = Script([Exit(3)])
    out = supervise(POLICY, script)
    assert out.state == "failed" and out.exit_status == 3
    assert events(script, "reap") == [("reap",)] and not events(script, "sleep")


def test_a_stop_while_serving_or_backing_off_restarts_nothing():
    serving = Script([Exit(None, healthy=True)])
    assert supervise(POLICY, serving).state == "stopped"
    assert events(serving, "reap") == [("reap",)] and not events(serving, "restart")

    backing_off = Script([Exit(1, healthy=True)], stop_during_sleep=1)
    out = supervise(POLICY, backing_off)
    assert out.state == "stopped" and out.restarts == 0
    assert len(events(backing_off, "start")) == 1


def test_a_healthy_server_silent_for_hang_after_s_is_hung():
    policy = RestartPolicy(hang_after_s=60)
    assert not hung(policy, last_answer=100.0, now=159.9)
    assert hung(policy, last_answer=100.0, now=160.0)


def test_a_hung_server_killed_by_the_supervisor_is_restarted_as_a_crash_and_said_so():
    script = Script([Exit(-9, healthy=True, hung=True), Exit(None, healthy=True)])
    out = supervise(POLICY, script)
    assert out.state == "stopped" and out.restarts == 1
    assert dict(script.reports)["backoff"].startswith("hung, killed; exit code -9; crash 1")
    plain = Script([Exit(-9, healthy=True), Exit(None, healthy=True)])
    supervise(POLICY, plain)
    assert dict(plain.reports)["backoff"].startswith("exit code -9; crash 1")
