"""A measure run whose host dies is marked Crashed by Prefect's own automation (issue 37,
item 3), against a real Prefect server: two hosts serve a flow named ``measure`` (Prefect's
runner, which runs each flow run in a process of its own and beats for it), one host's
process group is killed mid-run, and the watch of ``tasks/lost_runs.py`` moves that run to
Crashed with its reason while the other host's run, beating, ends Completed; the crashed
run, were it to come back, is told it was given up (the fence of flows/measure.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BEAT_S = 30  # Prefect's minimum heartbeat
# the watch's window in this test: two beats, so a beat a loaded host sends late is not taken
# for a lost run
WINDOW_S = 2 * BEAT_S

HOST = textwrap.dedent(
    """
    import sys, time
    from prefect import flow

    @flow(name="measure")
    def measure(seconds: float) -> str:
        time.sleep(seconds)
        return "measured"

    if __name__ == "__main__":
        measure.serve(name=sys.argv[1])
    """
)


def python(env: dict, code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def watch(env: dict, window_s: int) -> str:
    return python(
        env,
        "from tasks.lost_runs import ensure_lost_run_watch as e; "
        f"a = e({window_s}); print(a.id, a.trigger.within.total_seconds(), a.enabled)",
    )


def start(env: dict, deployment: str, seconds: float) -> str:
    return python(
        env,
        "from prefect.deployments import run_deployment; "
        f"print(run_deployment('measure/{deployment}', parameters={{'seconds': {seconds}}}, "
        "timeout=0).id)",
    )


def state_of(env: dict, run_id: str) -> tuple[str, str]:
    code = (
        "import sys; from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        f"    s = c.read_flow_run('{run_id}').state\n"
        "print(s.name); print((s.message or '').replace(chr(10), ' '))"
    )
    name, _, message = python(env, code).partition("\n")
    return name, message


def beat_to_crash_s(env: dict, run_id: str) -> float:
    """Seconds from the run's start (its first beat goes as it starts) to its present state,
    by the server's clock."""
    code = (
        "from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        f"    r = c.read_flow_run('{run_id}')\n"
        "print((r.state.timestamp - r.start_time).total_seconds())"
    )
    return float(python(env, code))


def given_up_on(env: dict, run_id: str) -> str:
    """What tasks.lost_runs.given_up_on says inside flow run ``run_id``."""
    code = "from tasks.lost_runs import given_up_on; print(given_up_on())"
    return python(env | {"PREFECT__FLOW_RUN_ID": run_id}, code)


def until(env: dict, run_id: str, names: set[str], limit_s: float) -> tuple[str, str]:
    ends = time.monotonic() + limit_s
    seen = state_of(env, run_id)
    while seen[0] not in names and time.monotonic() < ends:
        time.sleep(2)
        seen = state_of(env, run_id)
    return seen


def test_a_killed_hosts_measure_run_is_crashed_and_a_beating_one_is_not(prefect_api, tmp_path):
    env = prefect_api | {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(BEAT_S)}
    first = watch(env, WINDOW_S)
    # made once: a second join finds it; an edited one is put back as defined
    assert watch(env, WINDOW_S) == first
    python(
        env,
        "from prefect.automations import Automation as A; a = A.read(name="
        "'llm-release: lost measure runs'); a.enabled = False; a.update()",
    )
    assert watch(env, WINDOW_S).split()[1:] == [f"{float(WINDOW_S)}", "True"]

    script = tmp_path / "host.py"
    script.write_text(HOST)
    hosts = {
        name: subprocess.Popen(
            [sys.executable, str(script), name],
            cwd=tmp_path,
            env=env,
            stdout=(tmp_path / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for name in ("gpu_a", "gpu_b")
    }
    try:
        for name in hosts:  # each runner made its deployment
            ends = time.monotonic() + 90
            while time.monotonic() < ends and "gpu" not in (tmp_path / f"{name}.log").read_text():
                time.sleep(1)
        lost = start(env, "gpu_a", 600)
        kept = start(env, "gpu_b", BEAT_S + WINDOW_S + 10)  # beats at least twice
        assert until(env, lost, {"Running"}, 90)[0] == "Running"
        assert until(env, kept, {"Running"}, 90)[0] == "Running"
        time.sleep(3)  # the first beat is sent as the run starts
        os.killpg(hosts["gpu_a"].pid, signal.SIGKILL)  # the host goes away with its run

        name, message = until(env, lost, {"Crashed", "Completed", "Failed"}, WINDOW_S + 60)
        assert name == "Crashed", (name, message)
        assert f"no heartbeat for {WINDOW_S} s" in message
        # not before its window, counted from its last beat (sent as it started)
        assert beat_to_crash_s(env, lost) >= WINDOW_S - 1
        # the fence of flows/measure.py: a run that comes back after this stops before the GPU
        assert given_up_on(env, lost).startswith("Crashed on the Prefect server: lost:")
        assert given_up_on(env, kept) == "None"  # still beating
        assert until(env, kept, {"Completed", "Crashed", "Failed"}, 120)[0] == "Completed"
    finally:
        for proc in hosts.values():
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
