"""One server factory: every start follows ``serving.backend``, tuning and eval-only too."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

import flows.operate as operate
from llm_release.config import LoadProfile, ServingConfig
from llm_release.serving import factory, tune
from llm_release.serving.backends.docker import DockerServer
from llm_release.serving.serve import VllmServer


class Chosen(Exception):
    """Raised by the fake backend where a real one would start."""


def test_the_factory_picks_the_backend_the_config_names(tmp_path):
    docker = factory.make_server(tmp_path, ["m"], ServingConfig(backend="docker"), tmp_path / "l")
    process = factory.make_server(tmp_path, ["m"], ServingConfig(), tmp_path / "l")
    assert type(docker) is DockerServer and not docker.started
    assert type(process) is VllmServer and not process.started


def _fake_docker(monkeypatch) -> list[ServingConfig]:
    seen: list[ServingConfig] = []

    class FakeDocker(DockerServer):
        def __enter__(self):
            seen.append(self.serving)
            raise Chosen(self.serving.backend)

    monkeypatch.setattr(factory, "DockerServer", FakeDocker)
    return seen


def test_tuning_serves_through_the_factory_so_docker_holds(monkeypatch, tmp_path: Path):
    seen = _fake_docker(monkeypatch)
    monkeypatch.setattr(tune.reasoning, "request_body", lambda *a, **k: {})
    session = tune.vllm_session(
        tmp_path,
        ["tuned"],
        ServingConfig(backend="docker", max_num_seqs=4),
        tmp_path,
        LoadProfile(),
        tmp_path / "out",
    )
    setting = tune.Setting(max_num_seqs=8)
    with pytest.raises(Chosen, match="docker"), session(setting):
        pass
    assert [s.backend for s in seen] == ["docker"]
    assert seen[0].max_num_seqs == 8  # the setting under test, in the docker server


def test_eval_only_serves_through_the_factory(monkeypatch):
    # eval-only builds its server with the same factory as the release (no backend class
    # named in the flow), so serving.backend: docker holds there too
    source = inspect.getsource(operate)
    assert operate.make_server is factory.make_server
    assert "VllmServer" not in source and "DockerServer" not in source
    assert "make_server(" in inspect.getsource(operate.evaluate_target)
