"""Acquire: download a model pinned to a commit and prove every file against the hub.

The hub publishes a SHA-256 for each LFS file (the weight shards) and a git blob id for
the others. Nothing downstream reads a file before its hash matched; a mismatching file
is deleted and fetched again, and the stage fails naming the files if it never matches.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from llm_release import paths, safety
from llm_release.config import SourceConfig
from llm_release.errors import AcquireError, ConfigError, IntegrityError, ReleaseError
from llm_release.fileio import atomic_write_json, git_blob_sha1, sha256_file
from llm_release.hub import credentials, disk, local_source
from llm_release.hub.credentials import HubToken
from llm_release.hub.download import (
    Expected,
    Outcome,
    ProgressFn,
    TransferError,
    check,
    copy_verified,
    fetch,
)
from llm_release.safety import UnsafeNameError
from llm_release.settings import settings

T = TypeVar("T")
MANIFEST_SUFFIX = ".manifest.json"
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int | None
    sha256: str | None  # LFS files
    blob_id: str | None  # git blob sha1 (non-LFS files)


@dataclass
class Acquired:
    model_dir: Path
    manifest_path: Path
    commit: str
    repo_id: str
    downloaded_bytes: int
    reused: bool
    # where its files came from this time: the hub's URL (past the endpoint policy), or
    # file://folder for a local source (None: not said, e.g. a folder stood in)
    endpoint: str | None = None


def check_target_path(path: Path) -> None:
    text = str(path)
    if " " in text or not text.isascii():
        raise ConfigError(
            f"model path {text!r} contains spaces or non-ASCII characters",
            hint="several inference stacks mishandle such paths; set LLM_RELEASE_HOME to a "
            "plain ASCII path without spaces",
        )


def local_dir_for(repo_id: str, commit: str) -> Path:
    return paths.models_dir() / repo_id.replace("/", "--") / commit


def _api(source: SourceConfig, token: HubToken | None):
    from huggingface_hub import HfApi

    # Endpoint and token go to this client object only: no process-wide setting pairs
    # one hub's token with another hub. token_for gives False, never None (which would let
    # the client fall back to HF_TOKEN whatever the endpoint).
    endpoint = credentials.hub_endpoint(source.endpoint)
    return HfApi(endpoint=endpoint, token=credentials.token_for(endpoint, token))


def resolve_local(source: SourceConfig) -> tuple[str, list[RemoteFile]]:
    """A local or mounted folder under a root the operator allows (local_source): its
    content hashes are its commit. Every file is checked to stay inside the root before
    the first one is read."""
    where = local_source.folder(source.local_path or "")
    found = local_source.files(where)
    if source.allow_patterns:
        found = [f for f in found if _matches(f.relative, source.allow_patterns)]
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        digests = list(pool.map(lambda f: local_source.sha256(where, f), found))
    files = [
        RemoteFile(path=f.relative, size=f.size, sha256=d, blob_id=None)
        for f, d in zip(found, digests, strict=True)
    ]
    commit = hashlib.sha1(json.dumps([[f.path, f.sha256] for f in files]).encode()).hexdigest()
    return commit, files


def with_deadline(call: Callable[[], T], timeout_s: float) -> T:
    """``call()``'s result, or :class:`TimeoutError` after ``timeout_s`` seconds.

    For client libraries whose own timeouts do not bound a call end to end. The call goes
    on in a daemon thread until the library gives up; nothing waits for it, exit included.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="hub-metadata")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:.0f}s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def modelscope_endpoint(source: SourceConfig) -> str:
    return (
        source.endpoint or settings().modelscope_endpoint or "https://www.modelscope.cn"
    ).rstrip("/")


