"""The judgements, the measurements and the GPU ledger on the record (SQLite under the test's
home): each keeps its API, writes no JSON file, and a GPU claimed while a deploy holds the
registry (SQLite's one write lock) joins the deploy's transaction instead of waiting for
itself."""

from __future__ import annotations

import pytest

from llm_release import registry
from llm_release.config import ReleaseConfig, ServingConfig, SourceConfig
from llm_release.decision import decisions, measurements
from llm_release.errors import ServeError
from llm_release.record import store
from llm_release.registry import RegistryState
from llm_release.results import CandidateResult
from llm_release.serving import gpus


def test_judgements_are_found_under_their_key_on_the_record(home, monkeypatch):
    keys = {"c" * 40: "1" * 64, "d" * 40: "2" * 64}
    monkeypatch.setattr(decisions, "judgement_key", lambda config, commit: keys[commit])
    config = ReleaseConfig(source=SourceConfig(repo_id="acme/m"))
    assert decisions.find(config, "c" * 40) is None
    assert not (home / "record.db").exists(), "a look at nothing recorded makes no record"
    first = decisions.record(config, "c" * 40, "rejected", "fp8 lost", "run-1")
    assert decisions.find(config, "c" * 40) == first
    assert decisions.find(config, "d" * 40) is None
    again = decisions.record(config, "c" * 40, "deployed", "fp8 won", "run-2")  # force
    assert decisions.find(config, "c" * 40) == again
    assert (again.verdict, again.run_id) == ("deployed", "run-2")
    assert not (home / "judgements").exists()


def test_a_complete_measurement_is_reused_by_its_fingerprint_only(home):
    measured = CandidateResult(
        name="fp8", scheme="FP8_DYNAMIC", status="measured", fingerprint="f" * 64
    )
    assert measurements.find("f" * 64) is None
    measurements.save(measured, "run-1")
    measurements.save(
        measured.model_copy(update={"fingerprint": "e" * 64, "status": "failed"}), "x"
    )
    measurements.save(
        measured.model_copy(update={"fingerprint": "d" * 64, "reused_from": "r"}), "x"
    )
    assert measurements.find("f" * 64) == (measured, "run-1")
    assert measurements.find("e" * 64) is None, "a failed measurement is never reused"
    assert measurements.find("d" * 64) is None, "a reused one is not stored again"
    measurements.save(measured, "run-2")
    assert measurements.find("f" * 64) == (measured, "run-2")
    assert not (home / "measurements").exists()


def test_a_runs_judgement_and_measurement_are_found_by_the_run(home, monkeypatch):
    """What lineage reads: the judgement a run made on a commit, with the review's verdict
    (cut to the column's 255 characters), and the measurement it made of a candidate."""
    monkeypatch.setattr(decisions, "judgement_key", lambda config, commit: "1" * 64)
    config = ReleaseConfig(source=SourceConfig(repo_id="acme/m"))
    assert decisions.of_run("run-1", "c" * 40) is None
    assert measurements.of_run("run-1", "fp8") is None
    assert not (home / "record.db").exists(), "a look at nothing recorded makes no record"
    review = "approved: " + "x" * 400
    judged = decisions.record(config, "c" * 40, "deployed", "fp8 won", "run-1", review)
    assert len(judged.approved_by) == 255 and judged.approved_by.endswith("x…")
    assert decisions.of_run("run-1", "c" * 40) == judged
    assert decisions.of_run("run-1", "d" * 40) is None
    decisions.record(config, "c" * 40, "deployed", "fp8 won again", "run-2")  # force
    assert decisions.of_run("run-1", "c" * 40) is None, "the newest verdict stands"
    assert decisions.of_run("run-2", "c" * 40).approved_by is None

    fp8 = CandidateResult(name="fp8", scheme="FP8_DYNAMIC", status="measured", fingerprint="f" * 64)
    measurements.save(fp8, "run-1")
    measurements.save(fp8.model_copy(update={"name": "awq", "fingerprint": "e" * 64}), "run-1")
    measurements.save(fp8.model_copy(update={"fingerprint": "d" * 64}), "run-2")
    assert measurements.of_run("run-1", "fp8") == fp8
    assert measurements.of_run("run-2", "fp8").fingerprint == "d" * 64
    assert measurements.of_run("run-2", "awq") is None


def test_a_gpu_claimed_while_the_registry_is_held_joins_its_transaction(home, monkeypatch):
    # A regression waits on SQLite's write lock: fail in seconds, not after an hour.
    monkeypatch.setattr(store, "SQLITE_BUSY_TIMEOUT_S", 2.0)
    serving = ServingConfig()
    with registry.locked() as state:  # deploy: the registry held while servers start
        state.router_port = 8080
        assert gpus.claim("stable", serving, [0, 1], alive=lambda c: True) == [0]
        gpus.bind("stable", pid=4242, pid_started=1.5)
    assert registry.load().router_port == 8080
    assert [(c.holder, c.gpus, c.pid) for c in gpus.ledger().claims] == [("stable", [0], 4242)]

    # A deploy that fails undoes its claims with the rest of it.
    with pytest.raises(ServeError), registry.locked():
        assert gpus.claim("canary", serving, [0, 1], alive=lambda c: True) == [1]
        gpus.claim("third", serving, [0, 1], alive=lambda c: True)
    assert [c.holder for c in gpus.ledger().claims] == ["stable"]
    assert registry.load() == RegistryState(router_port=8080)
    gpus.give_back("stable")
    assert gpus.ledger().claims == []
    assert not gpus.ledger_path().exists()
