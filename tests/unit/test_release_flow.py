"""The release flow reads as the runbook: one screen, each stage named and timed by stage().
Its measure stage measures every contender here outside a fleet, and in a fleet sends a
challenger home has no slot for to a free host, through the fleet's hub, or with every host
full has it wait for the first to free a slot (tasks stood in)."""

import inspect
import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prefect.states import Completed, Failed

import flows.release as release_flow
import tasks.dispatch as dispatch
from flows.release import release
from llm_release.config import ReleaseConfig, ServingConfig, SourceConfig
from llm_release.decision.contenders import Contender
from llm_release.errors import ConfigError, PublishError
from llm_release.fleet import GpuCard, HostCard
from llm_release.hub.acquire import Acquired
from llm_release.hub.handover import FleetHub, Handover
from llm_release.results import CandidateResult
from llm_release.serving.probe import HostSupport
from tests.unit.serving.test_probe import CPU, runtime

RUNBOOK = ["plan", "acquire", "probe", "quantize", "tune", "measure", "select", "promote", "canary"]


def test_the_release_flow_is_the_runbook_on_one_screen():
    lines, _ = inspect.getsourcelines(release.fn)
    assert len(lines) <= 50, f"flows/release.py:release is {len(lines)} lines (one screen: 50)"
    source = "".join(lines)
    assert re.findall(r'with stage\("([a-z]+)"\):', source) == RUNBOOK
    # No stage timed by hand, no report assembled from dicts: typed hand-offs only.
    assert "time.monotonic" not in source and "model_dump" not in source


# ---------------------------------------------------------------- the measure stage's placement


RUN = "20261206T120000Z-5e4d3c2b"
CONFIG = ReleaseConfig(
    source=SourceConfig(repo_id="org/m"), serving=ServingConfig(tensor_parallel_size=1)
)
HOST = HostSupport(
    host=CPU,
    runtime=runtime(1, 2),
    served_dtype="float32",
    dtype_reason="",
    calibration_dtype="float32",
)
FLEET_CALLS = ("release_fleet", "fleet_fits", "free_slots", "fleet_hub_access")


class _Task:
    """A task's ``submit`` stood in: what it was given, a future already settled."""

    def __init__(self, answer):
        self.calls: list[tuple] = []
        self.answer = answer

    def submit(self, *args, **kwargs):
        self.calls.append(args)
        state = self.answer(*args)
        return SimpleNamespace(wait=lambda: None, state=state)


def _measured(contender, *_):
    return Completed(data=CandidateResult(name=contender.name, scheme="x", status="measured"))


@pytest.fixture
def stage(monkeypatch, tmp_path):
    """measure_contenders with its tasks stood in; ``home`` measures here, ``sent`` elsewhere."""
    model = tmp_path / "model"
    contenders = [
        Contender(
            name="champion",
            role="champion",
            scheme="FP8",
            serving=ServingConfig(),
            model_dir=model,
            release_id="m-fp8-1",
        ),
        Contender(
            name="baseline",
            role="baseline",
            scheme="unquantized (float32)",
            serving=CONFIG.serving,
            model_dir=model,
        ),
        Contender(
            name="w4a16",
            role="quantized",
            scheme="W4A16",
            serving=CONFIG.serving,
            model_dir=tmp_path / "w4a16",
        ),
    ]
    home = _Task(_measured)
    handover = Handover(
        repo_id="fleet/m-x",
        commit="b" * 40,
        endpoint="http://127.0.0.1:8765",
        files={"model.safetensors": "0" * 64},
    )
    handed = _Task(lambda c, *_: Completed(data=handover))

    def measured_there(order, host, spare):
        result = CandidateResult(
            name=order.contender.name, scheme="x", status="measured", measured_on=host
        )
        return Completed(data=result)

    sent = _Task(measured_there)
    monkeypatch.setattr(release_flow, "measure_contender", home)
    monkeypatch.setattr(dispatch, "hand_over_contender", handed)
    monkeypatch.setattr(dispatch, "measure_on_host", sent)
    monkeypatch.setattr(dispatch.gpus, "host_gpus", lambda: [])
    monkeypatch.setattr(dispatch, "get_run_logger", lambda: logging.getLogger("release"))
    # a contender queued here: the fleet read again at once, and never for long
    monkeypatch.setattr(dispatch, "POLL_S", 0.0)
    monkeypatch.setattr(dispatch, "WAIT_S", 5.0)
    acquired = Acquired(model, model / "manifest.json", "c" * 40, "org/m", 0, True)

    def run() -> list[CandidateResult]:
        return release_flow.measure_contenders(
            contenders, acquired, CONFIG, HOST, RUN, tmp_path / "run", "svc"
        )

    return SimpleNamespace(
        run=run, home=home, handed=handed, sent=sent, handover=handover, run_dir=tmp_path / "run"
    )


