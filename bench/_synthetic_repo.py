"""A synthetic multi-shard model repo of a given size, published on the local hub."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from demo.hub_server import publish_repo

BENCH_REPO = "bench/synthetic-1g"


def build(root: Path, total_mb: int = 1024, shards: int = 4) -> Path:
    """Random bytes in ``shards`` .safetensors-named files (LFS on the hub) plus a config."""
    source = root / "source"
    source.mkdir(parents=True, exist_ok=True)
    per_shard = total_mb * 1024 * 1024 // shards
    for index in range(shards):
        with (source / f"model-{index + 1:05d}-of-{shards:05d}.safetensors").open("wb") as fh:
            remaining = per_shard
            while remaining:
                block = min(remaining, 64 * 1024 * 1024)
                fh.write(os.urandom(block))
                remaining -= block
    (source / "config.json").write_text(json.dumps({"model_type": "synthetic"}))
    return source


def prepare(root: Path, total_mb: int) -> Path:
    """Build the repo, publish it under ``root/hub`` and drop the source copy."""
    source = build(root, total_mb)
    publish_repo(root / "hub", BENCH_REPO, source)
    shutil.rmtree(source)
    return root / "hub"
