"""scripts/demo-config.sh: which config files `make demo` passes, from the serving runtime
setup made (.venv-vllm/llm-release-flavour) and the GPUs nvidia-smi lists."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The script in a folder of its own, with a serving virtualenv folder to mark."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo-config.sh", tmp_path / "scripts")
    (tmp_path / ".venv-vllm").mkdir()
    (tmp_path / "bin").mkdir()
    return tmp_path


def run(clone: Path, flavour: str | None, gpus: int | None, **env: str):
    marker = clone / ".venv-vllm" / "llm-release-flavour"
    if flavour is None:
        marker.unlink(missing_ok=True)
    else:
        marker.write_text(flavour + "\n")
    smi = clone / "bin" / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if gpus is not None:
        lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(gpus))
        smi.write_text("#!/bin/sh\n" + lines)
        smi.chmod(0o755)
    path = f"{clone / 'bin'}:/usr/bin:/bin"
    return subprocess.run(
        ["bash", str(clone / "scripts" / "demo-config.sh")],
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": os.environ.get("HOME", "/root"), **env},
        timeout=30,
    )


@pytest.mark.parametrize("flavour", [None, "cpu"])
def test_a_cpu_runtime_gets_the_cpu_demo(clone, flavour):
    out = run(clone, flavour, gpus=2)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["configs/demo.json", "configs/demo-update.json"]


@pytest.mark.parametrize("flavour", ["gpu", "host-torch"])
@pytest.mark.parametrize("gpus", [1, 2])
def test_a_cuda_runtime_gets_the_gpu_demo(clone, flavour, gpus):
    out = run(clone, flavour, gpus=gpus)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["configs/demo-gpu.json", "configs/demo-gpu-update.json"]


@pytest.mark.parametrize("gpus", [None, 0])
def test_a_cuda_runtime_without_a_gpu_is_refused_in_one_line(clone, gpus):
    out = run(clone, "gpu", gpus=gpus)
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.splitlines()
    assert "nvidia-smi lists no GPU" in line and "DEMO_CONFIG=FILE" in line


def test_files_given_win(clone):
    out = run(clone, "gpu", gpus=0, DEMO_CONFIG="a.json", DEMO_UPDATE_CONFIG="b.json")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["a.json", "b.json"]
