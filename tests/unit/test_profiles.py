"""The shipped parameter profiles: only one whose name says demo approves by itself.

prefect.yaml's named profiles and the files under configs/ are what a deployment's form
and `make demo` start from; every other setting of theirs is checked where it is used
(tests/integration/test_control_room.py deploys them)."""

import json
import re
from pathlib import Path

import pytest
import yaml

from llm_release.config import ReleaseConfig

ROOT = Path(__file__).resolve().parents[2]
PREFECT = yaml.safe_load((ROOT / "prefect.yaml").read_text())
PROFILES = PREFECT["definitions"]["profiles"]
FILES = {p.stem: json.loads(p.read_text()) for p in sorted((ROOT / "configs").glob("*.json"))}
SOURCE = {"source": {"repo_id": "a/b"}}


def approves_by_itself(config: ReleaseConfig) -> bool:
    return config.review.auto == "approve" or config.rollout.approval == "approve"


@pytest.mark.parametrize(
    "name, data",
    [(f"profile {k}", v) for k, v in PROFILES.items()]
    + [(f"configs/{k}.json", v) for k, v in FILES.items()],
)
def test_only_a_profile_named_demo_approves_by_itself(name, data):
    config = ReleaseConfig.model_validate(SOURCE | data)
    if "demo" in name:
        assert approves_by_itself(config), f"{name}: the demo runs unattended"
    else:
        assert not approves_by_itself(config), f"{name} approves without a person"


def test_every_deployment_with_a_release_config_asks_a_person():
    deployments = {d["name"]: d for d in PREFECT["deployments"]}
    with_config = [n for n, d in deployments.items() if "config" in (d.get("parameters") or {})]
    assert set(with_config) == {"release", "release-gpu", "model-update"}
    for name in with_config:
        config = ReleaseConfig.model_validate(deployments[name]["parameters"]["config"])
        assert config.review.auto is None and config.rollout.approval == "ask", name
        assert config.rollout.approval_timeout_s == 3600, name  # no answer: rolled back


def test_profiles_and_their_files_agree():
    assert PROFILES["cpu_host"] == FILES["cpu-host"]
    assert PROFILES["cpu_demo"] == FILES["demo"]
    # The update's file is the demo's with no quantized candidates.
    assert FILES["demo-update"] == {"candidates": []} | FILES["demo"]


def test_make_demo_chooses_the_demo_files_explicitly():
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:") :]
    assert re.search(r"--deployment release/release .*\n.*--config configs/demo\.json", demo)
    assert re.search(
        r"--deployment model-update/model-update .*\n.*--config configs/demo-update\.json", demo
    )
