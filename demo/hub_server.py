"""A local HTTP endpoint that speaks the Hugging Face Hub API for repos kept on disk.

It is what ``HF_ENDPOINT`` points at on machines with no route to a public hub (this one,
CI, an air-gapped cluster); the real ``huggingface_hub`` client downloads from it.

On-disk layout of ``root``::

    <owner>/<name>/refs.json                  {"main": "<commit>", ...}
    <owner>/<name>/commits/<commit>.json      file list: path, size, sha256, git blob id, lfs
    <owner>/<name>/commits/<commit>/<files>   the snapshot's bytes

Commits are content addresses (sha1 over the file list), so publishing the same files
twice gives the same commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

from llm_release.config import REPO_ID
from llm_release.errors import ConfigError
from llm_release.fileio import atomic_write_text, git_blob_sha1, sha256_file
from llm_release.settings import settings

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".onnx", ".msgpack")
LFS_MIN_SIZE = 10 * 1024 * 1024


def lfs_pointer(sha256: str, size: int) -> bytes:
    return (
        f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n"
    ).encode()


def _is_lfs(path: str, size: int) -> bool:
    return path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE


def describe_files(snapshot: Path) -> list[dict]:
    """The hub's view of every file: size, git blob id and, for LFS files, the SHA-256."""
    entries = []
    for file in sorted(p for p in snapshot.rglob("*") if p.is_file()):
        rel = file.relative_to(snapshot).as_posix()
        size = file.stat().st_size
        entry: dict = {"rfilename": rel, "size": size}
        sha = sha256_file(file)
        # Not part of the HF listing, which carries SHA-256 for LFS files only; the
        # ModelScope file API publishes it for every file.
        entry["sha256"] = sha
        if _is_lfs(rel, size):
            pointer = lfs_pointer(sha, size)
            entry["blobId"] = git_blob_sha1(pointer)
            entry["lfs"] = {"sha256": sha, "size": size, "pointerSize": len(pointer)}
        else:
            entry["blobId"] = git_blob_sha1(file)
        entries.append(entry)
    return entries


def publish_repo(root: Path, repo_id: str, source_dir: Path, *, branch: str = "main") -> str:
    """Publish the files of ``source_dir`` as a commit of ``repo_id`` and move ``branch`` to it."""
    if not re.fullmatch(REPO_ID, repo_id):
        raise ConfigError(f"repo id {repo_id!r} is not 'owner/name'")
    source_dir = Path(source_dir)
    files = describe_files(source_dir)
    if not files:
        raise ConfigError(f"nothing to publish: {source_dir} has no files")
    listing = json.dumps([[f["rfilename"], f["blobId"]] for f in files]).encode()
    commit = hashlib.sha1(listing).hexdigest()
    repo_dir = Path(root) / repo_id
    snapshot = repo_dir / "commits" / commit
    if not snapshot.is_dir():
        staging = repo_dir / "commits" / f".{commit}.tmp"
        shutil.rmtree(staging, ignore_errors=True)
        for entry in files:
            dst = staging / entry["rfilename"]
            dst.parent.mkdir(parents=True, exist_ok=True)
            # A copy, not a hard link: the hub's bytes must not change when the source does.
            shutil.copy2(source_dir / entry["rfilename"], dst)
        os.replace(staging, snapshot)
    atomic_write_text(repo_dir / "commits" / f"{commit}.json", json.dumps(files, indent=1))
    refs_path = repo_dir / "refs.json"
    refs = json.loads(refs_path.read_text()) if refs_path.exists() else {}
    refs[branch] = commit
    atomic_write_text(refs_path, json.dumps(refs, indent=1))
    return commit


@dataclass
class _Repo:
    directory: Path

    def resolve(self, revision: str) -> str | None:
        refs_path = self.directory / "refs.json"
        refs = json.loads(refs_path.read_text()) if refs_path.exists() else {}
        if revision in refs:
            return refs[revision]
        if (
            re.fullmatch(r"[0-9a-f]{40}", revision)
            and (self.directory / "commits" / f"{revision}.json").exists()
        ):
            return revision
        return None

    def files(self, commit: str) -> list[dict]:
        return json.loads((self.directory / "commits" / f"{commit}.json").read_text())