def resolve_modelscope(
    source: SourceConfig, *, timeout_s: float = 60.0, token: HubToken | None = None
) -> tuple[str, list[RemoteFile]]:
    """List files with their SHA-256 through the modelscope SDK.

    ModelScope's file API names no commit for a revision, so the local folder is named by
    the content address of the listing (every file's SHA-256): the same bytes, the same
    folder, and a branch that moves mid-download fails verification instead of mixing.
    """
    endpoint = credentials.check_hub_endpoint(modelscope_endpoint(source))
    from modelscope.hub.api import HubApi

    revision = "master" if source.revision == "main" else source.revision
    # "" is the SDK's "no token" (None would fall back to MODELSCOPE_API_TOKEN or a login).
    api = HubApi(
        endpoint=endpoint,
        timeout=max(1, round(timeout_s)),
        token=credentials.token_for(endpoint, token, hub="modelscope") or "",
    )
    try:
        # The SDK's listing keeps its own per-page timeouts and retries (minutes in all),
        # whatever the client's timeout says; the deadline bounds the whole call.
        infos = with_deadline(
            lambda: api.list_repo_files(source.repo_id, "model", revision=revision), timeout_s
        )
    except Exception as exc:  # the SDK raises requests' and its own errors alike
        raise AcquireError(
            f"ModelScope could not list {source.repo_id}@{revision} at "
            f"{modelscope_endpoint(source)}: {type(exc).__name__}: {str(exc)[:200]}",
            hint="check the model id, the revision, MODELSCOPE_ENDPOINT and, for a private "
            "model, MODELSCOPE_API_TOKEN",
        ) from exc
    files = [
        RemoteFile(path=i.path, size=i.size, sha256=i.sha256, blob_id=None)
        for i in infos
        if getattr(i, "type", "blob") != "tree"
        and (not source.allow_patterns or _matches(i.path, source.allow_patterns))
    ]
    if not files:
        raise AcquireError(f"ModelScope lists no files for {source.repo_id}@{revision}")
    missing = [f.path for f in files if not f.sha256]
    if missing:
        raise AcquireError(
            f"ModelScope published no SHA-256 for {missing[:5]}",
            hint="these files cannot be verified; ask the hub owner",
        )
    listing = json.dumps([[f.path, f.sha256] for f in sorted(files, key=lambda f: f.path)])
    return hashlib.sha1(listing.encode()).hexdigest(), files


def modelscope_file_url(source: SourceConfig, path: str) -> str:
    from urllib.parse import quote_plus

    revision = "master" if source.revision == "main" else source.revision
    return (
        f"{modelscope_endpoint(source)}/api/v1/models/{source.repo_id}/repo?"
        f"Revision={quote_plus(revision)}&FilePath={quote_plus(path)}"
    )


def resolve(
    source: SourceConfig, *, timeout_s: float = 60.0, token: HubToken | None = None
) -> tuple[str, list[RemoteFile]]:
    """Resolve the revision to a commit and list the files with their published hashes.

    The commit id names a folder and every file name becomes a path under it, so both are
    checked here, before any caller creates or removes anything; a file the hub gives no
    hash or no size for cannot be verified or bounded, so it is refused here too. Metadata
    calls give up after ``timeout_s`` without an answer.
    """
    if source.hub == "local":
        commit, files = resolve_local(source)
    elif source.hub == "modelscope":
        commit, files = resolve_modelscope(source, timeout_s=timeout_s, token=token)
    else:
        commit, files = _resolve_hf(source, timeout_s=timeout_s, token=token)
    where = f"{source.hub} {source.repo_id}@{source.revision}"
    try:
        safety.commit_id(commit, where)
        safety.listing([f.path for f in files], "file name")
    except UnsafeNameError as exc:
        raise AcquireError(
            f"{where}: {exc.message}",
            hint="the source published an unsafe name and nothing was written; leave the file "
            "out with allow_patterns, or report it to the source's owner",
        ) from None
    unverifiable = [f.path for f in files if not (f.sha256 or f.blob_id) or f.size is None]
    if unverifiable:
        raise AcquireError(
            f"{where}: no published SHA-256 / git blob id and size for "
            f"{', '.join(ascii(p) for p in unverifiable[:5])}; such bytes cannot be verified",
            hint="ask the hub owner to publish hashes, or leave the files out with allow_patterns",
        )
    return commit, files


