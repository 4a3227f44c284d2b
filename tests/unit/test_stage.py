"""stage(): each stage of a flow named in the log and timed, in order; a failure recorded."""

import logging

import pytest

from tasks.stage import StageClock


class Clock:
    """A clock that reads each of ``ticks`` in turn."""

    def __init__(self, *ticks: float) -> None:
        self.ticks = list(ticks)

    def __call__(self) -> float:
        return self.ticks.pop(0)


@pytest.fixture()
def log(caplog):
    caplog.set_level(logging.INFO, logger="prefect.stage")
    return caplog


def test_a_stage_is_named_and_timed_in_the_order_the_stages_ran(log):
    stage = StageClock(Clock(100.0, 102.34, 200.0, 200.05))
    with stage("plan"):
        pass
    with stage("acquire"):
        pass
    assert stage.seconds == {"plan": 2.3, "acquire": 0.1}
    assert list(stage.seconds) == ["plan", "acquire"]
    assert stage.failed is None
    assert "stage plan done in 2.3 s" in log.messages
    assert "stage acquire done in 0.1 s" in log.messages


def test_a_stage_that_raises_is_recorded_as_failed_and_the_error_goes_on(log):
    stage = StageClock(Clock(0.0, 1.0, 5.0, 12.5))
    with stage("probe"):
        pass
    with pytest.raises(RuntimeError, match="no vLLM"):
        with stage("measure"):
            raise RuntimeError("no vLLM")
    assert stage.failed == "measure"
    assert stage.seconds == {"probe": 1.0, "measure": 7.5}
    failure = [r for r in log.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failure] == ["stage measure failed after 7.5 s"]


def test_the_real_clock_times_a_stage():
    import time

    stage = StageClock()
    with stage("quantize"):
        time.sleep(0.2)
    assert 0.2 <= stage.seconds["quantize"] < 1.0
