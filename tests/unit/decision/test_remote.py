"""A MeasureOrder is a flow run's parameter: input, held to patterns before any work."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_release.decision.remote import MeasureOrder

SHA = "0" * 64


def order(**over) -> dict:
    base = {
        "run_id": "20261206T120000Z-5e4d3c2b",
        "release_host": "gpu_a",
        "public_name": "tiny",
        "contender": {
            "name": "baseline",
            "role": "baseline",
            "scheme": "unquantized",
            "serving": {},
        },
        "handover": {
            "repo_id": "fleet/tiny-baseline",
            "commit": "a" * 40,
            "endpoint": "http://127.0.0.1:8765",
            "files": {"model.safetensors": SHA},
        },
        "evaluation": {},
        "load": {},
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = base[key] | value
        else:
            base[key] = value
    return base


def test_a_well_formed_order_gives_the_contender_at_the_received_folder(tmp_path):
    contender = MeasureOrder.model_validate(order()).contender_at(tmp_path)
    assert contender.model_dir == tmp_path and contender.outcome is None


@pytest.mark.parametrize(
    "over",
    [
        {"run_id": "../../etc"},
        {"run_id": "a/b"},
        {"contender": {"name": "../x"}},
        {"contender": {"name": "a" * 65}},
        {"contender": {"scheme": "x\n$(reboot)"}},
        {"contender": {"model_dir": "/etc"}},  # no path of the sending host
        {"contender": {"outcome": {}}},
        {"contender": {"commit": "HEAD"}},
        {"release_host": "Gpu A"},
        {"public_name": "a b"},
        {"handover": {"files": {"../../.bashrc": SHA}}},
        {"handover": {"commit": "main"}},
        {"extra": 1},
    ],
)
def test_a_hostile_order_is_refused_before_any_work(over):
    with pytest.raises(ValidationError):
        MeasureOrder.model_validate(order(**over))


def test_an_order_naming_a_metadata_hub_is_refused_before_any_request(tmp_path, monkeypatch):
    from llm_release.errors import ReleaseError
    from llm_release.hub.handover import receive

    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path))
    hostile = MeasureOrder.model_validate(
        order(handover={"endpoint": "http://169.254.169.254"})
    ).handover
    with pytest.raises(ReleaseError, match="169.254|link-local|metadata"):
        receive(hostile)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())