def test_outside_a_fleet_every_contender_is_measured_here_and_the_fleet_is_not_asked(
    stage, monkeypatch
):
    monkeypatch.delenv("LLM_RELEASE_HOST_NAME", raising=False)
    for name in FLEET_CALLS:
        where = release_flow if name == "fleet_hub_access" else dispatch
        monkeypatch.setattr(where, name, lambda *a, n=name, **k: pytest.fail(f"{n} called"))
    results = stage.run()
    assert [r.name for r in results] == ["champion", "baseline", "w4a16"]
    assert [call[0].name for call in stage.home.calls] == ["champion", "baseline", "w4a16"]
    assert stage.home.calls[2][5] == stage.run_dir / "candidates" / "w4a16"
    assert stage.handed.calls == [] and stage.sent.calls == []


SHARED_RECORD = "postgresql+psycopg://release:secret@db.fleet/llm_release"


def card(name: str, gpus: int) -> HostCard:
    cards = [GpuCard(index=i, memory_gib=80.0) for i in range(gpus)]
    return HostCard(name=name, gpus=cards, source="stated", declared_at=datetime.now(UTC))


def fleet_of(monkeypatch, free: dict[str, int], fits=("gpu_b",), hub=None, gpus=None):
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", SHARED_RECORD)
    gpus = gpus or {}
    cards = [card(name, gpus.get(name, 1)) for name in ("gpu_a", *fits)]
    monkeypatch.setattr(dispatch, "release_fleet", lambda: cards)
    monkeypatch.setattr(dispatch, "folder_files", lambda model_dir: "headers")
    monkeypatch.setattr(dispatch, "fleet_fits", lambda *a: list(fits))
    monkeypatch.setattr(dispatch, "free_slots", lambda home, others: free)
    hub = hub or FleetHub(endpoint="http://127.0.0.1:8765", org="fleet")
    monkeypatch.setattr(release_flow, "fleet_hub_access", lambda: hub)
    return hub


def test_with_home_full_a_challenger_is_handed_over_and_sent_to_a_free_host(stage, monkeypatch):
    hub = fleet_of(monkeypatch, {"gpu_a": 2, "gpu_b": 1})
    results = stage.run()
    # home's two slots: the champion's and the baseline's; w4a16 goes to gpu_b
    assert [c[0].name for c in stage.home.calls] == ["champion", "baseline"]
    assert [(c[0].name, c[1]) for c in stage.handed.calls] == [("w4a16", hub)]
    assert stage.handed.calls[0][2:] == (RUN, "org/m", "c" * 40)
    ((order, host, spare),) = stage.sent.calls
    assert (host, spare) == ("gpu_b", ["gpu_a"])  # home, should gpu_b be lost
    assert order.run_id == RUN and order.release_host == "gpu_a" and order.public_name == "svc"
    assert order.contender.name == "w4a16" and order.contender.scheme == "W4A16"
    assert order.handover == stage.handover and order.evaluation == CONFIG.evaluation
    assert [(r.name, r.measured_on) for r in results] == [
        ("champion", None),
        ("baseline", None),
        ("w4a16", "gpu_b"),
    ]


