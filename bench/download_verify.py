"""Benchmark: download-and-verify versus the same download with no verification.

Publishes a synthetic 1 GiB model in 4 shards on the local Hub endpoint (its own process)
and downloads it
with the acquire stage twice per round: as shipped (SHA-256 computed on the streaming
bytes), and with the hashing replaced by a no-op — the same client, parallelism and
writes, so the difference is the cost of verifying. Rounds alternate the order; the best
of each is compared. The last line is the ratio (target: at most 1.10).

    .venv/bin/python bench/download_verify.py [--size-mb 1024] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _synthetic_repo  # noqa: E402

from llm_release.config import SourceConfig  # noqa: E402
from llm_release.hub import download  # noqa: E402
from llm_release.hub.acquire import TransferSettings, acquire  # noqa: E402
from llm_release.serving.serve import free_port  # noqa: E402


class _NoHash:
    """Stands in for the hashes: accepts the bytes, computes nothing."""

    def __init__(self, size, want_blob):
        self.sha256 = self
        self.blob = None

    def update(self, data):
        pass

    def hexdigest(self):
        return ""


def timed_download(scratch: Path, url: str, verify: bool) -> float:
    home = scratch / "home"
    shutil.rmtree(home, ignore_errors=True)
    os.environ["LLM_RELEASE_HOME"] = str(home)
    original_hashes, original_check = download._Hashes, download.check
    if not verify:
        download._Hashes = _NoHash
        download.check = lambda *args: None
    try:
        started = time.monotonic()
        acquired = acquire(
            SourceConfig(repo_id=_synthetic_repo.BENCH_REPO, endpoint=url),
            settings=TransferSettings(workers=4),
        )
        elapsed = time.monotonic() - started
    finally:
        download._Hashes, download.check = original_hashes, original_check
    assert acquired.downloaded_bytes > 0
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-dl-", dir="/tmp"))
    try:
        _synthetic_repo.prepare(scratch, args.size_mb)
        best = {True: float("inf"), False: float("inf")}
        # The hub runs in its own process, as a real one does: it does not share our GIL.
        port = free_port()
        hub = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_release.cli",
                "hub",
                "serve",
                "--root",
                str(scratch / "hub"),
                "--port",
                str(port),
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"{url}/api/models/{_synthetic_repo.BENCH_REPO}")
                    break
                except OSError:
                    time.sleep(0.1)
            for round_index in range(args.rounds):
                order = (True, False) if round_index % 2 == 0 else (False, True)
                for verify in order:
                    seconds = timed_download(scratch, url, verify)
                    best[verify] = min(best[verify], seconds)
                    rate = args.size_mb / seconds
                    print(
                        f"round {round_index + 1}: {'verify' if verify else 'no verify'} "
                        f"{seconds:.2f} s ({rate:.0f} MiB/s)",
                        flush=True,
                    )
        finally:
            hub.terminate()
            hub.wait()
        print(
            f"size: {args.size_mb} MiB in 4 shards; best verify {best[True]:.2f} s, "
            f"best no-verify {best[False]:.2f} s"
        )
        print(f"download+verify / download-only: {best[True] / best[False]:.3f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
