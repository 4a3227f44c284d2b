"""The disk preflight on a real small filesystem: a 1 MiB tmpfs refuses the download and the
quantization before a byte is written there; a 64 MiB one takes the tiny model's download.

The tests run as root (CI does): mounting a tmpfs needs it, and a mount that fails fails
the test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llm_release.config import CandidateConfig, SourceConfig
from llm_release.errors import DiskSpaceError
from llm_release.hub.acquire import acquire
from llm_release.quantization.quantize import quantize
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration


@pytest.fixture()
def small_fs(tmp_path):
    """Mount tmpfs filesystems of the sizes asked for; every one is unmounted after."""
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        point = tmp_path / f"fs-{size}"
        point.mkdir()
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"mount -t tmpfs failed (run as root): {done.stderr}"
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_a_download_larger_than_the_disk_is_refused_before_any_byte(hub, small_fs, monkeypatch):
    home = small_fs("1m")
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    source = SourceConfig(repo_id=TINY_REPO, endpoint=hub.url)
    with pytest.raises(DiskSpaceError) as caught:
        acquire(source)
    line = caught.value.one_line()
    assert f"downloading {TINY_REPO}@" in line and "1.0 MiB free" in line
    assert _written(home) == []  # not even the model folder
    assert hub.counter.bytes == {}  # and no file was fetched


def test_a_download_that_fits_goes_through(hub, small_fs, monkeypatch):
    home = small_fs("64m")
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    acquired = acquire(SourceConfig(repo_id=TINY_REPO, endpoint=hub.url))
    assert acquired.model_dir.is_relative_to(home) and acquired.downloaded_bytes > 16 * 2**20


def test_a_quantization_larger_than_the_disk_is_refused_before_any_byte(
    tiny_model_dir, small_fs, monkeypatch, tmp_path
):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    out_root = small_fs("1m")
    candidate = CandidateConfig(name="fp8-dynamic", scheme="FP8_DYNAMIC")
    with pytest.raises(DiskSpaceError, match=r"quantizing fp8-dynamic \(FP8_DYNAMIC"):
        quantize(tiny_model_dir, candidate, out_root)
    assert _written(out_root) == []
    assert os.statvfs(out_root).f_bfree == os.statvfs(out_root).f_blocks  # nothing written