class HubRequestHandler(BaseHTTPRequestHandler):
    server_version = "llm-release-hub/1"
    protocol_version = "HTTP/1.1"
    root: Path  # set on the subclass made by make_server

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - signature is inherited
        if settings().hub_log:
            super().log_message(format, *args)

    def _send_error(self, status: HTTPStatus, code: str, message: str) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, payload: object) -> None:
        body = json.dumps(payload).encode()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _repo(self, repo_id: str) -> _Repo | None:
        # The repo id comes from the request's URL: never a path outside the root.
        if not re.fullmatch(REPO_ID, repo_id):
            return None
        directory = self.root / repo_id
        return _Repo(directory) if (directory / "refs.json").exists() else None

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        self._dispatch()

    def do_HEAD(self) -> None:  # noqa: N802
        self._dispatch()

    def _dispatch(self) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if path.startswith("/api/v1/"):
            self._modelscope(path, query)
            return
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+?)(?:/revision/(.+))?", path)
        if info:
            self._model_info(info.group(1), info.group(2) or "main", query)
            return
        resolve = re.fullmatch(r"/(?:models/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if resolve:
            self._resolve(resolve.group(1), resolve.group(2), resolve.group(3))
            return
        self._send_error(HTTPStatus.NOT_FOUND, "EntryNotFound", f"no route for {path}")

    def _model_info(self, repo_id: str, revision: str, query: dict) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            self._send_error(
                HTTPStatus.NOT_FOUND, "RepoNotFound", f"Repository {repo_id} not found"
            )
            return
        commit = repo.resolve(revision)
        if commit is None:
            self._send_error(
                HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}"
            )
            return
        with_blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        siblings = []
        for entry in repo.files(commit):
            if with_blobs:
                siblings.append(entry)
            else:
                siblings.append({"rfilename": entry["rfilename"]})
        self._send_json(
            {
                "_id": repo_id,
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": False,
                "disabled": False,
                "gated": False,
                "tags": [],
                "siblings": siblings,
            }
        )

    # -- ModelScope's file API (what the modelscope SDK calls), over the same storage ----
    def _ms_json(
        self, data: object, status: HTTPStatus = HTTPStatus.OK, message: str = "success"
    ) -> None:
        body = json.dumps(
            {
                "Code": int(status),
                "Data": data,
                "Message": message,
                "RequestId": "local",
                "Success": status == HTTPStatus.OK,
            }
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _modelscope(self, path: str, query: dict) -> None:
        match = re.fullmatch(r"/api/v1/models/([^/]+/[^/]+)(/revisions|/repo/files|/repo)?", path)
        if not match:
            self._ms_json(None, HTTPStatus.NOT_FOUND, f"no route for {path}")
            return
        repo = self._repo(match.group(1))
        if repo is None:
            self._ms_json(None, HTTPStatus.NOT_FOUND, f"model {match.group(1)} not found")
            return
        refs = json.loads((repo.directory / "refs.json").read_text())
        if match.group(2) == "/revisions":
            branches = [
                {"Revision": name, "CommitId": commit, "CreatedAt": 0}
                for name, commit in refs.items()
            ]
            self._ms_json({"RevisionMap": {"Branches": branches, "Tags": []}})
            return
        revision = query.get("Revision", ["master"])[0]
        commit = repo.resolve(revision) or (repo.resolve("main") if revision == "master" else None)
        if commit is None:
            self._ms_json(None, HTTPStatus.NOT_FOUND, f"revision {revision} not found")
            return
        if match.group(2) == "/repo/files":
            files = [
                {
                    "Name": e["rfilename"].rsplit("/", 1)[-1],
                    "Path": e["rfilename"],
                    "Type": "blob",
                    "Size": e["size"],
                    "Sha256": e["sha256"],
                    "IsLFS": "lfs" in e,
                    "CommitId": commit,
                }
                for e in repo.files(commit)
            ]
            self._ms_json({"Files": files})
            return
        filename = query.get("FilePath", [""])[0]
        self._resolve(match.group(1), commit, filename, modelscope=True)

    def _resolve(
        self, repo_id: str, revision: str, filename: str, *, modelscope: bool = False
    ) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            self._send_error(
                HTTPStatus.NOT_FOUND, "RepoNotFound", f"Repository {repo_id} not found"
            )
            return
        commit = repo.resolve(unquote(revision))
        if commit is None:
            self._send_error(
                HTTPStatus.NOT_FOUND, "RevisionNotFound", f"Invalid rev id: {revision}"
            )
            return
        entry = next((e for e in repo.files(commit) if e["rfilename"] == filename), None)
        if entry is None:
            self._send_error(
                HTTPStatus.NOT_FOUND, "EntryNotFound", f"{filename} does not exist at {commit}"
            )
            return
        file_path = repo.directory / "commits" / commit / filename
        size = entry["size"]
        etag = entry["lfs"]["sha256"] if "lfs" in entry else entry["blobId"]
        start, end = 0, size - 1
        status = HTTPStatus.OK
        range_header = self.headers.get("Range")
        if range_header:
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header.strip())
            if match:
                start = int(match.group(1))
                end = int(match.group(2)) if match.group(2) else size - 1
                if start >= size:
                    self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                end = min(end, size - 1)
                status = HTTPStatus.PARTIAL_CONTENT
        length = end - start + 1
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(length))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{etag}"')
        self.send_header("X-Repo-Commit", commit)
        if modelscope:
            self.send_header("X-Linked-ETag", f'"{entry["sha256"]}"')
        elif "lfs" in entry:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(size))
        if status == HTTPStatus.PARTIAL_CONTENT:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.command == "HEAD":
            return
        self._stream(file_path, start, length)

    def _stream(self, file_path: Path, offset: int, length: int) -> None:
        with file_path.open("rb") as fh:
            try:
                sent = self.connection.sendfile(fh, offset=offset, count=length)
            except (BrokenPipeError, ConnectionResetError):
                sent = 0
        counter = getattr(self, "counter", None)
        if counter is not None:
            counter.add(file_path.name, offset, sent)


class ByteCounter:
    """Body bytes the hub sent, per file name, and the furthest offset reached in each:
    what a test asserts to prove that a client read headers only."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes: dict[str, int] = {}
        self.max_end: dict[str, int] = {}

    def add(self, name: str, offset: int, sent: int) -> None:
        with self._lock:
            self.bytes[name] = self.bytes.get(name, 0) + sent
            self.max_end[name] = max(self.max_end.get(name, 0), offset + sent)

    def reset(self) -> None:
        with self._lock:
            self.bytes.clear()
            self.max_end.clear()


def make_server(
    root: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    handler: type[HubRequestHandler] = HubRequestHandler,
    counter: ByteCounter | None = None,
) -> ThreadingHTTPServer:
    handler = type("BoundHubHandler", (handler,), {"root": Path(root), "counter": counter})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    return server


class HubServer:
    """Context manager running the hub endpoint in a background thread (tests, demo)."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.counter = ByteCounter()
        self._server = make_server(root, host, port, counter=self.counter)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
