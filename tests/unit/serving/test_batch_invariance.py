"""serving/batch_invariance.py: which servers decode batch-invariantly, read from the GPUs a
stand-in nvidia-smi lists (the real one answers `--query-gpu=index,compute_cap` so)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_release.config import ReleaseConfig, ServingConfig
from llm_release.errors import ConfigError
from llm_release.serving import batch_invariance, gpus

ON = ServingConfig(batch_invariant="on")


@pytest.fixture
def smi(tmp_path: Path, monkeypatch):
    """Put a stand-in nvidia-smi that prints ``rows`` first on PATH (None: no nvidia-smi)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", str(folder))

    def install(rows: str | None, code: int = 0) -> None:
        tool = folder / "nvidia-smi"
        tool.unlink(missing_ok=True)
        if rows is not None:
            tool.write_text(f"#!/bin/sh\nprintf '{rows}'\nexit {code}\n")
            tool.chmod(0o755)

    return install


def test_compute_capabilities_are_read_per_gpu_and_junk_is_left_out(smi):
    smi("0, 9.0\\n1, 8.6\\n2, [N/A]\\nnoise\\n")
    assert gpus.compute_capabilities() == {0: 9.0, 1: 8.6}
    smi("0, 9.0\\n", code=9)
    assert gpus.compute_capabilities() == {}
    smi(None)
    assert gpus.compute_capabilities() == {}


def test_on_is_taken_on_a_hopper_gpu_and_says_why(smi):
    smi("0, 9.0\\n")
    on, why = batch_invariance.enabled(ON)
    assert on and "9" in why
    assert batch_invariance.env(ON) == {"VLLM_BATCH_INVARIANT": "1"}


def test_off_is_the_default(smi):
    smi("0, 9.0\\n")
    assert ServingConfig().batch_invariant == "off"
    assert batch_invariance.env(ServingConfig()) == {"VLLM_BATCH_INVARIANT": "0"}


def test_on_without_a_gpu_or_below_ampere_is_refused_with_the_way_out(smi):
    smi(None)
    with pytest.raises(ConfigError, match="no NVIDIA GPU"):
        batch_invariance.check(ON)
    smi("0, 7.5\\n")
    with pytest.raises(ConfigError) as caught:
        batch_invariance.check(ON)
    assert "compute capability below 8 (GPU 0: 7.5)" in caught.value.message
    assert "off" in caught.value.hint


def test_the_servers_own_gpus_decide(smi):
    smi("0, 9.0\\n1, 7.5\\n")
    assert batch_invariance.enabled(ON, [0])[0]
    for gpu_ids in ([1], [0, 1], None, [3]):  # None: all of the host's
        with pytest.raises(ConfigError):
            batch_invariance.enabled(ON, gpu_ids)


def test_off_is_written_even_on_a_gpu_so_an_inherited_variable_cannot_decide(smi, monkeypatch):
    smi("0, 9.0\\n")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    assert batch_invariance.env(ServingConfig(batch_invariant="off")) == {
        "VLLM_BATCH_INVARIANT": "0"
    }


def test_the_setting_takes_only_its_two_words():
    source = {"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    with pytest.raises(ValueError, match="batch_invariant"):
        ReleaseConfig.model_validate({"source": source, "serving": {"batch_invariant": "yes"}})
    with pytest.raises(ValueError, match="batch_invariant"):
        ReleaseConfig.model_validate({"source": source, "serving": {"batch_invariant": "auto"}})
    assert ReleaseConfig.model_validate({"source": source}).serving.batch_invariant == "off"


STAND_IN_SMI = """#!/bin/sh
case "$*" in
  *compute_cap*) printf '0, %s\\n' "$CAP" ;;
  *query-gpu=index*) printf '0\\n' ;;
  *) echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)' ;;
esac
"""


@pytest.mark.parametrize(
    ("cap", "setting", "expected"),
    [("9.0", "on", "1"), ("9.0", "off", "0")],
)
def test_a_process_server_starts_vllm_with_the_mode_of_its_gpus(
    tmp_path, monkeypatch, cap, setting, expected
):
    """The process backend, up to the exec: a stand-in python writes the environment it was
    started with; the GPU ledger gives the server GPU 0 as on a one-GPU host."""
    from llm_release.serving.serve import Owner, VllmServer

    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setenv("CAP", cap)
    seen = tmp_path / "env.txt"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nenv > {seen}\n")
    python.chmod(0o755)
    monkeypatch.setenv("LLM_RELEASE_VLLM_PYTHON", str(python))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    serving = ServingConfig(dtype="bfloat16", max_num_seqs=4, batch_invariant=setting)
    server = VllmServer(model, ["m"], serving, tmp_path / "vllm.log", owner=Owner())
    try:
        server.start()
        server.process.wait(timeout=30)
    finally:
        server.stop()
    env = dict(line.split("=", 1) for line in seen.read_text().splitlines() if "=" in line)
    assert env["VLLM_BATCH_INVARIANT"] == expected
    assert env["CUDA_VISIBLE_DEVICES"] == "0"


@pytest.mark.parametrize(("gpu_host", "expected"), [(True, "1"), (False, "0")])
def test_a_container_gets_the_mode_of_its_gpus(smi, tmp_path, gpu_host, expected):
    from llm_release.serving.backends.docker import HostSettings, container_spec
    from llm_release.serving.serve import Owner

    smi("0, 9.0\\n1, 9.0\\n")
    spec = container_spec(
        image="vllm/vllm-openai:v0.32.0",
        model_dir=tmp_path / "models" / "m",
        served_names=["m"],
        serving=ServingConfig(backend="docker", batch_invariant="on"),
        port=41000,
        owner=Owner(role="stable", release_id="r"),
        gpu_ids=[1] if gpu_host else None,
        gpu_host=gpu_host,
        home=tmp_path,
        host=HostSettings(),
    )
    assert spec["environment"]["VLLM_BATCH_INVARIANT"] == expected
