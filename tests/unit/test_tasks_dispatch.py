"""tasks/dispatch.measure_on_host with Prefect's dispatch stood in: which host each attempt
goes to, under which idempotency key, and what the result says when an attempt is lost."""

from __future__ import annotations

from types import SimpleNamespace

import prefect.deployments
import pytest
from prefect.logging import disable_run_logger
from prefect.states import Completed, Crashed, Failed

import tasks.dispatch as dispatch
from llm_release.decision.remote import MeasureOrder
from llm_release.errors import ConfigError
from llm_release.results import CandidateResult

ORDER = {
    "run_id": "20261206T120000Z-5e4d3c2b",
    "release_host": "gpu_a",
    "public_name": "tiny",
    "contender": {"name": "baseline", "role": "baseline", "scheme": "unquantized", "serving": {}},
    "handover": {
        "repo_id": "fleet/tiny-baseline",
        "commit": "a" * 40,
        "endpoint": "http://127.0.0.1:8765",
        "files": {"model.safetensors": "0" * 64},
    },
    "evaluation": {},
    "load": {},
}
LOST = "lost: no heartbeat for 120 s (its host or its worker went away)"


@pytest.fixture
def fleet(monkeypatch):
    """Hosts gpu_a, gpu_b, gpu_c joined; each host's run ends as ``ends[host]`` says."""
    sent: list[tuple[str, str]] = []
    ends: dict[str, object] = {}

    def run_deployment(name, parameters, work_queue_name, idempotency_key, **_):
        host = work_queue_name.removeprefix("host-")
        sent.append((host, idempotency_key))
        return SimpleNamespace(id=f"id-{host}", name=f"run-{host}", state=ends[host])

    monkeypatch.setattr(prefect.deployments, "run_deployment", run_deployment)
    monkeypatch.setattr(dispatch, "host_queues", lambda: ["gpu_a", "gpu_b", "gpu_c"])
    measured = CandidateResult(name="baseline", scheme="unquantized", status="measured")
    monkeypatch.setattr(dispatch.measurements, "of_run", lambda run_id, name: measured)
    return SimpleNamespace(sent=sent, ends=ends)


def measure(host: str, elsewhere=()) -> CandidateResult:
    with disable_run_logger():
        out = dispatch.measure_on_host.fn(
            MeasureOrder.model_validate(ORDER), host, elsewhere, timeout_s=5
        )
    return out if isinstance(out, CandidateResult) else out.result(raise_on_failure=False)


def test_a_run_lost_with_its_host_is_measured_again_on_the_next_host(fleet):
    fleet.ends.update(gpu_a=Crashed(message=LOST), gpu_b=Completed())
    result = measure("gpu_a", ["gpu_b", "gpu_c"])
    assert fleet.sent == [
        ("gpu_a", "20261206T120000Z-5e4d3c2b/baseline/1"),
        ("gpu_b", "20261206T120000Z-5e4d3c2b/baseline/2"),
    ]
    assert result.status == "measured" and result.measured_on == "gpu_b"
    assert result.lost == [f"host gpu_a, flow run run-gpu_a: {LOST}"]


def test_a_measurement_that_failed_is_not_sent_again(fleet):
    fleet.ends.update(gpu_a=Failed(message="vLLM did not start"), gpu_b=Completed())
    result = measure("gpu_a", ["gpu_b"])
    assert [host for host, _ in fleet.sent] == ["gpu_a"]  # a failure is the contender's own
    assert result.status == "failed" and "vLLM did not start" in result.error


def test_with_no_host_left_the_lost_attempts_are_the_failure(fleet):
    fleet.ends.update(gpu_a=Crashed(message=LOST), gpu_b=Crashed(message=LOST))
    result = measure("gpu_a", ["gpu_b", "gpu_x"])  # gpu_x never joined: not sent to
    assert [host for host, _ in fleet.sent] == ["gpu_a", "gpu_b"]
    assert result.status == "failed" and result.measured_on == "gpu_b"
    assert "Crashed" in result.error and len(result.lost) == 1


def test_a_host_that_never_joined_is_refused_before_any_run(fleet):
    with pytest.raises(ConfigError, match="gpu_z has not joined"):
        measure("gpu_z", ["gpu_a"])
    assert fleet.sent == []
