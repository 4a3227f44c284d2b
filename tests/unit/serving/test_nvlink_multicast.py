"""NVLink multicast stays off in every process the project starts (issue 27): vLLM servers
of both backends, their supervisor, GuideLLM, HAProxy and the monitors (``child_env``), and
the quantizing process itself (tests/integration/test_quantize_paths.py); an operator's environment that turns it on is overridden."""

import json
import subprocess
import sys

import pytest

from llm_release.config import ServingConfig
from llm_release.hub.credentials import child_env
from llm_release.serving.backends.docker import container_spec
from llm_release.serving.serve import Owner, server_env
from llm_release.serving.supervise import supervisor_env
from llm_release.settings import NVLINK_MULTICAST_OFF

OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


@pytest.fixture(autouse=True)
def operator_turns_it_on(monkeypatch):
    for name in OFF:
        monkeypatch.setenv(name, "0" if name != "NCCL_NVLS_ENABLE" else "1")


def carries_off(env: dict[str, str]) -> None:
    assert {name: env.get(name) for name in OFF} == OFF


def test_the_three_switches_are_the_ones_the_gpu_hosts_need():
    assert NVLINK_MULTICAST_OFF == OFF


def test_every_child_environment_carries_them(home):
    carries_off(child_env())
    carries_off(child_env(HF_HUB_OFFLINE="1"))
    carries_off(server_env(ServingConfig(), "candidate"))
    carries_off(server_env(ServingConfig(), "stable"))
    carries_off(supervisor_env(home))


@pytest.mark.parametrize("gpu_host", [True, False])
def test_a_container_carries_them(home, gpu_host):
    spec = container_spec(
        image="llm-release/vllm-cpu:test",
        model_dir=home,
        served_names=["m"],
        serving=ServingConfig(tensor_parallel_size=2) if gpu_host else ServingConfig(),
        port=23456,
        owner=Owner(role="canary", release_id="r1"),
        gpu_ids=[0, 1] if gpu_host else None,
        gpu_host=gpu_host,
        home=home,
    )
    carries_off(spec["environment"])


def test_a_started_process_sees_them(home):
    """Not only the dictionary: a process started with it reads them."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        env=server_env(ServingConfig(), "candidate"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    carries_off(json.loads(out))
