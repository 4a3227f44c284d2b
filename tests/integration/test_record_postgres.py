"""The release record against real databases: the SQLite file of the default and a real
PostgreSQL server (tests/pg.py). The first start on a home with the old JSON files imports
every release, judgement, measurement and GPU claim once (a home imported before the stores
moved onto the record imports their files then); two 'canary promote' processes racing on
PostgreSQL have exactly one winner, and two claiming the last free GPU too; a writer killed
mid-transaction leaves nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from llm_release import registry
from llm_release.config import STORED, ServingConfig
from llm_release.decision import measurements
from llm_release.decision.decisions import Judgement
from llm_release.errors import ServeError
from llm_release.fileio import atomic_write_json, atomic_write_text
from llm_release.record import store
from llm_release.record.schema import (
    DecisionRow,
    GpuClaimRow,
    HistoryRow,
    ImportRow,
    MeasurementRow,
    RegistryRow,
    ReleaseRow,
    RolloutRow,
)
from llm_release.record.state import read_state, write_state
from llm_release.registry import RegistryState, Release, RolloutStatus
from llm_release.results import CandidateResult
from llm_release.serving import gpus, processes

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
WRITER = ROOT / "tests" / "record_writer.py"
CLAIMER = ROOT / "tests" / "gpu_claimer.py"


def _release(release_id: str, port: int) -> Release:
    return Release(
        release_id=release_id,
        candidate="fp8",
        scheme="FP8_DYNAMIC",
        repo_id="org/tiny",
        commit=release_id[-8:] * 5,
        model_dir=f"/srv/models/{release_id}",
        public_name="tiny",
        port=port,
        pid=4242,
        pid_started=1796000000.5,
        log_path=f"/srv/logs/{release_id}.log",
        serving=ServingConfig(max_model_len=4096),
    )


def old_home(home: Path) -> RegistryState:
    """The JSON files the pipeline wrote before the record, as its writers wrote them."""
    state = RegistryState(
        router_port=8080,
        stable=_release("baseline-aaaaaaaa", 8101),
        canary=_release("fp8-bbbbbbbb", 8102),
        canary_weight=25,
        rollout=RolloutStatus(
            release_id="fp8-bbbbbbbb",
            steps=[5, 25, 50, 100],
            weight=25,
            state="analysing",
            last_window={
                "weight": 5,
                "index": 1,
                "verdict": "pass",
                "reason": "ok",
                "ended_at": 1.0,
            },
        ),
    )
    state.log("stable", release="baseline-aaaaaaaa")
    state.log("canary", release="fp8-bbbbbbbb", weight=5)
    state.log("canary_weight", release="fp8-bbbbbbbb", weight=25, previous=5)
    atomic_write_text(home / "releases.json", json.dumps(state.model_dump(), indent=2) + "\n")
    for n, verdict in enumerate(["deployed", "rejected"]):
        key = f"{n}" * 64
        judgement = Judgement(
            key=key,
            repo_id="org/tiny",
            commit=f"{n}" * 40,
            verdict=verdict,
            summary=f"judged {verdict}",
            run_id=f"run-{n}",
            at="2026-12-01T00:00:00+00:00",
        )
        atomic_write_json(home / "judgements" / f"{key[:32]}.json", judgement.model_dump())
    result = CandidateResult(
        name="fp8", scheme="FP8_DYNAMIC", status="measured", fingerprint="f" * 64
    )
    atomic_write_json(
        home / "measurements" / f"{'f' * 32}.json",
        {"run_id": "run-0", "result": result.model_dump(mode="json")},
    )
    (home / "measurements" / f"{'e' * 32}.json").write_text("{not json")
    me = os.getpid()
    ledger = gpus.Ledger(
        claims=[
            # This process: a live holder. A pid that does not run: a dead one.
            gpus.Claim(holder="stable", gpus=[0], pid=me, pid_started=processes.start_time(me)),
            gpus.Claim(holder="candidate-x", gpus=[1], pid=2**22 + 7, pid_started=1.0),
        ]
    )
    atomic_write_json(home / "gpus.json", ledger.model_dump())
    return state


def test_the_first_start_imports_every_release_and_decision_once(record_url, home, caplog):
    state = old_home(home)
    caplog.set_level(logging.INFO, logger="llm_release.record")
    with store.transaction() as session:
        slots = store.slots(session)
        assert slots["stable"].release_id == "baseline-aaaaaaaa"
        assert slots["canary"].release_id == "fp8-bbbbbbbb"
        stable = session.get(ReleaseRow, "baseline-aaaaaaaa")
        assert (
            Release.model_validate({c: getattr(stable, c) for c in Release.model_fields})
            == state.stable
        ), "every field of the release kept"
        assert stable.state == "stable"
        registry = session.get(RegistryRow, 1)
        assert (registry.router_port, registry.canary_weight) == (8080, 25)
        rollout = session.get(RolloutRow, registry.rollout_release_id)
        assert (rollout.release_id, rollout.steps, rollout.state) == (
            "fp8-bbbbbbbb",
            [5, 25, 50, 100],
            "analysing",
        )
        history = session.execute(select(HistoryRow).order_by(HistoryRow.id)).scalars().all()
        assert [(h.event, h.details.get("weight")) for h in history] == [
            ("stable", None),
            ("canary", 5),
            ("canary_weight", 25),
        ]
        decisions = session.execute(select(DecisionRow).order_by(DecisionRow.key)).scalars().all()
        assert [(d.verdict, d.run_id) for d in decisions] == [
            ("deployed", "run-0"),
            ("rejected", "run-1"),
        ]
        measurement = session.get(MeasurementRow, "f" * 64)
        assert CandidateResult.model_validate(measurement.result).fingerprint == "f" * 64
    said = [r.getMessage() for r in caplog.records if "imported the JSON files" in r.getMessage()]
    assert len(said) == 1, said
    assert (
        "2 releases, 3 history events, 2 judgements, 1 measurements, 2 GPU claims, "
        "1 unreadable skipped" in said[0]
    )
    # Every claim imported whole; the ledger's next claim frees the dead holder's GPU.
    old_claims = json.loads((home / "gpus.json").read_text())["claims"]
    assert gpus.ledger().model_dump()["claims"] == sorted(old_claims, key=lambda c: c["holder"])
    assert gpus.claim("canary", ServingConfig(), [0, 1]) == [1]
    assert {c.holder: c.gpus for c in gpus.ledger().claims} == {"stable": [0], "canary": [1]}

    # A second start (a new process: no engine yet) imports nothing, even with a new file.
    caplog.clear()
    store._engines.clear()
    atomic_write_json(
        home / "judgements" / f"{'9' * 32}.json",
        Judgement(
            key="9" * 64,
            repo_id="org/tiny",
            commit="9" * 40,
            verdict="deployed",
            summary="late",
            run_id="run-9",
            at="2026-12-02T00:00:00+00:00",
        ).model_dump(),
    )
    (home / "gpus.json").unlink()
    with store.transaction() as session:
        assert session.scalar(select(func.count()).select_from(DecisionRow)) == 2
        assert session.scalar(select(func.count()).select_from(HistoryRow)) == 3
        assert session.scalar(select(func.count()).select_from(ImportRow)) == 4
    assert {c.holder for c in gpus.ledger().claims} == {"stable", "canary"}
    assert not [r for r in caplog.records if "imported" in r.getMessage()]


def test_the_cli_says_so_on_stderr_when_its_first_start_imports(home, monkeypatch):
    # A bare 'llm-release' command is the first start: the import's one line reaches the
    # operator (Python alone prints no INFO line); the second command says nothing of it.
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL", raising=False)
    old_home(home)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    command = [sys.executable, "-m", "llm_release.cli", "history", "--json"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    said = [line for line in first.stderr.splitlines() if "imported the JSON files" in line]
    assert len(said) == 1, first.stderr
    assert f"record: imported the JSON files of {home}" in said[0]
    assert "2 releases, 3 history events" in said[0] and "stay as they were" in said[0]
    assert "fp8-bbbbbbbb" in first.stdout
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "imported" not in again.stderr, again.stderr


def test_a_home_imported_before_the_stores_moved_imports_their_files_once(record_url, home, caplog):
    old_home(home)
    with store.transaction() as session:
        # The record as the release before this one left it: the registry, judgements and
        # measurements imported under one mark, the GPU ledger never.
        session.query(GpuClaimRow).delete()
        session.query(ImportRow).filter(ImportRow.name != "json").delete()
    # Meanwhile the old code went on writing its files: a new judgement, one judged again.
    for n, verdict in (("9", "deployed"), ("1", "review rejected")):
        judgement = Judgement(
            key=n * 64,
            repo_id="org/tiny",
            commit=n * 40,
            verdict=verdict,
            summary="after the first import",
            run_id=f"run-{n}b",
            at="2026-12-02T00:00:00+00:00",
        )
        atomic_write_json(home / "judgements" / f"{n * 32}.json", judgement.model_dump())
    caplog.set_level(logging.INFO, logger="llm_release.record")
    store._engines.clear()  # a new process of the new release
    with store.transaction() as session:
        verdicts = {d.key[0]: (d.verdict, d.run_id) for d in session.query(DecisionRow)}
        assert verdicts == {
            "0": ("deployed", "run-0"),
            "1": ("review rejected", "run-1b"),
            "9": ("deployed", "run-9b"),
        }
        assert session.scalar(select(func.count()).select_from(HistoryRow)) == 3
        assert session.scalar(select(func.count()).select_from(MeasurementRow)) == 1
        assert {i.name for i in session.query(ImportRow)} == {
            "json",
            "judgements",
            "measurements",
            "gpus",
        }
    assert {c.holder: c.gpus for c in gpus.ledger().claims} == {"stable": [0], "candidate-x": [1]}
    said = [r.getMessage() for r in caplog.records if "imported the JSON files" in r.getMessage()]
    assert len(said) == 1, said
    assert "2 judgements, 0 measurements, 2 GPU claims, 1 unreadable skipped" in said[0]
    assert "releases" not in said[0], "the registry is not imported twice"
    # From now on the stores write the record: measured again, the newest stands.
    result, run_id = measurements.find("f" * 64)
    assert run_id == "run-0"
    measurements.save(result, "run-2")
    assert measurements.find("f" * 64) == (result, "run-2")


def _read() -> RegistryState:
    with store.transaction(write=False) as session:
        return RegistryState.model_validate(read_state(session), context=STORED)


def test_the_registry_state_round_trips_and_a_reader_never_waits_for_a_writer(record_url, home):
    state = RegistryState(
        router_port=8080,
        stable=_release("baseline-aaaaaaaa", 8101),
        canary=_release("fp8-bbbbbbbb", 8102),
        canary_weight=5,
        rollout=RolloutStatus(
            release_id="fp8-bbbbbbbb", steps=[5, 100], weight=5, state="warming up"
        ),
    )
    state.log("canary", release="fp8-bbbbbbbb", weight=5)
    with store.transaction() as session:
        store.lock_registry(session)
        write_state(session, state.model_dump(mode="json"))
    assert _read() == state

    # The promotion in one write: the canary moves to the stable slot, the old stable
    # keeps its row as replaced, the history gains one event. A reader meanwhile sees the
    # state before it, at once (the writer holds its lock until told to commit).
    promoted = _read()
    promoted.stable, promoted.canary, promoted.canary_weight = promoted.canary, None, 0
    promoted.log("promote", release="fp8-bbbbbbbb", replaced="baseline-aaaaaaaa")
    written, commit = threading.Event(), threading.Event()

    def writer() -> None:
        with store.transaction() as session:
            store.lock_registry(session)
            write_state(session, promoted.model_dump(mode="json"))
            written.set()
            commit.wait(30)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert written.wait(30)
        started = time.monotonic()
        assert _read() == state
        assert time.monotonic() - started < 5
    finally:
        commit.set()
        thread.join(30)
    assert _read() == promoted
    with store.transaction(write=False) as session:
        states = {r.release_id: r.state for r in session.execute(select(ReleaseRow)).scalars()}
    assert states == {"baseline-aaaaaaaa": "replaced", "fp8-bbbbbbbb": "stable"}
    assert [e["event"] for e in _read().history] == ["canary", "promote"]


def _writer(release_id: str, hold_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, str(WRITER), release_id, str(hold_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _waiting_on_a_lock(engine) -> int:
    with engine.connect() as connection:
        return connection.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )


@pytest.mark.postgres
def test_two_promotes_racing_on_postgresql_have_one_winner(home, postgres_url, monkeypatch):
    # Two 'llm-release canary promote' processes, the real CLI and promote path. The test
    # holds the registry's row lock until both are waiting on it, so they surely race.
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", postgres_url)
    state = RegistryState(
        router_port=8080,
        stable=_release("baseline-aaaaaaaa", 8101),
        canary=_release("fp8-bbbbbbbb", 8102),
        canary_weight=50,
    )
    state.log("canary", release="fp8-bbbbbbbb", weight=50)
    registry.save(state)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    command = [sys.executable, "-m", "llm_release.cli", "canary", "promote"]
    engine = store.create(postgres_url)
    try:
        with Session(engine) as holder:
            store.lock_registry(holder)
            racers = [
                subprocess.Popen(
                    command + ["--drain-timeout", "5"],
                    env=env,
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                )
                for _ in range(2)
            ]
            deadline = time.monotonic() + 120
            while _waiting_on_a_lock(engine) < 2:
                assert time.monotonic() < deadline, [r.poll() for r in racers]
                assert all(r.poll() is None for r in racers), [r.communicate() for r in racers]
                time.sleep(0.2)
            holder.rollback()  # both are waiting: let them go
        results = [(r.wait(120), *r.communicate()) for r in racers]
    finally:
        engine.dispose()
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 2], results
    won = next(out for rc, out, _ in results if rc == 0)
    lost = next(err for rc, _, err in results if rc == 2)
    assert "promoted fp8-bbbbbbbb: it is now stable at 100%" in won
    assert "there is no canary to promote" in lost and "how to fix" in lost, lost
    # The record agrees with the winner, once: the old stable replaced, one promote event.
    after = _read()
    assert after.stable.release_id == "fp8-bbbbbbbb" and after.canary is None
    assert after.canary_weight == 0
    assert [e["event"] for e in after.history] == ["canary", "promote"]
    with store.transaction(write=False) as session:
        states = {r.release_id: r.state for r in session.execute(select(ReleaseRow)).scalars()}
    assert states == {"baseline-aaaaaaaa": "replaced", "fp8-bbbbbbbb": "stable"}


def _claimer(holder: str, hold_s: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    return subprocess.Popen(
        [sys.executable, str(CLAIMER), holder, str(hold_s)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_claiming_the_last_free_gpu_have_one_winner(record_url, home):
    # GPU 0 is held by this (live) process; two claimers race for GPU 1. Each takes 0.5 s
    # over every claim it reads, so without the ledger's lock both would read GPU 1 free.
    assert gpus.claim("stable", ServingConfig(), [0, 1]) == [0]
    racers = {holder: _claimer(holder, 0.5) for holder in ("fp8-one", "awq-two")}
    try:
        for holder, racer in racers.items():
            line = racer.stdout.readline()
            assert line.strip() == "READY", (holder, line, racer.stderr.read())
        for racer in racers.values():
            racer.stdin.write("go\n")
            racer.stdin.flush()
        said = {holder: racer.stdout.readline().split(" ", 2) for holder, racer in racers.items()}
    finally:
        for racer in racers.values():
            racer.stdin.close()  # the winner holds its claim until here
    codes = {holder: racer.wait(60) for holder, racer in racers.items()}
    assert sorted(codes.values()) == [0, 3], (said, [r.stderr.read() for r in racers.values()])
    winner = next(holder for holder, code in codes.items() if code == 0)
    loser = next(holder for holder in codes if holder != winner)
    assert said[winner][0] == "CLAIMED" and said[winner][2].strip() == "[1]"
    assert said[loser][0] == "REFUSED"
    assert f"GPU 0: stable, GPU 1: {winner}" in said[loser][2]
    # The loser waited on the winner's lock, then saw its claim.
    assert float(said[loser][1]) >= float(said[winner][1]) - 0.05, said
    assert {c.holder: c.gpus for c in gpus.ledger().claims} == {"stable": [0], winner: [1]}
    with pytest.raises(ServeError, match="0 have it"):
        gpus.claim("third", ServingConfig(), [0, 1], alive=lambda c: True)


def test_hosts_sharing_one_record_keep_to_their_own_gpu_claims(record_url, home, monkeypatch):
    """Host A's claims name processes host B cannot see: B neither counts them against its
    own GPUs nor drops them as dead, and a holder name A uses is refused to B."""
    dead = {"alive": lambda c: False}  # every claim B can check looks dead from B
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    assert gpus.claim("stable-x@20001", ServingConfig(), [0, 1]) == [0]
    assert gpus.claim("canary-y@20002", ServingConfig(), [0, 1]) == [1]
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_b")
    assert gpus.ledger().claims == []  # A's claims are not B's
    assert gpus.claim("fp8-z@20003", ServingConfig(), [0, 1], **dead) == [0]  # B's GPU 0 free
    with pytest.raises(ServeError, match="held by host gpu_a"):
        gpus.claim("stable-x@20001", ServingConfig(), [0, 1], **dead)
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    assert {c.holder: c.gpus for c in gpus.ledger().claims} == {
        "stable-x@20001": [0],
        "canary-y@20002": [1],
    }
    gpus.give_back("canary-y@20002")
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_b")
    assert [(c.holder, c.host) for c in gpus.ledger().claims] == [("fp8-z@20003", "gpu_b")]
    monkeypatch.delenv("LLM_RELEASE_HOST_NAME")  # the one host without a name: none of these
    assert gpus.ledger().claims == []
    with store.transaction(write=False) as session:
        rows = session.query(GpuClaimRow).order_by(GpuClaimRow.holder).all()
        assert [(r.holder, r.host) for r in rows] == [
            ("fp8-z@20003", "gpu_b"),
            ("stable-x@20001", "gpu_a"),
        ]


def test_a_writer_killed_mid_transaction_leaves_the_record_consistent(record_url, home):
    store.migrate(store.create(record_url))
    writer = _writer("baseline-killed", 600)
    line = writer.stdout.readline()
    assert line.strip() == "IN", (line, writer.stderr.read() if writer.poll() is not None else "")
    writer.send_signal(signal.SIGKILL)
    writer.wait(10)
    # Nothing of the dead transaction is there, though its rows were written (flushed),
    # and its locks went with it: the next writer takes the registry at once.
    with store.transaction() as session:
        assert store.slots(session) == {"stable": None, "canary": None}
        assert session.get(ReleaseRow, "baseline-killed") is None
        assert session.scalar(select(func.count()).select_from(HistoryRow)) == 0
    done = _writer("baseline-next", 0)
    assert done.wait(60) == 0, done.communicate()
    assert done.stdout.read().split() == ["IN", "COMMITTED"]
    with store.transaction() as session:
        assert store.slots(session)["stable"].release_id == "baseline-next"
        assert session.get(ReleaseRow, "baseline-next").state == "stable"
    assert [(e["event"], e["release"]) for e in _read().history] == [("stable", "baseline-next")]


@pytest.mark.postgres
def test_a_writer_waiting_for_the_registrys_row_on_postgresql_says_so(
    home, postgres_url, monkeypatch, caplog
):
    """A row lock waits for ever by default, in silence (issue 36, low): the writer waits in
    steps, says so after 2 s naming what it waits for, and goes on once the lock is free."""
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", postgres_url)
    registry.save(RegistryState(router_port=8080))
    engine = store.create(postgres_url)
    caplog.set_level(logging.WARNING, logger="llm_release.record.store")
    try:
        holder = Session(engine)
        store.lock_registry(holder)
        threading.Timer(4.0, holder.rollback).start()
        started = time.monotonic()
        with store.transaction() as session:
            store.lock_registry(session)
        waited = time.monotonic() - started
        holder.close()
    finally:
        engine.dispose()
    assert 3.0 < waited < 30, (waited, [r.getMessage() for r in caplog.records])
    notices = [r.getMessage() for r in caplog.records if "waiting for" in r.getMessage()]
    assert len(notices) == 1 and "the registry's row" in notices[0], notices
    assert "at most" in notices[0] and "password" not in notices[0]
