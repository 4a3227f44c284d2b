"""Disk preflight: a download or a quantization that cannot fit is refused before its first
byte is written, not half-way through with an OS error after minutes of work.

The bytes needed come from metadata, never from the bytes themselves:

- a download: the sizes the hub lists for each file, less what an earlier, interrupted
  download already holds on disk (a finished file or a ``.part`` being resumed);
- a quantization: the artifact's size estimated from the source's safetensors headers,
  tensor by tensor: a Linear weight the recipe quantizes takes 1 byte per parameter in
  FP8 (plus a per-channel scale) and half a byte in W4A16 (plus a scale, and a zero point
  when asymmetric, per group); everything the recipe leaves alone (embeddings, ``lm_head``,
  norms, the ignore list) keeps its size; the tokenizer and other files are copied.
  On the tiny Llama the estimate came within 0.1% of the artifact llm-compressor wrote,
  for FP8_DYNAMIC (28,996,933 bytes against 28,999,007) and W4A16_AWQ (28,878,149 against
  28,862,910); the margin covers the difference.

These are set against the free space of the target folder's filesystem (the nearest
existing folder above it), with a margin for what is written beside the weights
(``MARGIN_SHARE``, at least ``MARGIN_BYTES``).
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterable
from pathlib import Path

from llm_release.errors import DiskSpaceError

MARGIN_SHARE = 0.05
MARGIN_BYTES = 16 * 2**20
# Bytes per quantized weight parameter, and per scale / zero point (stored as float32 at
# most: an over-estimate for bf16 scales).
PARAM_BYTES = {"FP8_DYNAMIC": 1.0, "W4A16_AWQ": 0.5}
SCALE_BYTES = 4
FLOAT_DTYPES = {"F32", "F16", "BF16", "F64"}


def existing_parent(path: Path) -> Path:
    """``path`` or the nearest folder above it that exists: where its bytes would land."""
    path = Path(path).absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or "/")


def free_bytes(path: Path) -> int:
    """Free bytes an unprivileged writer gets on ``path``'s filesystem."""
    return shutil.disk_usage(existing_parent(path)).free


def required(need: int) -> int:
    """``need`` plus the margin."""
    return need + max(int(need * MARGIN_SHARE), MARGIN_BYTES) if need > 0 else 0


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} bytes"


def check_space(what: str, need: int, target: Path, *, free: int | None = None) -> int:
    """Refuse ``what`` (one line, with the fix) when ``need`` bytes and the margin do not fit
    the free space of ``target``'s filesystem; ``free`` replaces the measured figure (tests,
    and callers that measured it). Returns the free bytes it judged against."""
    where = existing_parent(target)
    free = free_bytes(target) if free is None else free
    want = required(need)
    if want > free:
        raise DiskSpaceError(
            f"{what} needs {_size(need)} (+{_size(want - need)} margin) in {target}, and "
            f"its filesystem ({where}) has {_size(free)} free",
            hint=f"free {_size(want - free)} or more there, or point LLM_RELEASE_HOME at a "
            "larger disk; nothing was written",
        )
    return free


# ---------------------------------------------------------------- downloads


def download_need(model_dir: Path, files: Iterable[tuple[str, int | None]]) -> int:
    """Bytes a download of ``files`` ((path, listed size)) into ``model_dir`` still writes:
    each file's size less what is already there (a finished file, or the ``.part`` a
    resumed transfer continues). A file the hub lists without a size counts 0 here; the
    listing refuses those before any download."""
    need = 0
    for rel, size in files:
        if not size:
            continue
        target = Path(model_dir) / rel
        have = 0
        for path in (target, target.with_name(target.name + ".part")):
            try:
                have = max(have, path.stat().st_size)
            except OSError:
                continue
        need += max(0, size - min(have, size))
    return need


def check_download(
    repo: str, model_dir: Path, files: Iterable[tuple[str, int | None]], *, free: int | None = None
) -> int:
    """The download preflight: the bytes still to fetch against ``model_dir``'s free space."""
    need = download_need(model_dir, files)
    check_space(f"downloading {repo}", need, model_dir, free=free)
    return need


# ---------------------------------------------------------------- quantization


def quantized_bytes(
    tensors: dict,
    scheme: str,
    ignored,
    *,
    group_size: int = 128,
    symmetric: bool = False,
) -> int:
    """The weights' size after ``scheme``: ``tensors`` maps names to planner.TensorInfo;
    ``ignored(module)`` says whether the recipe leaves a module alone (RecipeChoice.reason_for)."""
    per_param = PARAM_BYTES[scheme]
    total = 0
    for name, info in tensors.items():
        nbytes = info.nbytes
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if (
            module is None
            or len(info.shape) != 2
            or info.dtype not in FLOAT_DTYPES
            or "embed" in module
            or ignored(module)
        ):
            total += nbytes
            continue
        rows, cols = info.shape
        if scheme == "FP8_DYNAMIC":
            total += math.ceil(rows * cols * per_param) + rows * SCALE_BYTES
        else:
            groups = rows * math.ceil(cols / max(1, group_size))
            zero_points = 0 if symmetric else groups * SCALE_BYTES
            total += math.ceil(rows * cols * per_param) + groups * SCALE_BYTES + zero_points
    return total


def other_files_bytes(model_dir: Path) -> int:
    """The source folder's files besides the weights (tokenizer, configs): copied along."""
    return sum(
        p.stat().st_size
        for p in Path(model_dir).rglob("*")
        if p.is_file() and not p.name.endswith(".safetensors")
    )


def quantize_need(model_dir: Path, candidate, choice) -> int:
    """Estimated bytes of ``candidate``'s artifact of the model in ``model_dir``; ``choice`` is
    the recipes.RecipeChoice quantize built (its ignore list)."""
    from llm_release.hub.hub_headers import read_local

    tensors = read_local(Path(model_dir)).tensors
    weights = quantized_bytes(
        tensors,
        candidate.scheme,
        choice.reason_for,
        group_size=getattr(candidate, "group_size", 128),
        symmetric=getattr(candidate, "symmetric", False),
    )
    return weights + other_files_bytes(model_dir)


def check_quantize(
    model_dir: Path, candidate, choice, out_root: Path, *, free: int | None = None
) -> int:
    """The quantization preflight: the artifact's estimated size against ``out_root``'s
    free space (the staging folder and the artifact live there)."""
    need = quantize_need(model_dir, candidate, choice)
    check_space(
        f"quantizing {candidate.name} ({candidate.scheme}, estimated from the source's "
        "safetensors headers)",
        need,
        out_root,
        free=free,
    )
    return need
