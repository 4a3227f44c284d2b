"""The measure stage on a host with several GPUs (issue 27), against a real Prefect API and
the real GPU ledger: candidates are measured side by side on disjoint GPUs, one that needs
more GPUs than are free waits, and a one-slot host measures one at a time. This machine has
no GPU: the host's GPU list is given, and the measurement is one that claims its GPUs from
the ledger as a server does and holds them for a while (the real one is the release e2e's)."""

import threading
import time
from pathlib import Path

import pytest
from prefect import flow

from flows.release import measure_contenders
from llm_release.config import ReleaseConfig, ServingConfig, SourceConfig
from llm_release.decision.contenders import Contender
from llm_release.hub.acquire import Acquired
from llm_release.results import CandidateResult
from llm_release.serving import gpus
from llm_release.serving.probe import HostSupport
from tasks import candidate as candidate_task
from tasks.slots import set_host_limit
from tests.unit.serving.test_probe import CPU, runtime

pytestmark = [pytest.mark.integration]

# Longer than a waiter's longest pause between tries (3 s) and its jitter, so measurements
# that run together overlap by more than half of it whatever order they took slots in.
HOLD_S = 6.0
CONFIG = ReleaseConfig(source=SourceConfig(repo_id="org/m"))
HOST = HostSupport(
    host=CPU,
    runtime=runtime(1, 2),
    served_dtype="float32",
    dtype_reason="",
    calibration_dtype="float32",
)


@pytest.fixture(scope="module")
def prefect_api():
    from prefect.testing.utilities import prefect_test_harness

    from tests.helpers import drain_prefect_slot_services

    with prefect_test_harness(server_startup_timeout=120):
        try:
            yield
        finally:
            drain_prefect_slot_services()


@pytest.fixture()
def measured(monkeypatch, home):
    """Each measurement's GPUs and its start and end, as the flow ran them."""
    spans: dict[str, tuple[float, float, list[int]]] = {}
    lock = threading.Lock()

    def measure(*, name, scheme, serving, **_):
        holder = f"candidate-{name}"
        taken = gpus.claim(holder, serving, gpus.host_gpus())  # refuses a GPU held
        start = time.monotonic()
        time.sleep(HOLD_S)
        end = time.monotonic()
        gpus.give_back(holder)
        with lock:
            spans[name] = (start, end, taken)
        return CandidateResult(name=name, scheme=scheme, status="measured", gpus=taken)

    monkeypatch.setattr(candidate_task, "measure", measure)
    return spans


def contender(name: str, model_dir: Path, **serving) -> Contender:
    return Contender(
        name=name,
        role="quantized",
        scheme="FP8_DYNAMIC",
        serving=ServingConfig(**serving),
        model_dir=model_dir,
    )


def run(contenders: list[Contender], tmp_path: Path, slots: int) -> list[CandidateResult]:
    model_dir = contenders[0].model_dir
    acquired = Acquired(model_dir, model_dir / "manifest.json", "c" * 40, "org/m", 0, True)

    @flow(name="measure-side-by-side")
    def measure_all() -> list[CandidateResult]:
        set_host_limit(slots)
        return measure_contenders(contenders, acquired, CONFIG, HOST, "run-1", tmp_path, "svc")

    return measure_all()


def overlap(a: tuple, b: tuple) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_candidates_are_measured_side_by_side_on_disjoint_gpus(
    prefect_api, measured, tiny_model_dir, tmp_path, monkeypatch
):
    monkeypatch.setattr(gpus, "host_gpus", lambda: [0, 1, 2, 3])
    contenders = [
        contender("a", tiny_model_dir),
        contender("b", tiny_model_dir),
        contender("tp2", tiny_model_dir, tensor_parallel_size=2),
        contender("all", tiny_model_dir, gpus="all"),
    ]
    started = time.monotonic()
    results = run(contenders, tmp_path, slots=4)
    wall = time.monotonic() - started
    assert [r.name for r in results] == ["a", "b", "tp2", "all"], "results in contender order"
    assert [len(r.gpus) for r in results] == [1, 1, 2, 4]
    spans = measured
    print({k: (round(s - started, 1), round(e - started, 1), g) for k, (s, e, g) in spans.items()})
    # a, b and tp2 fit the 4 GPUs at once: they ran together, on disjoint GPUs.
    trio = ["a", "b", "tp2"]
    assert all(overlap(spans[x], spans[y]) > HOLD_S / 2 for x in trio for y in trio if x < y)
    held = [g for name in trio for g in spans[name][2]]
    assert sorted(held) == [0, 1, 2, 3]
    # 'all' needs every GPU: it waited for the three to finish, and ran alone.
    assert all(overlap(spans["all"], spans[x]) <= 0 for x in trio)
    assert wall < 4 * HOLD_S, f"side by side took {wall:.1f}s, one after another {4 * HOLD_S}s"


def test_a_one_slot_host_measures_one_at_a_time(
    prefect_api, measured, tiny_model_dir, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(gpus, "host_gpus", lambda: [])  # a CPU host
    results = run([contender(n, tiny_model_dir) for n in "abc"], tmp_path, slots=1)
    assert [r.status for r in results] == ["measured"] * 3
    assert [r.gpus for r in results] == [[], [], []]
    spans = list(measured.values())
    assert all(overlap(x, y) <= 0 for i, x in enumerate(spans) for y in spans[i + 1 :])
    # Waiting is no error: Prefect's line for a try that found the slot taken is dropped.
    assert "waiting for a host slot" in caplog.text
    assert "failed to process item" not in caplog.text
