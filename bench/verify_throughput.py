"""Benchmark: verify-only of a local copy versus `openssl dgst -sha256` on the same files.

Downloads a synthetic 1 GiB model in 4 shards from the local hub once, then times
``llm-release verify``'s function (``verify_dir``: SHA-256 of every file, shards in
parallel threads) against one `openssl dgst -sha256` process over the same files. Both
read from the page cache (a warm-up pass runs first). Prints each one's throughput, our
CPU use in cores (both cores busy → about 2), and, last, our throughput per core as a
fraction of openssl's (target: at least 0.9).

    .venv/bin/python bench/verify_throughput.py [--size-mb 1024] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _synthetic_repo  # noqa: E402

from demo.hub_server import HubServer  # noqa: E402
from llm_release.config import SourceConfig  # noqa: E402
from llm_release.hub.acquire import acquire, verify_dir  # noqa: E402


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-verify-", dir="/tmp"))
    try:
        _synthetic_repo.prepare(scratch, args.size_mb)
        os.environ["LLM_RELEASE_HOME"] = str(scratch / "home")
        with HubServer(scratch / "hub") as hub:
            acquired = acquire(SourceConfig(repo_id=_synthetic_repo.BENCH_REPO, endpoint=hub.url))
        shutil.rmtree(scratch / "hub")
        files = sorted(str(p) for p in acquired.model_dir.iterdir() if p.is_file())
        total = sum(os.path.getsize(f) for f in files)
        assert verify_dir(acquired.model_dir) == []  # warm-up: files now in the page cache
        ours, openssl, cores = [], [], []
        for _ in range(args.rounds):
            cpu0, wall0 = cpu_seconds(), time.monotonic()
            assert verify_dir(acquired.model_dir) == []
            wall = time.monotonic() - wall0
            ours.append(wall)
            cores.append((cpu_seconds() - cpu0) / wall)
            wall0 = time.monotonic()
            subprocess.run(
                ["openssl", "dgst", "-sha256", *files], check=True, stdout=subprocess.DEVNULL
            )
            openssl.append(time.monotonic() - wall0)
        gib = total / 2**30
        ours_rate, openssl_rate = gib / min(ours), gib / min(openssl)
        used = max(cores)
        print(f"{len(files)} files, {gib:.2f} GiB")
        print(
            f"verify_dir: {ours_rate:.2f} GiB/s using {used:.2f} cores "
            f"({ours_rate / used:.2f} GiB/s per core)"
        )
        print(f"openssl dgst -sha256 (one process, one core): {openssl_rate:.2f} GiB/s")
        print(
            f"verify per-core throughput / openssl per-core throughput: "
            f"{(ours_rate / used) / openssl_rate:.3f}"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
