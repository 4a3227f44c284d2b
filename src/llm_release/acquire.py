"""Acquire: download a model pinned to a commit and prove every file against the hub.

The hub publishes a SHA-256 for each LFS file (the weight shards) and a git blob id for
the others. Nothing downstream reads a file before its hash matched; a mismatching file
is deleted and fetched again, and the stage fails naming the files if it never matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from . import paths
from .config import SourceConfig
from .errors import AcquireError, ConfigError, IntegrityError
from .fileio import atomic_write_json, sha256_file

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


def _git_blob_sha1(path: Path) -> str:
    digest = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def _api(source: SourceConfig):
    from huggingface_hub import HfApi

    return HfApi(endpoint=source.endpoint) if source.endpoint else HfApi()


def resolve(source: SourceConfig) -> tuple[str, list[RemoteFile]]:
    """Resolve the revision to a commit and list the files with their published hashes."""
    from huggingface_hub.errors import (
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = _api(source)
    try:
        info = api.model_info(source.repo_id, revision=source.revision, files_metadata=True)
    except RevisionNotFoundError as exc:
        raise AcquireError(
            f"revision {source.revision!r} does not exist in {source.repo_id}",
            hint="check the branch, tag or commit id on the hub",
        ) from exc
    except RepositoryNotFoundError as exc:
        raise AcquireError(
            f"repository {source.repo_id} was not found at {api.endpoint}",
            hint="check the repo id, the endpoint (HF_ENDPOINT) and, for a gated or private "
            "repo, the token (HF_TOKEN)",
        ) from exc
    except (HfHubHTTPError, OSError) as exc:
        raise AcquireError(
            f"cannot reach the hub at {api.endpoint}: {type(exc).__name__}",
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


def verify_file(path: Path, remote: RemoteFile) -> str | None:
    """None when ``path`` matches what the hub published, else why not."""
    if not path.exists():
        return "missing"
    size = path.stat().st_size
    if remote.size is not None and size != remote.size:
        return f"size {size} != published {remote.size}"
    if remote.sha256:
        actual = sha256_file(path)
        if actual != remote.sha256:
            return f"sha256 {actual[:12]}… != published {remote.sha256[:12]}…"
    elif remote.blob_id:
        actual = _git_blob_sha1(path)
        if actual != remote.blob_id:
            return f"git blob {actual[:12]}… != published {remote.blob_id[:12]}…"
    return None


def _manifest_matches(manifest_path: Path, model_dir: Path) -> bool:
    try:
        manifest = json.loads(manifest_path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    for entry in manifest.get("files", []):
        path = model_dir / entry["path"]
        try:
            stat = path.stat()
        except FileNotFoundError:
            return False
        if stat.st_size != entry["size"] or int(stat.st_mtime_ns) != entry["mtime_ns"]:
            return False
    return bool(manifest.get("files"))


def acquire(source: SourceConfig, *, progress=None) -> Acquired:
    """Download ``source`` pinned to a commit; every file verified before it is reported."""
    from huggingface_hub import hf_hub_download

    commit, remote_files = resolve(source)
    if not remote_files:
        raise AcquireError(
            f"{source.repo_id}@{commit} has no files matching {source.allow_patterns}"
        )
    model_dir = local_dir_for(source.repo_id, commit)
    check_target_path(model_dir)
    manifest_path = model_dir.with_name(commit + MANIFEST_SUFFIX)
    if _manifest_matches(manifest_path, model_dir):
        return Acquired(model_dir, manifest_path, commit, source.repo_id, 0, reused=True)

    model_dir.mkdir(parents=True, exist_ok=True)
    downloaded = 0
    failures: dict[str, str] = {}
    # Small files first: a wrong endpoint or token fails on config.json in seconds.
    for remote in sorted(remote_files, key=lambda f: (f.sha256 is not None, f.size or 0)):
        target = model_dir / remote.path
        problem = verify_file(target, remote) if target.exists() else "missing"
        attempt = 0
        while problem is not None and attempt < MAX_ATTEMPTS:
            attempt += 1
            target.unlink(missing_ok=True)
            try:
                hf_hub_download(
                    source.repo_id,
                    remote.path,
                    revision=commit,
                    local_dir=model_dir,
                    endpoint=source.endpoint,
                    force_download=True,
                )
            except Exception as exc:  # the hub client raises many types; all mean "retry"
                problem = f"download failed: {type(exc).__name__}: {exc}".splitlines()[0]
                time.sleep(min(2**attempt, 10) * 0.1)
                continue
            problem = verify_file(target, remote)
            if problem is None:
                downloaded += target.stat().st_size
            else:
                target.unlink(missing_ok=True)
        if problem is not None:
            failures[remote.path] = problem
        elif progress is not None:
            progress(remote.path, remote.size or 0)
    if failures:
        named = "; ".join(f"{p}: {why}" for p, why in sorted(failures.items()))
        raise IntegrityError(
            f"{len(failures)} file(s) of {source.repo_id}@{commit[:12]} never matched the hub "
            f"after {MAX_ATTEMPTS} attempts: {named}",
            hint="the hub or a mirror serves corrupt bytes; check the mirror, then re-run",
        )
    shutil.rmtree(model_dir / ".cache", ignore_errors=True)
    manifest = {
        "repo_id": source.repo_id,
        "revision": source.revision,
        "commit": commit,
        "hub": source.hub,
        "endpoint": source.endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co",
        "fetched_at": datetime.now(UTC).isoformat(),
        "files": [
            {
                "path": r.path,
                "size": (model_dir / r.path).stat().st_size,
                "sha256": r.sha256 or sha256_file(model_dir / r.path),
                "lfs": r.sha256 is not None,
                "mtime_ns": (model_dir / r.path).stat().st_mtime_ns,
            }
            for r in remote_files
        ],
    }
    atomic_write_json(manifest_path, manifest)
    return Acquired(model_dir, manifest_path, commit, source.repo_id, downloaded, reused=False)


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
        index = json.loads(index_path.read_text())
        for shard in sorted(set(index.get("weight_map", {}).values())):
            if not (model_dir / shard).exists():
                missing.append(shard)
    elif not (model_dir / "model.safetensors").exists():
        missing.append("model.safetensors (or an index)")
    if missing:
        raise AcquireError(
            f"{model_dir} breaks the repo contract; missing: {', '.join(missing)}",
            hint="publish the missing files on the hub, or widen allow_patterns",
        )
