"""A model's config and tensor table without its weights: from a folder or a hub repo.

On a hub, only ``config.json``, the safetensors index and each shard's header are read;
a header is fetched with HTTP range requests (8 bytes of length, then the JSON header),
so a 100 GB model costs a few KB per shard. Everything from the hub is hostile input:
the header length is bounded, the JSON must have the safetensors shape, dtype names must
be known, shapes and offsets must be consistent. Every request has a timeout, and all the
reads of one plan share one wall-clock budget (``LLM_RELEASE_PLAN_DEADLINE_S``, an operator
setting): a hub that trickles a byte every few seconds beats any per-read timeout, not the
budget. Header bytes are capped per shard and in total, and so is the number of shards.

safetensors layout: ``u64 little-endian N`` | ``N bytes JSON`` | tensor data, where the
JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (and
an optional ``__metadata__`` of strings).
"""

from __future__ import annotations

import json
import math
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from llm_release.errors import AcquireError, ConfigError
from llm_release.hub import credentials
from llm_release.hub.credentials import HubToken
from llm_release.settings import DEFAULT_PLAN_DEADLINE_S, settings
from llm_release.sizing import DTYPE_BYTES, MAX_CONFIG_BYTES, TensorInfo, load_config_json

# Header caps. A header holds ~150 bytes per tensor: a 5-10 GB shard of the largest public
# checkpoints (DeepSeek-V3, Qwen3.5-397B-A17B, Llama 3.1 405B) has a few hundred to a few
# thousand tensors, well under 1 MB; the whole tensor table of a 397B MoE in FP8 (92k
# experts' weights and as many scales) is ~27 MB. The safetensors library's own bound, 100 MB
# per file, let a hub make the planner fetch and parse gigabytes.
MAX_HEADER_BYTES = 16 * 1024 * 1024  # one shard's header: 16x a large one, a 100k-tensor file
MAX_TOTAL_HEADER_BYTES = 64 * 1024 * 1024  # all shards: 2x the largest real tensor table
MAX_SHARDS = 4096  # the largest public repos have ~100-400 shards
MAX_JSON_BYTES = 50 * 1024 * 1024  # the index (~20 MB for a 397B FP8 MoE)
TIMEOUT_S = 30.0  # seconds, for connect, each read, write and pool wait
# The wall-clock budget of all hub reads of one plan (operator setting, trusted; default
# 60 s). It bounds how long a trickling hub holds 'plan' and a release's plan stage. A plan
# of the largest public repos makes ~400 range requests (two per shard), 40-80 s at the
# public hub's 0.1-0.2 s per redirected request: such a repo, or a slow mirror, may need
# LLM_RELEASE_PLAN_DEADLINE_S raised (the error says so).
PLAN_DEADLINE_ENV = "LLM_RELEASE_PLAN_DEADLINE_S"
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MODELSCOPE_DEFAULT = "https://www.modelscope.cn"
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
    except RecursionError:
        raise AcquireError(f"{name}: safetensors header is nested without end") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, over-long integers
        raise AcquireError(f"{name}: safetensors header is not JSON ({str(exc)[:120]})") from None
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
    except RecursionError:
        raise AcquireError(f"{name} is nested without end") from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, over-long integers
        raise AcquireError(f"{name} is not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(data, dict):
        raise AcquireError(f"{name} is not a JSON object")
    return data


def _shards_from_index(index: dict, name: str) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise AcquireError(f"{name} has no weight_map")
    for shard in weight_map.values():
        if not isinstance(shard, str) or not _SHARD_NAME.match(shard):
            raise AcquireError(
                f"{name} names a shard {str(shard)[:80]!r} that is not a plain file name"
            )
    shards = sorted(set(weight_map.values()))
    if len(shards) > MAX_SHARDS:
        raise AcquireError(
            f"{name} names {len(shards):,} shards, over the planner's limit of {MAX_SHARDS:,}",
            hint="no public checkpoint has more than a few hundred; the repo is damaged or hostile",
        )
    return shards


def _count_header(files: ModelFiles, shard: str, length: int) -> None:
    """Refuse a header that would take the plan past MAX_TOTAL_HEADER_BYTES, before it is read."""
    total = sum(files.shard_bytes_read.values()) + 8 + length
    if total > MAX_TOTAL_HEADER_BYTES:
        raise AcquireError(
            f"{shard}: the shard headers come to more than the planner's limit of "
            f"{MAX_TOTAL_HEADER_BYTES:,} bytes in all ({len(files.shard_bytes_read)} read)",
            hint="no public checkpoint's tensor table comes near it; the repo is damaged or "
            "hostile",
        )


def plan_deadline_s() -> float:
    """The operator's budget for all hub reads of one plan, from LLM_RELEASE_PLAN_DEADLINE_S."""
    return settings().plan_deadline_s


class _Deadline:
    """One wall-clock budget shared by every read of one plan."""

    def __init__(self, budget_s: float, endpoint: str) -> None:
        self.budget_s = budget_s
        self.host = urlsplit(endpoint).netloc.rsplit("@", 1)[-1] or endpoint
        self.end = time.monotonic() + budget_s

    def remaining(self) -> float:
        return self.end - time.monotonic()

    def error(self) -> AcquireError:
        return AcquireError(
            f"{self.host} did not send the plan's config, index and shard headers within "
            f"the {self.budget_s:g} s budget",
            hint=f"the hub is slow or trickling: use another endpoint, or raise "
            f"{PLAN_DEADLINE_ENV} (default {DEFAULT_PLAN_DEADLINE_S:g} s) for a slow mirror",
        )

    def check(self) -> None:
        if self.remaining() <= 0:
            raise self.error()

    def run(self, work):
        """``work()`` in a thread, waited for until the budget ends (a read blocked in the
        socket cannot be interrupted from here; its own timeout, capped at what was left of
        the budget when it started, ends the thread soon after)."""
        box: dict = {}

        def target() -> None:
            try:
                box["result"] = work()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc

        thread = threading.Thread(target=target, name="plan-metadata", daemon=True)
        thread.start()
        thread.join(max(0.0, self.remaining()))
        if thread.is_alive():
            raise self.error()
        if "error" in box:
            raise box["error"]
        return box["result"]


# ---------------------------------------------------------------- a local folder


def read_local(model_dir: Path) -> ModelFiles:
    model_dir = Path(model_dir)
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ConfigError(
            f"{model_dir} has no config.json",
            hint="pass a model folder, or a repo id with --endpoint",
        )
    if config_path.stat().st_size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{config_path} is {config_path.stat().st_size:,} bytes, over the planner's limit "
            f"of {MAX_CONFIG_BYTES:,}",
            hint="a transformers config.json is a few KB; the folder is damaged or hostile",
        )
    config = load_config_json(config_path.read_bytes(), str(config_path))
    if (model_dir / INDEX_NAME).is_file():
        if (model_dir / INDEX_NAME).stat().st_size > MAX_JSON_BYTES:
            raise ConfigError(f"{INDEX_NAME} is over {MAX_JSON_BYTES:,} bytes")
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
            _count_header(files, shard, length)
            raw = fh.read(length)
        if len(raw) != length:
            raise AcquireError(f"{shard}: header cut short ({len(raw)} of {length} bytes)")
        files.tensors.update(parse_header(raw, name=shard, file_size=path.stat().st_size))
        files.bytes_read += 8 + length
        files.shard_bytes_read[shard] = 8 + length
    return files


