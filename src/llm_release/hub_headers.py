"""A model's config and tensor table without its weights: from a folder or a hub repo.

On a hub, only ``config.json``, the safetensors index and each shard's header are read;
a header is fetched with HTTP range requests (8 bytes of length, then the JSON header),
so a 100 GB model costs a few KB per shard. Everything from the hub is hostile input:
the header length is bounded, the JSON must have the safetensors shape, dtype names must
be known, shapes and offsets must be consistent. Every request has a timeout.

safetensors layout: ``u64 little-endian N`` | ``N bytes JSON`` | tensor data, where the
JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (and
an optional ``__metadata__`` of strings).
"""

from __future__ import annotations

import json
import math
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from .errors import AcquireError, ConfigError
from .planner import DTYPE_BYTES, TensorInfo

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors library's own bound
MAX_JSON_BYTES = 50 * 1024 * 1024  # config.json / index: anything larger is not one
TIMEOUT_S = 30.0  # seconds, for connect, each read, write and pool wait
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_SHARD_NAME = re.compile(r"^[\w.\-]+\.safetensors$")


@dataclass
class ModelFiles:
    """What the planner reads: config, every tensor's dtype and shape, and the cost."""

    source: str
    config: dict
    tensors: dict[str, TensorInfo]
    shards: list[str]
    commit: str | None = None
    bytes_read: int = 0
    requests: int = 0
    shard_bytes_read: dict[str, int] = field(default_factory=dict)