def test_a_contender_on_every_gpu_is_counted_with_each_hosts_own_gpus(stage, monkeypatch):
    # gpus "all": home has 8 GPUs and 4 free slots, gpu_b 2 GPUs and both free. Counted
    # with home's 8, it could go nowhere and would wait at home; gpu_b holds it in its 2.
    fleet_of(monkeypatch, {"gpu_a": 4, "gpu_b": 2}, gpus={"gpu_a": 8, "gpu_b": 2})
    monkeypatch.setattr(dispatch.gpus, "host_gpus", lambda: list(range(8)))
    everywhere = ServingConfig(gpus="all")
    contenders = [
        Contender(name=n, role="quantized", scheme="W4A16", serving=everywhere, model_dir=Path(n))
        for n in ("w4a16", "fp8")
    ]
    acquired = Acquired(Path("m"), Path("m/manifest.json"), "c" * 40, "org/m", 0, True)
    placed = dispatch.place_contenders(contenders, acquired, CONFIG, HOST)
    assert placed.hosts == {"w4a16": "gpu_b", "fp8": "gpu_a"}
    assert placed.queued == ["fp8"]  # gpu_b's 2 slots taken: it waits for home's 8


def test_with_home_free_nothing_leaves_home_and_no_hub_is_needed(stage, monkeypatch):
    fleet_of(monkeypatch, {"gpu_a": 3, "gpu_b": 4})
    monkeypatch.setattr(release_flow, "fleet_hub_access", lambda: pytest.fail("hub asked"))
    stage.run()
    assert len(stage.home.calls) == 3 and stage.sent.calls == []


def test_a_fleet_without_its_hub_is_refused_before_any_measurement(stage, monkeypatch):
    fleet_of(monkeypatch, {"gpu_a": 1, "gpu_b": 4})

    def unset():
        raise ConfigError("LLM_RELEASE_FLEET_HUB_ENDPOINT is unset", hint="set it")

    monkeypatch.setattr(release_flow, "fleet_hub_access", unset)
    with pytest.raises(ConfigError, match="FLEET_HUB_ENDPOINT is unset"):
        stage.run()
    assert stage.home.calls == [] and stage.handed.calls == [] and stage.sent.calls == []


def test_a_failed_hand_over_is_the_contenders_failure_and_nothing_is_sent(stage, monkeypatch):
    fleet_of(monkeypatch, {"gpu_a": 2, "gpu_b": 1})
    error = PublishError("publishing to fleet/m-x failed: 403", hint="check the token")
    stage.handed.answer = lambda *_: Failed(data=error)
    results = stage.run()
    assert stage.sent.calls == []
    failed = results[2]
    assert failed.name == "w4a16" and failed.status == "failed"
    assert failed.error.startswith("not handed over to the fleet's hub for host gpu_b: ")
    assert "403" in failed.error


def test_with_every_host_full_a_challenger_waits_then_is_measured_here(stage, monkeypatch, caplog):
    fleet_of(monkeypatch, {"gpu_a": 0, "gpu_b": 0})
    monkeypatch.setattr(dispatch, "WAIT_S", 0.0)  # no host frees a slot in time
    with caplog.at_level(logging.INFO, logger="release"):
        stage.run()
    assert len(stage.home.calls) == 3 and stage.sent.calls == []
    assert "baseline: no host it fits has a free slot now (gpu_a 0, gpu_b 0)" in caplog.text
    assert "baseline, w4a16 wait for the first host they fit to free a slot" in caplog.text
    assert "baseline, w4a16: no host freed a slot in 0 s; measured on this host" in caplog.text


