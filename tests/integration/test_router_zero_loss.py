"""No request lost to a release change: real HAProxy (the project's Router and promote
code) in front of small OpenAI chat-completions servers, and demo traffic from the real
openai client (which retries nothing itself) running all the while.

The servers are a fake (tests/fake_openai.py) because the property under test is
HAProxy's and promote's, and a fake can be killed mid-request and says what it had in
flight when it was stopped. bench/canary_reliability.py measures the same with vLLM.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from llm_release import registry
from llm_release.canary import promote
from llm_release.canary.router import Router, SlotTarget
from llm_release.config import ServingConfig
from llm_release.load.traffic import Traffic
from llm_release.registry import Release
from llm_release.serving.processes import start_time
from llm_release.serving.serve import free_port
from tests.fake_openai import FakeServer

pytestmark = pytest.mark.integration

# Each answer takes 0.3 s, so a server always has requests in flight while it is changed.
DELAY_S = 0.3


class Fakes:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.servers: dict[str, FakeServer] = {}

    def __call__(self, name: str, release_id: str | None = None) -> FakeServer:
        names = (release_id,) if release_id else ()
        self.servers[name] = FakeServer(name, DELAY_S, self.directory, served_names=names)
        return self.servers[name]


@pytest.fixture()
def fakes(tmp_path):
    started = Fakes(tmp_path)
    yield started
    for fake in started.servers.values():
        fake.close()


def wait_up(router: Router, *slots: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stats = router.stats()
        if all(stats[s]["status"] == "UP" for s in slots):
            return
        time.sleep(0.1)
    raise AssertionError(f"slots {slots} never came up: {router.stats()}")


def retries(router: Router) -> int:
    """Requests HAProxy sent again (retried or redispatched), over both slots."""
    return sum(int(row["wretr"] or 0) + int(row["wredis"] or 0) for row in router.stats().values())


def test_weight_steps_promote_rollback_and_drain_lose_no_request(home, fakes, monkeypatch):
    def start_release(target, public_name, role):
        release_id = f"{target.candidate}-0123abcd-20261130000000"
        fake = fakes(target.candidate, release_id)
        return Release(
            release_id=release_id,
            candidate=target.candidate,
            scheme="none",
            repo_id="a/b",
            commit="0" * 40,
            model_dir=str(home / "models" / target.candidate),
            public_name=public_name,
            port=fake.port,
            pid=fake.pid,
            pid_started=start_time(fake.pid),
            log_path="/dev/null",
            serving=ServingConfig(),
        )

    monkeypatch.setattr(promote, "_start_release", start_release)

    def target(name: str) -> promote.DeployTarget:
        return promote.DeployTarget(name, "none", Path("/x"), "a/b", "0" * 40, ServingConfig())

    state = promote.deploy(
        target("one"), target("two"), public_name="svc", canary_weight=5, router_port=free_port()
    )
    router = promote.router_for(state)
    wait_up(router, "stable", "canary")
    # ~24 requests a second over 8 connections: every change below meets requests in flight.
    with Traffic(
        router.url, "svc", rate_rps=24, duration_s=60, concurrency=8, api_key=router.api_key
    ) as traffic:
        for weight in (25, 50):
            time.sleep(0.6)
            assert promote.set_canary_weight(weight).canary_weight == weight
            assert router.stats()["canary"]["weight"] == str(weight)
            assert router.stats()["stable"]["weight"] == str(100 - weight)
        time.sleep(0.6)
        promote.promote(drain_timeout_s=10)  # "one" drains and stops, "two" is stable
        time.sleep(0.6)
        promote.deploy(None, target("three"), public_name="svc", canary_weight=50)
        time.sleep(0.6)
        promote.rollback(drain_timeout_s=10)  # "three" drains and stops
        time.sleep(0.6)
        report = traffic.stop()

    assert report.failed == 0, report.summary()
    assert report.sent >= 60, report.summary()
    for name in ("one", "three"):
        record = fakes.servers[name].record()
        # Each was stopped with nothing in flight (it records that on SIGTERM), having
        # served traffic: the drain, not luck, kept its requests.
        assert record["in_flight_at_stop"] == 0, (name, record)
        assert record["served"] > 0, (name, record)
    # And no request needed HAProxy's retries: the drain alone was enough.
    assert retries(router) == 0
    stats = router.stats()
    assert stats["canary"]["status"] == "MAINT" and stats["stable"]["weight"] == "100"
    assert stats["stable"]["addr"].endswith(f":{registry.load().stable.port}")
    events = [(e["event"], e.get("weight")) for e in registry.load().history]
    assert ("canary_weight", 25) in events and ("canary_weight", 50) in events


def test_a_server_killed_mid_stream_loses_no_request(home, fakes):
    """A crash, not a planned stop: the server dies with requests in flight and refuses
    connections afterwards until HAProxy's checks take it out. Those requests are sent
    again to the other server (empty-response, conn-failure + redispatch)."""
    doomed, survivor = fakes("doomed"), fakes("survivor")
    router = Router(home / "router", free_port())
    router.start(
        SlotTarget("127.0.0.1", doomed.port, 50), SlotTarget("127.0.0.1", survivor.port, 50)
    )
    wait_up(router, "stable", "canary")
    with Traffic(
        router.url, "svc", rate_rps=24, duration_s=60, concurrency=8, api_key=router.api_key
    ) as traffic:
        time.sleep(1.0)
        os.kill(doomed.pid, signal.SIGTERM)  # records what it had in flight, then _exit
        time.sleep(2.5)
        report = traffic.stop()
    cut = doomed.record()["in_flight_at_stop"]
    stats = router.stats()
    router.stop()

    assert cut >= 1, "the kill met no request in flight: the test proved nothing"
    assert report.failed == 0, report.summary()
    assert report.sent >= 60
    assert stats["stable"]["status"].startswith("DOWN")
    assert sum(int(r["wretr"] or 0) + int(r["wredis"] or 0) for r in stats.values()) >= cut
