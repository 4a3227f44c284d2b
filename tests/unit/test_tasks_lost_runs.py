"""The watch on lost measure runs (tasks/lost_runs.py) as it is defined: which runs it
watches, when it fires and what it does; and the beat every measure run is given."""

from __future__ import annotations

from pathlib import Path

import yaml
from prefect.client.schemas.objects import StateType
from prefect.events.schemas.automations import Posture

from tasks.lost_runs import FLOW, HEARTBEAT_S, LOST_AFTER_S, lost_run_watch

ROOT = Path(__file__).resolve().parents[2]


def test_the_watch_crashes_a_measure_run_that_stopped_beating_and_nothing_else():
    watch = lost_run_watch()
    trigger = watch.trigger
    assert trigger.posture == Posture.Proactive
    assert trigger.after == {"prefect.flow-run.heartbeat"}
    # a beat or any end of the run clears it; one per flow run
    assert {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed"} <= trigger.expect
    assert {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"} <= trigger.expect
    assert trigger.for_each == {"prefect.resource.id"}
    assert trigger.within.total_seconds() == LOST_AFTER_S
    # only the runs of the measure flow: a long release run elsewhere is never touched
    related = trigger.match_related
    assert related.get("prefect.resource.role") == ["flow"]
    assert related.get("prefect.resource.name") == [FLOW]
    (action,) = watch.actions
    assert action.state == StateType.CRASHED
    assert f"no heartbeat for {LOST_AFTER_S} s" in action.message


def test_every_measure_run_beats_often_enough_for_the_watch():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    (measure,) = [d for d in spec["deployments"] if d["name"] == "measure"]
    env = measure["work_pool"]["job_variables"]["env"]
    assert int(env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]) == HEARTBEAT_S
    assert LOST_AFTER_S >= 3 * HEARTBEAT_S  # three beats missed before a run is called lost


def test_a_shorter_window_is_the_tests_alone():
    assert lost_run_watch(40).trigger.within.total_seconds() == 40
    assert "no heartbeat for 40 s" in lost_run_watch(40).actions[0].message