def reads(monkeypatch, *answers):
    """free_slots stood in: each read the next answer (an exception is raised), the last
    one again and again; the reads made are counted."""
    made = []

    def free_slots(home, others):
        made.append((home, others))
        answer = answers[min(len(made), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(dispatch, "free_slots", free_slots)
    return made


def test_a_challenger_queued_here_goes_to_the_host_that_frees_a_slot_first(
    stage, monkeypatch, caplog
):
    hub = fleet_of(monkeypatch, {})
    # home's two slots: the champion's and the baseline's; w4a16 waits. Both measure at once
    # (home's count falls), then gpu_b frees a slot.
    made = reads(
        monkeypatch,
        {"gpu_a": 2, "gpu_b": 0},
        {"gpu_a": 0, "gpu_b": 0},
        {"gpu_a": 0, "gpu_b": 1},
        {"gpu_a": 1, "gpu_b": 1},
    )
    with caplog.at_level(logging.INFO, logger="release"):
        results = stage.run()
    assert len(made) == 3 and made[-1] == ("gpu_a", ["gpu_b"])
    assert [c[0].name for c in stage.home.calls] == ["champion", "baseline"]
    assert [(c[0].name, c[1]) for c in stage.handed.calls] == [("w4a16", hub)]
    ((order, host, spare),) = stage.sent.calls
    assert (order.contender.name, host, spare) == ("w4a16", "gpu_b", ["gpu_a"])
    assert order.handover == stage.handover and order.release_host == "gpu_a"
    assert results[2].name == "w4a16" and results[2].measured_on == "gpu_b"
    assert (
        "w4a16 wait for the first host they fit to free a slot (free slots: gpu_a 2, gpu_b 0)"
        in caplog.text
    )
    assert "w4a16: host gpu_b has a free slot (gpu_a 0, gpu_b 1): measured there" in caplog.text


def test_a_challenger_queued_here_is_measured_here_when_home_frees_a_slot_first(
    stage, monkeypatch, caplog
):
    fleet_of(monkeypatch, {})
    made = reads(
        monkeypatch,
        {"gpu_a": 2, "gpu_b": 0},
        {"gpu_a": 0, "gpu_b": 0},
        {"gpu_a": 1, "gpu_b": 0},
        {"gpu_a": 1, "gpu_b": 1},
    )
    with caplog.at_level(logging.INFO, logger="release"):
        results = stage.run()
    assert len(made) == 3  # it waited for home's slot, and took it at once
    assert "w4a16: host gpu_a has a free slot (gpu_a 1, gpu_b 0): measured there" in caplog.text
    assert [c[0].name for c in stage.home.calls] == ["champion", "baseline", "w4a16"]
    assert stage.home.calls[2][5] == stage.run_dir / "candidates" / "w4a16"
    assert stage.handed.calls == [] and stage.sent.calls == []
    assert [r.name for r in results] == ["champion", "baseline", "w4a16"]


def test_a_measurement_here_that_ended_gives_its_slots_to_the_queued(stage, monkeypatch, caplog):
    # the champion's and the baseline's measurements end without home's count moving (a
    # champion whose measurement is reused never takes its slot): w4a16 takes them at once
    fleet_of(monkeypatch, {})
    made = reads(monkeypatch, {"gpu_a": 2, "gpu_b": 0})
    with caplog.at_level(logging.INFO, logger="release"):
        stage.run()
    assert len(made) == 2
    assert [c[0].name for c in stage.home.calls] == ["champion", "baseline", "w4a16"]
    assert "w4a16: host gpu_a has a free slot (gpu_a 2, gpu_b 0): measured there" in caplog.text


def test_a_fleet_that_cannot_be_read_while_waiting_measures_the_queued_here(
    stage, monkeypatch, caplog
):
    fleet_of(monkeypatch, {})
    reads(monkeypatch, {"gpu_a": 2, "gpu_b": 0}, httpx.ConnectError("connection refused"))
    with caplog.at_level(logging.WARNING, logger="release"):
        stage.run()
    assert [c[0].name for c in stage.home.calls] == ["champion", "baseline", "w4a16"]
    assert stage.sent.calls == []
    assert "fleet: free slots not read while waiting (connection refused); w4a16" in caplog.text


def test_a_fleet_that_cannot_be_read_leaves_every_contender_here(stage, monkeypatch, caplog):
    fleet_of(monkeypatch, {})

    def down(home, others):
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(dispatch, "free_slots", down)
    with caplog.at_level(logging.WARNING, logger="release"):
        stage.run()
    assert len(stage.home.calls) == 3 and stage.sent.calls == []
    assert "fleet: not read (connection refused)" in caplog.text


def test_a_fleet_without_a_shared_record_measures_everything_here(stage, monkeypatch, caplog):
    fleet_of(monkeypatch, {"gpu_a": 0, "gpu_b": 4})
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL")
    for name in FLEET_CALLS:
        where = release_flow if name == "fleet_hub_access" else dispatch
        monkeypatch.setattr(where, name, lambda *a, n=name, **k: pytest.fail(f"{n} called"))
    with caplog.at_level(logging.WARNING, logger="release"):
        stage.run()
    assert len(stage.home.calls) == 3 and stage.sent.calls == []
    assert "the record is this host's own (LLM_RELEASE_DATABASE_URL unset)" in caplog.text
