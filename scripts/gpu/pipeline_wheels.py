"""Fetch the pipeline's Python packages for the GPU machine (Python 3.12, no network there).

The device image ('cuda', KINDS.md) already holds torch, transformers, numpy and ~200 more
(image_packages.txt beside this file, as KINDS.md lists them). This walks the requirements
of the pipeline's packages (llm-compressor, lm-eval[api], GuideLLM, gguf, ...) from their
wheels' metadata, evaluated for CPython 3.12 on Linux, and downloads with ``--no-deps`` only
what the image lacks, one version each, so that the walk never pulls a CUDA torch.

    python3 scripts/gpu/pipeline_wheels.py OUTDIR            # ~20 MB of wheels

The serving side (vLLM 0.26 and its own dependencies, compressed-tensors 0.17 among them)
is carried apart (vllm_gpu_carry.sh) and installed into another folder: the two pin
different compressed-tensors releases, as on the CPU (.venv and .venv-vllm).
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).parent
# Pinned as in pyproject.toml's pipeline extra (and what .venv resolved for their needs).
TOP = [
    "llmcompressor==0.14.0.1",
    "compressed-tensors==0.19.0",
    "lm-eval[api]==0.4.13",
    "guidellm==0.8.1",
    "gguf",
    "docker>=7.1",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "auto-round==0.15.1",
    "datasets==5.2.0",
    "h2",
    "hpack",
    "hyperframe",  # httpx[http2], which GuideLLM asks for
    "regex==2026.11.19",  # answer_regex with a search timeout (llm_release.evaluation.metrics)
    # the release record (llm_release.record): SQLite on the device, no psycopg
    "SQLAlchemy==2.1.9",
    "alembic==1.20.1",
]
PLATFORMS = [
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux_2_35_x86_64",
    "manylinux1_x86_64",
]
# Never fetched, whatever asks for them: the image's own GPU stack, or a heavy optional
# that the pipeline's code paths do not import on the device.
NEVER = {"torch", "triton", "nvidia-cudnn-cu13", "torchvision", "torchaudio", "vllm"}


def env312() -> dict[str, str]:
    env = default_environment()
    env.update(
        python_version="3.12",
        python_full_version="3.12.3",
        implementation_version="3.12.3",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        os_name="posix",
    )
    return env


def requires(wheel: Path, extras: set[str]) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is None:
            out.append(req)
            continue
        for extra in extras | {""}:
            env = env312() | {"extra": extra}
            if req.marker.evaluate(env):
                out.append(req)
                break
    return out


def download(spec: str, dest: Path) -> Path:
    before = set(dest.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    cmd += ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312"]
    cmd += ["--abi", "abi3", "--abi", "none"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    cmd += ["--platform", "any", "-d", str(dest), spec]
    if subprocess.run(cmd, stderr=subprocess.DEVNULL).returncode:
        # sdist only (sqlitedict, word2number): build the pure-Python wheel here
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), spec],
            check=True,
        )
    new = set(dest.glob("*.whl")) - before
    name = canonicalize_name(Requirement(spec).name)
    found = [w for w in (new or set(dest.glob("*.whl"))) if _dist(w) == name]
    if not found:
        raise SystemExit(f"pip downloaded no wheel for {spec}")
    return found[0]


def _dist(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-")[0])


def main() -> None:
    dest = Path(sys.argv[1]).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    image = {canonicalize_name(n) for n in (HERE / "image_packages.txt").read_text().split()}
    have: dict[str, Path] = {_dist(w): w for w in dest.glob("*.whl")}
    queue = [Requirement(s) for s in TOP]
    pinned = {canonicalize_name(r.name) for r in queue}
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        top = name in pinned and str(req) in TOP
        if name in NEVER or (name in image and not top):
            continue
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        if name not in have:
            spec = str(req).split(";")[0] if top else re.sub(r"\[.*?\]", "", str(req.name))
            if req.specifier and not top:
                spec = f"{req.name}{req.specifier}"
            have[name] = download(re.sub(r"\[.*?\]", "", spec), dest)
        queue += requires(have[name], set(req.extras))
    total = sum(w.stat().st_size for w in dest.glob("*.whl"))
    print(f"{len(have)} wheels, {total / 2**20:.1f} MiB in {dest}")


if __name__ == "__main__":
    main()