def _resolve_hf(
    source: SourceConfig, *, timeout_s: float, token: HubToken | None
) -> tuple[str, list[RemoteFile]]:
    import httpx
    from huggingface_hub.errors import (
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = _api(source, token)
    try:
        # timeout= bounds each socket operation; the deadline bounds the whole call (a hub
        # that trickles a byte at a time never trips a per-read timeout).
        info = with_deadline(
            lambda: api.model_info(
                source.repo_id, revision=source.revision, files_metadata=True, timeout=timeout_s
            ),
            timeout_s,
        )
    except RevisionNotFoundError as exc:
        raise AcquireError(
            f"revision {source.revision!r} does not exist in {source.repo_id}",
            hint="check the branch, tag or commit id on the hub",
        ) from exc
    except RepositoryNotFoundError as exc:
        raise AcquireError(
            f"repository {source.repo_id} was not found at {api.endpoint}",
            hint="check the repo id, the endpoint (HF_ENDPOINT) and, for a gated or private "
            "repo, the token (HF_TOKEN goes only to huggingface.co and the endpoints in "
            "LLM_RELEASE_HF_TOKEN_ENDPOINTS; or a HubCredentials block saved for this one)",
        ) from exc
    except (httpx.TimeoutException, TimeoutError) as exc:
        raise AcquireError(
            f"the hub at {api.endpoint} did not answer the listing of {source.repo_id} within "
            f"{timeout_s:.0f}s ({type(exc).__name__})",
            hint="check that the hub is up and reachable; raise stall_timeout_s for a slow one",
        ) from exc
    except (HfHubHTTPError, OSError, httpx.HTTPError, ValueError) as exc:
        raise AcquireError(
            f"cannot list {source.repo_id} at {api.endpoint}: {type(exc).__name__}",
            hint="check HF_ENDPOINT / source.endpoint and that the hub is running",
        ) from exc
    files = []
    for sibling in info.siblings or []:
        if source.allow_patterns and not _matches(sibling.rfilename, source.allow_patterns):
            continue
        lfs = sibling.lfs
        files.append(
            RemoteFile(
                path=sibling.rfilename,
                size=sibling.size,
                sha256=lfs.sha256 if lfs else None,
                blob_id=None if lfs else sibling.blob_id,
            )
        )
    return info.sha, files


def _matches(path: str, patterns: list[str]) -> bool:
    from fnmatch import fnmatch

    return any(fnmatch(path, p) for p in patterns)


def selected(hashes: dict[str, str], allow_patterns: list[str] | None) -> dict[str, str]:
    """The files of ``hashes`` (path: SHA-256) a source with ``allow_patterns`` downloads:
    the same selection ``resolve`` makes of a listing. A folder of an earlier download of the
    same commit may hold more (its manifest too): they are no part of this source."""
    if not allow_patterns:
        return dict(hashes)
    return {p: sha for p, sha in hashes.items() if _matches(p, allow_patterns)}


def proven_hashes(manifest_path: Path) -> dict[str, str]:
    """Every file an acquire proved, with its SHA-256, as its manifest says (acquire hashed
    each one as it proved it: read here rather than hashing the weights a second time)."""
    try:
        entries = json.loads(manifest_path.read_text())["files"]
        return {str(e["path"]): str(e["sha256"]) for e in entries}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise AcquireError(
            f"{manifest_path} is not a readable acquire manifest ({type(exc).__name__})",
            hint="download the model again: its manifest was removed, edited or corrupted",
        ) from None


def _verify_existing(path: Path, remote: RemoteFile) -> tuple[str | None, str | None]:
    if not path.exists():
        return "missing", None
    size = path.stat().st_size
    sha256 = sha256_file(path) if remote.size is None or size == remote.size else ""
    blob = git_blob_sha1(path) if not remote.sha256 and sha256 else None
    return check(_expected(remote), size, sha256, blob), sha256 or None


def _expected(remote: RemoteFile) -> Expected:
    return Expected(remote.path, remote.size, remote.sha256, remote.blob_id)


def _verified_copies(
    manifest_path: Path, model_dir: Path, remote_files: list[RemoteFile], workers: int
) -> dict[str, str]:
    """The files of an earlier download that still hold the published bytes: path ->
    SHA-256. Each one is hashed again and checked against the hub's published hash, in
    parallel (hashlib releases the GIL): an unchanged size and mtime prove nothing about the
    bytes. A file of a different size is not read."""
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        return {}
    entries = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(entries, list):
        return {}
    recorded = {e.get("path") for e in entries if isinstance(e, dict)}
    candidates = []
    for remote in remote_files:
        if remote.path not in recorded:
            continue
        try:
            size = (model_dir / remote.path).stat().st_size
        except OSError:
            continue
        if size == remote.size:
            candidates.append(remote)

    def one(remote: RemoteFile) -> tuple[str, str | None]:
        problem, sha256 = _verify_existing(model_dir / remote.path, remote)
        return remote.path, sha256 if problem is None else None

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return {path: sha for path, sha in pool.map(one, candidates) if sha}


@dataclass(frozen=True)
class TransferSettings:
    workers: int = 4
    stall_timeout_s: float = 60.0
    max_attempts: int = MAX_ATTEMPTS
    backoff_s: float = 0.5


def acquire(
    source: SourceConfig,
    *,
    progress: ProgressFn | None = None,
    settings: TransferSettings | None = None,
    on_start: Callable[[int, int], None] | None = None,
    token: HubToken | None = None,
) -> Acquired:
    """Download ``source`` pinned to a commit; every file verified before it is reported.

    ``token`` (a block's, bound to the endpoint it was saved for) is sent to that endpoint
    only: a source with another endpoint is refused before any request. Without one,
    ``credentials.token_for`` decides: the environment's token goes only to the public hub
    and the endpoints the operator configured for it.
    Small files come first, then the first weight shard alone (a wrong endpoint, path or
    token fails in seconds), then the other shards with ``settings.workers`` in parallel.
    """
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session

    settings = settings or TransferSettings()
    commit, remote_files = resolve(source, timeout_s=settings.stall_timeout_s, token=token)
    if not remote_files:
        raise AcquireError(
            f"{source.repo_id}@{commit} has no files matching {source.allow_patterns}"
        )
    model_dir = local_dir_for(source.repo_id, commit)
    check_target_path(model_dir)
    # Every target is proven to lie inside the model folder before the folder is made.
    try:
        targets = {r.path: safety.inside(model_dir, r.path) for r in remote_files}
    except UnsafeNameError as exc:
        raise AcquireError(f"{source.repo_id}@{commit}: {exc.message}") from None
    manifest_path = model_dir.with_name(commit + MANIFEST_SUFFIX)
    verified = _verified_copies(
        manifest_path, model_dir, remote_files, max(settings.workers, os.cpu_count() or 1)
    )
    endpoint = (
        f"file://{source.local_path}"
        if source.hub == "local"
        else credentials.check_hub_endpoint(modelscope_endpoint(source))
        if source.hub == "modelscope"
        else credentials.hub_endpoint(source.endpoint)
    )
    if len(verified) == len(remote_files):
        return Acquired(
            model_dir, manifest_path, commit, source.repo_id, 0, reused=True, endpoint=endpoint
        )

    # The listed sizes still to fetch must fit the target's free space before a byte is written.
    disk.check_download(
        f"{source.repo_id}@{commit[:12]}", model_dir, [(r.path, r.size) for r in remote_files]
    )
    model_dir.mkdir(parents=True, exist_ok=True)
    if on_start is not None:
        on_start(sum(r.size or 0 for r in remote_files), len(remote_files))
    client = get_session()
    # A Hugging Face token is for a Hugging Face hub: ModelScope file URLs get none.
    headers = build_hf_headers(
        token=credentials.token_for(endpoint, token) if source.hub == "huggingface" else False
    )
    outcomes: dict[str, Outcome] = {}

    def one(remote: RemoteFile) -> Outcome:
        target = targets[remote.path]
        if remote.path in verified:
            return Outcome(sha256=verified[remote.path], attempts=0, bytes=0)
        problem, sha256 = _verify_existing(target, remote) if target.exists() else ("", None)
        if problem is None:
            return Outcome(sha256=sha256, attempts=0, bytes=0)
        target.unlink(missing_ok=True)
        if source.hub == "local":
            try:
                # Checked again at copy time: the folder may have changed since the listing.
                where = local_source.folder(source.local_path or "")
                local = local_source.checked_file(where, remote.path)
                sha = copy_verified(
                    local.real,
                    target,
                    _expected(remote),
                    open_source=lambda: local_source.open_file(where, local),
                )
            except (TransferError, OSError, ReleaseError) as exc:
                return Outcome(error=str(exc), attempts=1)
            return Outcome(sha256=sha, attempts=1, bytes=target.stat().st_size)
        if source.hub == "modelscope":
            url = modelscope_file_url(source, remote.path)
        else:
            url = hf_hub_url(source.repo_id, remote.path, revision=commit, endpoint=endpoint)
        return fetch(
            client,
            url,
            headers,
            target,
            _expected(remote),
            max_attempts=settings.max_attempts,
            stall_timeout_s=settings.stall_timeout_s,
            backoff_s=settings.backoff_s,
            progress=progress,
        )

    def fail(names: list[str], first: bool = False) -> None:
        named = "; ".join(f"{n}: {outcomes[n].error}" for n in sorted(names))
        hint = (
            "the first file already failed: check the endpoint (HF_ENDPOINT), the token "
            "(HF_TOKEN) and the repo id"
            if first
            else "the hub or a mirror serves corrupt or incomplete bytes; check it, then re-run "
            "(verified files are kept)"
        )
        raise IntegrityError(
            f"{len(names)} file(s) of {source.repo_id}@{commit[:12]} could not be fetched "
            f"and verified after {settings.max_attempts} attempts: {named}",
            hint=hint,
        )

    small = [r for r in remote_files if r.sha256 is None]
    shards = sorted((r for r in remote_files if r.sha256), key=lambda r: r.path)
    for index, remote in enumerate(small):
        outcomes[remote.path] = one(remote)
        if outcomes[remote.path].error:
            fail([remote.path], first=index == 0)
    if shards:
        outcomes[shards[0].path] = one(shards[0])
        if outcomes[shards[0].path].error:
            fail([shards[0].path], first=True)
        # Each shard runs in the caller's context: the progress callback reports through the
        # caller's orchestrator settings and run (a bare pool thread has neither: Prefect's
        # client there read the environment and, with no API URL in it, started a server of
        # its own, whose 404 for the progress artifact failed the download).
        caller = contextvars.copy_context()

        def in_caller_context(remote):
            return caller.copy().run(one, remote)

        with ThreadPoolExecutor(max_workers=settings.workers) as pool:
            for remote, outcome in zip(
                shards[1:], pool.map(in_caller_context, shards[1:]), strict=True
            ):
                outcomes[remote.path] = outcome
        failed = [p for p, o in outcomes.items() if o.error]
        if failed:
            fail(failed)
    downloaded = sum(o.bytes for o in outcomes.values())
    manifest = {
        "repo_id": source.repo_id,
        "revision": source.revision,
        "commit": commit,
        "hub": source.hub,
        "endpoint": endpoint,
        "fetched_at": datetime.now(UTC).isoformat(),
        "files": [
            {
                "path": r.path,
                "size": (model_dir / r.path).stat().st_size,
                "sha256": outcomes[r.path].sha256,
                "lfs": r.sha256 is not None,
                "mtime_ns": (model_dir / r.path).stat().st_mtime_ns,
            }
            for r in remote_files
        ],
    }
    atomic_write_json(manifest_path, manifest)
    return Acquired(
        model_dir,
        manifest_path,
        commit,
        source.repo_id,
        downloaded,
        reused=False,
        endpoint=endpoint,
    )


def verify_dir(model_dir: Path) -> list[str]:
    """Re-check a local copy against its manifest; the problems found, one per file."""
    model_dir = Path(model_dir)
    manifest_path = model_dir.with_name(model_dir.name + MANIFEST_SUFFIX)
    if not manifest_path.exists():
        raise AcquireError(
            f"{model_dir} has no manifest ({manifest_path})",
            hint="download it with 'llm-release download' first",
        )
    try:
        manifest = json.loads(manifest_path.read_text())
        entries = manifest["files"]
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
            raise TypeError("'files' is not a list of entries")
    except (ValueError, KeyError, TypeError) as exc:
        raise AcquireError(
            f"{manifest_path} is not a valid manifest ({type(exc).__name__}: {exc})",
            hint="download the model again with 'llm-release download'",
        ) from None

    for entry in entries:
        try:
            safety.inside(model_dir, safety.relative_path(entry.get("path"), "manifest path"))
        except UnsafeNameError as exc:
            raise AcquireError(
                f"{manifest_path}: {exc.message}",
                hint="the manifest was edited or corrupted; download the model again",
            ) from None

    def one(entry: dict) -> str | None:
        path = model_dir / entry["path"]
        if not path.exists():
            return f"{entry['path']}: missing"
        size = path.stat().st_size
        if size != entry["size"]:
            return f"{entry['path']}: {size} bytes, manifest says {entry['size']}"
        actual = sha256_file(path)
        if actual != entry["sha256"]:
            return f"{entry['path']}: sha256 {actual[:12]}… != manifest {entry['sha256'][:12]}…"
        return None

    workers = max(1, min(len(entries), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [p for p in pool.map(one, entries) if p]


def _safetensors_header_size(path: Path) -> int:
    with path.open("rb") as fh:
        return 8 + int.from_bytes(fh.read(8), "little")


def check_repo_contract(model_dir: Path) -> None:
    """Config, tokenizer and generation config present; the index names only present shards."""
    model_dir = Path(model_dir)
    missing = [
        n
        for n in ("config.json", "tokenizer_config.json", "generation_config.json")
        if not (model_dir / n).exists()
    ]
    if not any((model_dir / n).exists() for n in ("tokenizer.json", "tokenizer.model")):
        missing.append("tokenizer.json")
    index_path = model_dir / "model.safetensors.index.json"
    if index_path.exists():
        try:
            index = json.loads(index_path.read_text())
            shards = sorted(set(index.get("weight_map", {}).values()))
        except (ValueError, AttributeError, TypeError) as exc:
            raise AcquireError(
                f"{index_path} is not a valid safetensors index ({type(exc).__name__})",
                hint="re-publish the model with a valid model.safetensors.index.json",
            ) from None
        try:
            for shard in shards:
                safety.inside(model_dir, safety.relative_path(shard, "index shard name"))
        except UnsafeNameError as exc:
            raise AcquireError(
                f"{index_path}: {exc.message}",
                hint="the safetensors index names a file outside the model; re-publish it",
            ) from None
        for shard in shards:
            if not (model_dir / shard).exists():
                missing.append(shard)
        total = (index.get("metadata") or {}).get("total_size")
        present = [model_dir / s for s in shards if (model_dir / s).exists()]
        if total and not missing:
            # total_size counts tensor bytes; each shard adds its own header on top.
            on_disk = sum(p.stat().st_size for p in present)
            headers = sum(_safetensors_header_size(p) for p in present)
            if on_disk - headers != int(total):
                raise AcquireError(
                    f"{model_dir}: the index says {total} tensor bytes, the shards hold "
                    f"{on_disk - headers}",
                    hint="the index and the shards come from different revisions; re-publish",
                )
    elif not (model_dir / "model.safetensors").exists():
        missing.append("model.safetensors (or an index)")
    if missing:
        raise AcquireError(
            f"{model_dir} breaks the repo contract; missing: {', '.join(missing)}",
            hint="publish the missing files on the hub, or widen allow_patterns",
        )