def parse_header(raw: bytes, *, name: str, file_size: int | None = None) -> dict[str, TensorInfo]:
    """Validate and parse one safetensors JSON header (the bytes after the length)."""
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AcquireError(f"{name}: safetensors header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise AcquireError(f"{name}: safetensors header is not a JSON object")
    tensors: dict[str, TensorInfo] = {}
    end_max = 0
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise AcquireError(f"{name}: __metadata__ must map strings to strings")
            continue
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise AcquireError(
                f"{name}: tensor {key[:80]!r} must have exactly dtype, shape, data_offsets"
            )
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise AcquireError(
                f"{name}: tensor {key[:80]!r} has unknown dtype {str(dtype)[:20]!r}",
                hint="known: " + ", ".join(DTYPE_BYTES),
            )
        if not (
            isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            and isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            raise AcquireError(f"{name}: tensor {key[:80]!r} has a malformed shape or offsets")
        info = TensorInfo(dtype=dtype, shape=shape)
        expected = math.ceil(math.prod(shape) * DTYPE_BYTES[dtype])
        if offsets[1] - offsets[0] != expected:
            raise AcquireError(
                f"{name}: tensor {key[:80]!r} spans {offsets[1] - offsets[0]} bytes, but "
                f"{dtype}{shape} needs {expected}"
            )
        end_max = max(end_max, offsets[1])
        tensors[key] = info
    if file_size is not None and 8 + len(raw) + end_max > file_size:
        raise AcquireError(
            f"{name}: header promises {end_max} data bytes; the file has {file_size - 8 - len(raw)}"
        )
    return tensors


def _header_length(first8: bytes, name: str) -> int:
    if len(first8) < 8:
        raise AcquireError(f"{name}: shorter than a safetensors header (8 bytes)")
    (length,) = struct.unpack("<Q", first8[:8])
    if length < 2 or length > MAX_HEADER_BYTES:
        raise AcquireError(
            f"{name}: safetensors header length {length} is outside 2..{MAX_HEADER_BYTES}",
            hint="the file is not safetensors, or it is damaged",
        )
    return length


def _load_json(raw: bytes, name: str) -> dict:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AcquireError(f"{name} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise AcquireError(f"{name} is not a JSON object")
    return data


def _shards_from_index(index: dict, name: str) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise AcquireError(f"{name} has no weight_map")
    shards = sorted(set(weight_map.values()))
    for shard in shards:
        if not isinstance(shard, str) or not _SHARD_NAME.match(shard):
            raise AcquireError(
                f"{name} names a shard {str(shard)[:80]!r} that is not a plain file name"
            )
    return shards


# ---------------------------------------------------------------- a local folder


def read_local(model_dir: Path) -> ModelFiles:
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(
            f"{model_dir} has no config.json",
            hint="pass a model folder, or a repo id with --endpoint",
        )
    config = _load_json(config_path.read_bytes(), str(config_path))
    if (model_dir / INDEX_NAME).is_file():
        shards = _shards_from_index(
            _load_json((model_dir / INDEX_NAME).read_bytes(), INDEX_NAME), INDEX_NAME
        )
    elif (model_dir / SINGLE_NAME).is_file():
        shards = [SINGLE_NAME]
    else:
        raise ConfigError(f"{model_dir} has no safetensors weights (index or {SINGLE_NAME})")
    files = ModelFiles(source=str(model_dir), config=config, tensors={}, shards=shards)
    for shard in shards:
        path = model_dir / shard
        with path.open("rb") as fh:
            length = _header_length(fh.read(8), shard)
            raw = fh.read(length)
        if len(raw) != length:
            raise AcquireError(f"{shard}: header cut short ({len(raw)} of {length} bytes)")
        files.tensors.update(parse_header(raw, name=shard, file_size=path.stat().st_size))
        files.bytes_read += 8 + length
    return files


# ---------------------------------------------------------------- a hub repo


def read_hub(
    repo_id: str,
    *,
    revision: str = "main",
    endpoint: str | None = None,
    timeout: float = TIMEOUT_S,
) -> ModelFiles:
    """config.json, the index and every shard header of a hub repo, by range requests."""
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    endpoint = (endpoint or constants.ENDPOINT).rstrip("/")
    session = get_session()
    headers = build_hf_headers()
    files = ModelFiles(source=f"{endpoint}/{repo_id}@{revision}", config={}, tensors={}, shards=[])

    def get(path: str, byte_range: tuple[int, int] | None = None, *, missing_ok: bool = False):
        url = hf_hub_url(repo_id, path, revision=files.commit or revision, endpoint=endpoint)
        extra = dict(headers)
        if byte_range:
            extra["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
        limit = (byte_range[1] - byte_range[0] + 1) if byte_range else MAX_JSON_BYTES
        try:
            with session.stream(
                "GET", url, headers=extra, timeout=timeout, follow_redirects=True
            ) as response:
                if response.status_code == 404 and missing_ok:
                    return None, None
                if response.status_code not in (200, 206):
                    raise AcquireError(
                        f"{url} answered HTTP {response.status_code}",
                        hint="check the repo id, the revision and, for a private repo, HF_TOKEN",
                    )
                if byte_range and response.status_code == 200:
                    raise AcquireError(
                        f"{url} ignored the Range header (HTTP 200)",
                        hint="the hub must support range requests; reading the whole shard "
                        "would download the weights",
                    )
                body = b""
                for chunk in response.iter_bytes(64 * 1024):
                    body += chunk
                    if len(body) > limit:
                        raise AcquireError(f"{url} sent more than the {limit} bytes asked for")
                headers_in = response.headers
        except AcquireError:
            raise
        except Exception as exc:  # httpx transport errors and timeouts
            raise AcquireError(
                f"could not reach {url}: {type(exc).__name__}: {str(exc)[:200]}",
                hint="check --endpoint (or HF_ENDPOINT) and the network",
            ) from exc
        files.commit = files.commit or headers_in.get("X-Repo-Commit")
        files.requests += 1
        files.bytes_read += len(body)
        total = None
        match = re.fullmatch(r"bytes \d+-\d+/(\d+)", headers_in.get("Content-Range", "").strip())
        if match:
            total = int(match.group(1))
        return body, total

    config_raw, _ = get("config.json")
    files.config = _load_json(config_raw, "config.json")
    index_raw, _ = get(INDEX_NAME, missing_ok=True)
    files.shards = (
        _shards_from_index(_load_json(index_raw, INDEX_NAME), INDEX_NAME)
        if index_raw is not None
        else [SINGLE_NAME]
    )
    for shard in files.shards:
        # Two exact ranges: the length, then the header. Not one byte of tensor data.
        first, size = get(shard, (0, 7))
        length = _header_length(first, shard)
        raw, size = get(shard, (8, 8 + length - 1))
        if len(raw) != length:
            raise AcquireError(f"{shard}: header cut short ({len(raw)} of {length} bytes)")
        files.shard_bytes_read[shard] = 8 + len(raw)
        files.tensors.update(parse_header(raw, name=shard, file_size=size))
    return files