# ---------------------------------------------------------------- a hub repo


def modelscope_endpoint(explicit: str | None) -> str:
    """The ModelScope endpoint: ``explicit``, else MODELSCOPE_ENDPOINT, else modelscope.cn."""
    return (explicit or settings().modelscope_endpoint or MODELSCOPE_DEFAULT).rstrip("/")


def modelscope_file_url(endpoint: str, repo_id: str, path: str, revision: str) -> str:
    """A file of a ModelScope model, as its SDK fetches it (``main`` is ModelScope's
    ``master``)."""
    from urllib.parse import quote_plus

    revision = "master" if revision == "main" else revision
    return (
        f"{endpoint.rstrip('/')}/api/v1/models/{repo_id}/repo?"
        f"Revision={quote_plus(revision)}&FilePath={quote_plus(path)}"
    )


def read_hub(
    repo_id: str,
    *,
    revision: str = "main",
    endpoint: str | None = None,
    timeout: float = TIMEOUT_S,
    token: HubToken | None = None,
    deadline_s: float | None = None,
    hub: str = "huggingface",
) -> ModelFiles:
    """config.json, the index and every shard header of a hub repo, by range requests.

    ``hub="modelscope"`` reads them through ModelScope's file API (``/api/v1/models/ID/repo
    ?Revision=R&FilePath=F``, the URL its SDK downloads from, which honours ranges) from
    ``endpoint`` or MODELSCOPE_ENDPOINT (default modelscope.cn); ``main`` is its ``master``.

    All reads share one wall-clock budget, ``deadline_s`` (default: the operator's
    LLM_RELEASE_PLAN_DEADLINE_S, else 60 s); past it the plan fails naming the host.

    ``endpoint`` passes the endpoint policy first; the token is what
    ``credentials.token_for`` gives this endpoint (``token``, a block's, only for its own)."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    if hub == "modelscope":
        endpoint = credentials.check_hub_endpoint(modelscope_endpoint(endpoint))
    else:
        endpoint = credentials.hub_endpoint(endpoint)
    session = get_session()
    headers = build_hf_headers(token=credentials.token_for(endpoint, token, hub=hub))
    files = ModelFiles(source=f"{endpoint}/{repo_id}@{revision}", config={}, tensors={}, shards=[])
    deadline = _Deadline(deadline_s if deadline_s is not None else plan_deadline_s(), endpoint)

    def get(
        path: str,
        byte_range: tuple[int, int] | None = None,
        *,
        missing_ok: bool = False,
        max_bytes: int = MAX_JSON_BYTES,
    ):
        deadline.check()
        if hub == "modelscope":
            url = modelscope_file_url(endpoint, repo_id, path, revision)
        else:
            url = hf_hub_url(repo_id, path, revision=files.commit or revision, endpoint=endpoint)
        extra = dict(headers)
        if byte_range:
            extra["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
        limit = (byte_range[1] - byte_range[0] + 1) if byte_range else max_bytes
        try:
            with session.stream(
                "GET",
                url,
                headers=extra,
                # each connect/read waits at most what is left of the budget
                timeout=max(0.001, min(timeout, deadline.remaining())),
                follow_redirects=True,
            ) as response:
                if response.status_code == 404 and missing_ok:
                    return None, None
                if response.status_code not in (200, 206):
                    raise AcquireError(
                        f"{url} answered HTTP {response.status_code}",
                        hint="check the repo id, the revision and, for a private repo, the token "
                        "(HF_TOKEN goes only to huggingface.co and LLM_RELEASE_HF_TOKEN_ENDPOINTS)",
                    )
                if byte_range and response.status_code == 200:
                    raise AcquireError(
                        f"{url} ignored the Range header (HTTP 200)",
                        hint="the hub must support range requests; reading the whole shard "
                        "would download the weights",
                    )
                parts: list[bytes] = []
                received = 0
                for chunk in response.iter_bytes():  # as it arrives: a trickle is seen
                    parts.append(chunk)
                    received += len(chunk)
                    if received > limit:
                        raise AcquireError(f"{url} sent more than the {limit:,} bytes expected")
                    deadline.check()
                body = b"".join(parts)
                headers_in = response.headers
        except AcquireError:
            raise
        except Exception as exc:  # httpx transport errors and timeouts
            if deadline.remaining() <= 0:
                raise deadline.error() from None
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

    def read_all() -> ModelFiles:
        config_raw, _ = get("config.json", max_bytes=MAX_CONFIG_BYTES)
        files.config = load_config_json(config_raw, "config.json")
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
            _count_header(files, shard, length)
            raw, size = get(shard, (8, 8 + length - 1))
            if len(raw) != length:
                raise AcquireError(f"{shard}: header cut short ({len(raw)} of {length} bytes)")
            files.shard_bytes_read[shard] = 8 + len(raw)
            files.tensors.update(parse_header(raw, name=shard, file_size=size))
        return files

    return deadline.run(read_all)
