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
    assert PROFILES["gpu_demo"] == FILES["demo-gpu"]
    # The GPU demo is the gpu_host sizing at a third of a GPU (stable, canary and a measured
    # candidate share one), with CUDA graphs as gpu_host and fewer requests a level (its
    # model is 135M), with the demo's approvals and canary walk.
    gpu_demo = dict(FILES["demo-gpu"])
    assert gpu_demo.pop("review") == {"auto": "approve"} and gpu_demo.pop("rollout")
    assert gpu_demo.pop("serving") == PROFILES["gpu_host"]["serving"] | {
        "gpu_memory_utilization": 0.3,
    }
    host_load = dict(PROFILES["gpu_host"]["load"])
    # a GPU host's traffic shares system prompts; the demo's small model sends none
    assert host_load.pop("shared_prefix") == {"tokens": 1024, "share": 0.9, "distinct": 4}
    assert gpu_demo.pop("load") == host_load | {"requests_per_level": 100}
    assert "shared_prefix" not in FILES["demo"]["load"]
    assert gpu_demo == {
        k: v for k, v in PROFILES["gpu_host"].items() if k not in ("serving", "load")
    }
    # The updates' files are the demos' with no quantized candidates.
    assert FILES["demo-update"] == {"candidates": []} | FILES["demo"]
    assert FILES["demo-gpu-update"] == {"candidates": []} | FILES["demo-gpu"]


def test_make_demo_passes_the_files_scripts_demo_config_chooses():
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:") :]
    assert "configs=$$(bash scripts/demo-config.sh) || exit 1" in demo
    assert re.search(r"--deployment release/release .*\n.*--config \$\$config ", demo)
    assert re.search(
        r"--deployment model-update/model-update .*\n.*--config \$\$update_config ", demo
    )


def test_every_worker_the_makefile_starts_names_its_queue():
    # A Prefect worker started with no --work-queue polls every queue of its pool: make
    # worker-up's worker would take a measurement sent to another host's host-NAME queue.
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    starts = [line for line in makefile.splitlines() if "prefect worker start" in line]
    assert len(starts) == 2, starts  # worker-up and fleet-join
    queues = sorted(re.search(r"--work-queue (\S+)", line).group(1) for line in starts)
    assert queues == ['"host-$(HOST)"', "default"]
