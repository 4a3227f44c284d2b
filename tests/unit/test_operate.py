"""Operator flows' input checks and the run-state helpers, without a Prefect API."""

import re
from pathlib import Path

import pytest

from flows.operate import _markdown, _model_folder
from llm_release.errors import ConfigError
from llm_release.results import EvalResult, MetricScore
from tasks.states import FAILED_CANDIDATES, completed_with_failures, first_line


@pytest.fixture()
def roots(tmp_path, monkeypatch):
    """A project home and an operator's model store listed in LLM_RELEASE_LOCAL_ROOTS."""
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv("LLM_RELEASE_LOCAL_ROOTS", str(store))
    return store


def model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    return folder


def test_eval_only_refuses_a_relative_or_non_model_folder(roots):
    with pytest.raises(ConfigError, match="not an absolute path"):
        _model_folder("models/x")
    with pytest.raises(ConfigError, match="no config.json"):
        _model_folder(str(model(roots / "empty").parent / "empty" / ".."))  # the root itself
    (roots / "empty" / "config.json").unlink()
    with pytest.raises(ConfigError, match="no config.json"):
        _model_folder(str(roots / "empty"))
    # A path that climbs is judged where it lands, not by its spelling.
    model(roots / "m")
    assert _model_folder(f"{roots}/x/../m") == roots / "m"


def test_eval_only_serves_the_projects_own_model_folders_without_roots(roots, monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_LOCAL_ROOTS")
    own = model(roots.parent / "home" / "candidates" / "tiny-w8a8")
    assert _model_folder(str(own)) == own
    with pytest.raises(ConfigError, match="outside the folders a run may serve"):
        _model_folder(str(model(roots / "m")))


@pytest.mark.parametrize("where", ["/etc/ssh", "/", "outside", "store/../outside"])
def test_eval_only_refuses_a_folder_outside_the_roots_in_one_line(roots, where):
    outside = model(roots.parent / "outside")
    path = where if where.startswith("/") else str(roots.parent / where)
    with pytest.raises(ConfigError) as info:
        _model_folder(path)
    line = info.value.one_line()
    assert "\n" not in line and "LLM_RELEASE_LOCAL_ROOTS" in line
    assert line.startswith("model_dir ") and "outside the folders a run may serve" in line
    assert str(roots) in line and str(outside) not in line.split("(")[1]


def test_eval_only_refuses_a_link_out_of_the_root(roots):
    secret = roots.parent / "secret"
    secret.mkdir()
    (secret / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    linked = model(roots / "linked")
    (linked / "tokenizer.json").symlink_to(secret / "id_ed25519")
    with pytest.raises(ConfigError, match="link that leads outside"):
        _model_folder(str(linked))
    (roots / "whole").symlink_to(model(roots.parent / "elsewhere"))
    with pytest.raises(ConfigError, match="outside the folders a run may serve"):
        _model_folder(str(roots / "whole"))


def test_failed_candidates_name_the_final_state():
    assert completed_with_failures("outcome", {}) == "outcome"
    error = (
        "ServeError: vLLM for tiny exited with code 2 before it was healthy\n"
        "  --- server log tail ---\n  [--spec-model SPEC_MODEL]\n"
        "api_server.py: error: unrecognized arguments: --no-such-vllm-flag\n"
    )
    state = completed_with_failures("outcome", {"broken": error, "fp8": "QuantizeError: x"})
    assert state.is_completed() and state.name == FAILED_CANDIDATES
    assert state.message == (
        "failed candidates: broken, fp8 — broken: ServeError: vLLM for tiny exited with code 2 "
        "before it was healthy | log: api_server.py: error: unrecognized arguments: "
        "--no-such-vllm-flag; fp8: QuantizeError: x"
    )
    assert first_line(None) == "failed" and len(first_line("x" * 1000)) == 300


def test_the_eval_only_scores_table_has_a_row_per_metric():
    results = [
        EvalResult(
            eval_set="refusal_kb",
            num_items=12,
            metrics={
                "refusal": MetricScore(value=0.91666, ci_low=0.8, ci_high=1.0),
                "numeric_match": MetricScore(value=1),
            },
        ),
        EvalResult(eval_set="kb", num_items=3, metrics={"exact": MetricScore(value=0.5)}),
    ]
    text = _markdown("stable release r1", results, Path("/runs/eval-report.md"))
    assert text.startswith("# Evaluation of stable release r1\n\nReport: `/runs/eval-report.md`")
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    assert rows[0] == ["eval set", "metric", "score", "95% CI", "items"]
    assert re.fullmatch(r"[-|]+", text.splitlines()[5])  # the header's separator line
    assert rows[2:] == [
        ["refusal_kb", "refusal", "0.917", "0.800 – 1.000", "12"],
        ["refusal_kb", "numeric_match", "1.000", "–", "12"],
        ["kb", "exact", "0.500", "–", "3"],
    ]


def test_eval_only_of_a_stable_whose_recorded_port_is_anothers_is_refused(home, tmp_path):
    """The stable's row names its live server but a port a stranger listens on: lm-eval
    would send the servers' key there; the run is refused in one line first."""
    import socket

    from flows.operate import eval_target
    from llm_release import registry
    from llm_release.config import ServingConfig
    from llm_release.errors import StateError
    from llm_release.serving.processes import start_time
    from tests.fake_openai import FakeServer

    fake = FakeServer("stable-0123abcd-20261201000000", 0, tmp_path)
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    try:
        stable = registry.Release(
            release_id="stable-0123abcd-20261201000000",
            candidate="stable",
            scheme="none",
            repo_id="a/b",
            commit="0" * 40,
            model_dir="/nonexistent",
            public_name="svc",
            port=fake.port,
            pid=fake.pid,
            pid_started=start_time(fake.pid),
            log_path="/dev/null",
            serving=ServingConfig(),
        )
        registry.save(registry.RegistryState(stable=stable))
        assert eval_target(None).stable is not None  # its own port: evaluated
        forged = stable.model_copy(update={"port": stranger.getsockname()[1]})
        registry.save(registry.RegistryState(stable=forged))
        with pytest.raises(StateError, match="not its server: it is not evaluated there"):
            eval_target(None)
    finally:
        stranger.close()
        fake.close()
