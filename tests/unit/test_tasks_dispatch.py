"""tasks/dispatch.measure_on_host with Prefect's dispatch stood in: which host each attempt
goes to, under which idempotency key, and what the result says when an attempt is lost; and
send_away's orders: the baseline of a hub source fetched there by the measuring host (no
hand-over, no secret in the order), every other contender handed over."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import prefect.deployments
import pytest
from prefect.client.schemas.objects import State
from prefect.logging import disable_run_logger
from prefect.states import Completed, Crashed, Failed

import tasks.dispatch as dispatch
from llm_release.config import ReleaseConfig, ServingConfig
from llm_release.decision.contenders import Contender
from llm_release.decision.remote import MeasureOrder
from llm_release.errors import ConfigError
from llm_release.fleet import Placement
from llm_release.hub.acquire import Acquired
from llm_release.hub.handover import FleetHub, Handover
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


# ---------------------------------------------------------------- send_away: how each one goes

UPSTREAM = "http://127.0.0.1:8766"
HOME_HASHES = {"config.json": "1" * 64, "model.safetensors": "2" * 64}


class _Submitted:
    """A task's ``submit`` stood in: what it was given, a future already settled."""

    def __init__(self, answer):
        self.calls: list[tuple] = []
        self.answer = answer

    def submit(self, *args):
        self.calls.append(args)
        return SimpleNamespace(wait=lambda: None, state=self.answer(*args))


@pytest.fixture
def away(monkeypatch, tmp_path):
    """send_away with a baseline and a quantized candidate both placed on gpu_b, their
    hand-over and the measure run stood in; ``run(source)`` sends them."""
    commit = "c" * 40
    model_dir = tmp_path / "models" / "org--m" / commit
    model_dir.mkdir(parents=True)
    manifest = model_dir.with_name(commit + ".manifest.json")
    entries = [{"path": p, "sha256": s} for p, s in HOME_HASHES.items()]
    manifest.write_text(json.dumps({"files": entries}))
    acquired = Acquired(model_dir, manifest, commit, "org/m", 0, False, endpoint=UPSTREAM)
    contenders = [
        Contender(
            name="baseline",
            role="baseline",
            scheme="bf16",
            serving=ServingConfig(),
            model_dir=model_dir,
        ),
        Contender(
            name="w4a16",
            role="quantized",
            scheme="W4A16",
            serving=ServingConfig(),
            model_dir=Path(tmp_path / "w4a16"),
        ),
    ]
    published = Handover(
        repo_id="fleet/m-x",
        commit="b" * 40,
        endpoint="http://127.0.0.1:8765",
        files={"model.safetensors": "0" * 64},
    )
    handed = _Submitted(lambda *_: Completed(data=published))
    sent = _Submitted(lambda order, host, spare: Completed(data=order))
    monkeypatch.setattr(dispatch, "hand_over_contender", handed)
    monkeypatch.setattr(dispatch, "measure_on_host", sent)
    monkeypatch.setattr(dispatch, "get_run_logger", lambda: logging.getLogger("release"))
    placed = Placement(home="gpu_a", hosts={"baseline": "gpu_b", "w4a16": "gpu_b"})
    hub = FleetHub(endpoint="http://127.0.0.1:8765", org="fleet")

    def run(source: dict) -> dict:
        config = ReleaseConfig.model_validate({"source": source})
        out = dispatch.send_away(contenders, placed, hub, acquired, config, ORDER["run_id"], "m")
        states = {name: s if isinstance(s, State) else s.state for name, s in out.items()}
        return {name: state.result(raise_on_failure=False) for name, state in states.items()}

    return SimpleNamespace(run=run, handed=handed, sent=sent, published=published)


def test_the_baseline_of_a_hub_source_is_fetched_there_and_nothing_is_uploaded(away, monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_FLEET_BASELINE", raising=False)  # the default: upstream
    orders = away.run({"repo_id": "org/m", "endpoint": UPSTREAM, "credentials_block": "hub-r"})
    assert [call[0].name for call in away.handed.calls] == ["w4a16"]  # the baseline: none
    assert orders["w4a16"].handover == away.published
    baseline = orders["baseline"].handover
    assert (baseline.repo_id, baseline.commit, baseline.endpoint) == ("org/m", "c" * 40, UPSTREAM)
    assert baseline.files == HOME_HASHES and baseline.upstream.credentials_block == "hub-r"


@pytest.mark.parametrize(
    "setting, source",
    [
        ("handover", {"repo_id": "org/m", "endpoint": UPSTREAM}),  # the operator keeps them
        (None, {"repo_id": "org/m", "hub": "local", "local_path": "/srv/models/m"}),
    ],
)
def test_a_local_source_or_the_setting_keeps_the_baselines_hand_over(
    away, monkeypatch, setting, source
):
    if setting:
        monkeypatch.setenv("LLM_RELEASE_FLEET_BASELINE", setting)
    else:
        monkeypatch.delenv("LLM_RELEASE_FLEET_BASELINE", raising=False)
    orders = away.run(source)
    assert [call[0].name for call in away.handed.calls] == ["baseline", "w4a16"]
    assert all(
        o.handover == away.published and o.handover.upstream is None for o in orders.values()
    )


def test_the_order_sent_carries_no_secret(away, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_HomeSecretToken")
    monkeypatch.delenv("LLM_RELEASE_FLEET_BASELINE", raising=False)
    away.run({"repo_id": "org/m", "endpoint": UPSTREAM, "credentials_block": "hub-r"})
    for order, _, _ in away.sent.calls:
        parameters = order.model_dump_json()
        assert "hf_HomeSecretToken" not in parameters and '"token":' not in parameters


def test_a_baseline_that_cannot_be_fetched_from_its_source_fails_and_is_not_sent(away, monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_FLEET_BASELINE", raising=False)
    orders = away.run({"repo_id": "org/m", "endpoint": UPSTREAM, "credentials_block": "Not A Name"})
    assert [call[0].contender.name for call in away.sent.calls] == ["w4a16"]
    failed = orders["baseline"]
    assert failed.status == "failed" and "\n" not in failed.error
    assert failed.error.startswith("not to be fetched from the release's source by host gpu_b: ")
