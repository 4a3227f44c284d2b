"""A vLLM wheel cut down for one GPU architecture, for a carry that must be small.

    python3 scripts/gpu/slim_vllm_wheel.py VLLM_WHEEL OUTDIR [SM=90]

The lent H200 takes 64 MiB a trip, and vLLM 0.26.0's wheel is several hundred MB, most of it
kernels for GPUs it is not. This writes the same release as ``vllm-0.26.0+sm90lean`` (a local
version label: pip's ``vllm==0.26.0`` still takes it, and the name says what it is): the CUDA
kernel libraries ``_C`` and ``_moe_C`` pruned to one architecture by the shared harness's
``fatbin_prune.py`` (the other architectures' SASS and the redundant PTX zeroed in place, the
layout unchanged), and left out what Hopper never loads for the models the project serves:
FlashAttention-2 (Hopper uses FA3), the Rust frontend binary, DeepGEMM, Blackwell's FMHA
sources. RECORD is rewritten (new hashes, the left-out files gone); the zip is stored
uncompressed so that the carry's xz sees the zeroed kernels. Not a release for other GPUs.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRUNE = HERE.parents[1] / ".gpu" / "fatbin_prune.py"  # ../shared/gpu, copied by build_carry.sh
KERNELS = ["vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so"]
LEFT_OUT = (
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/vllm-rs",
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/fmha_sm100/",
)


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def main() -> None:
    wheel, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    sm = sys.argv[3] if len(sys.argv) > 3 else "90"
    name, version, *rest = wheel.name.split("-")
    local = f"{version}+sm{sm}lean"
    old_info, new_info = f"{name}-{version}.dist-info/", f"{name}-{local}.dist-info/"
    out = outdir / "-".join([name, local, *rest])
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as src:
        pruned: dict[str, bytes] = {}
        for member in KERNELS:
            raw, cut = Path(tmp, "in.so"), Path(tmp, "out.so")
            raw.write_bytes(src.read(member))
            subprocess.run(
                [sys.executable, str(PRUNE), "prune", str(raw), str(cut), sm], check=True
            )
            pruned[member] = cut.read_bytes()
        records = []
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as dst:
            for info in src.infolist():
                path = info.filename
                if path.startswith(LEFT_OUT) or path == old_info + "RECORD":
                    continue
                data = pruned.get(path) or src.read(path)
                if path.startswith(old_info):
                    path = new_info + path[len(old_info) :]
                    if path.endswith("METADATA"):
                        data = data.replace(
                            f"\nVersion: {version}\n".encode(), f"\nVersion: {local}\n".encode(), 1
                        )
                zi = zipfile.ZipInfo(path, date_time=info.date_time)
                zi.external_attr = info.external_attr
                dst.writestr(zi, data)
                records.append((path, record_hash(data), str(len(data))))
            records.append((f"{new_info}RECORD", "", ""))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(records)  # names hold commas
            dst.writestr(new_info + "RECORD", text.getvalue())
    print(f"{out} ({out.stat().st_size / 2**20:.0f} MiB, stored) from {wheel.name}")


if __name__ == "__main__":
    main()
