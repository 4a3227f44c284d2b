"""A local HTTP endpoint that speaks the Hugging Face Hub API for repos kept on disk.

It is what ``HF_ENDPOINT`` points at on machines with no route to a public hub (this one,
CI, an air-gapped cluster); the real ``huggingface_hub`` client downloads from it.

On-disk layout of ``root``::

    <owner>/<name>/refs.json                  {"main": "<commit>", ...}
    <owner>/<name>/commits/<commit>.json      file list: path, size, sha256, git blob id, lfs
    <owner>/<name>/commits/<commit>/<files>   the snapshot's bytes

Commits are content addresses (sha1 over the file list), so publishing the same files
twice gives the same commit.

It also takes uploads the way the real ``huggingface_hub`` client sends them
(``HfApi.create_repo``, ``upload_folder``/``create_commit`` over the LFS protocol; the Xet
protocol is not spoken, the client must run with Xet off — see ``llm_release.hub.publish``):

    POST /api/repos/create                          a repo with no commit yet
    POST /api/validate-yaml                         a README's metadata, parsed
    POST /api/models/<repo>/preupload/<rev>         upload mode per file: lfs or regular
    POST /<repo>.git/info/lfs/objects/batch         LFS batch API, basic transfer: a
                                                    one-use upload URL on this server
    PUT  /lfs-upload/<ticket>                       the bytes; SHA-256 and size checked
    POST /api/models/<repo>/commit/<rev>            NDJSON: header, file, lfsFile, deletedFile

A commit applies its operations to the branch's head: the new snapshot's content address
is its commit (``commits/<commit>.meta.json`` keeps the parent it was first made on), and
the branch moves to it. Uploaded objects wait in ``<repo>/lfs/<oid>`` until a commit takes
them. Everything in a request is hostile: paths stay inside the repo (no '..', no absolute
path, no backslash), bodies and objects are bounded, and a hub started with a token takes
writes only from a request that carries it (``Authorization: Bearer <token>``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

import yaml

from llm_release.config import REPO_ID
from llm_release.errors import ConfigError
from llm_release.fileio import atomic_write_text, git_blob_sha1, sha256_file
from llm_release.settings import settings

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth", ".h5", ".onnx", ".msgpack")
LFS_MIN_SIZE = 10 * 1024 * 1024
# Bounds on what a client may send: a JSON request (preupload, batch, create), a commit's
# NDJSON (regular files travel inside it, base64), one LFS object, a commit's file count.
MAX_JSON_BYTES = 4 * 1024 * 1024
MAX_COMMIT_BYTES = 64 * 1024 * 1024
MAX_OBJECT_BYTES = 1 << 40
MAX_FILES = 10_000
MAX_PATH_CHARS = 1024
UPLOAD_TICKET_S = 3600.0
SHA256_HEX = re.compile(r"[0-9a-f]{64}")

log = logging.getLogger(__name__)


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


def repo_path_error(path: object) -> str | None:
    """Why ``path`` (a file path a client sent) is not a plain path inside a repo; None if
    it is one."""
    if not isinstance(path, str) or not path:
        return "a file path must be a non-empty string"
    if len(path) > MAX_PATH_CHARS:
        return f"a file path has at most {MAX_PATH_CHARS} characters"
    if "\\" in path or "\x00" in path or any(ord(c) < 32 for c in path):
        return f"file path {path[:80]!r} has a backslash or a control character"
    if path.startswith("/") or re.match(r"[A-Za-z]:", path):
        return f"file path {path[:80]!r} is absolute"
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"file path {path[:80]!r} has an empty, '.' or '..' part"
    if parts[0] == ".git":
        return f"file path {path[:80]!r} is inside .git"
    return None


def _commit_tree(repo_dir: Path, staging: Path, branch: str, meta: dict) -> str:
    """Make ``staging`` (a folder under ``repo_dir/commits``) a commit and move ``branch``
    to it; the commit is the content address of its files, as ``publish_repo`` makes it."""
    files = describe_files(staging)
    listing = json.dumps([[f["rfilename"], f["blobId"]] for f in files]).encode()
    commit = hashlib.sha1(listing).hexdigest()
    snapshot = repo_dir / "commits" / commit
    if snapshot.is_dir():
        shutil.rmtree(staging)
    else:
        os.replace(staging, snapshot)
    atomic_write_text(repo_dir / "commits" / f"{commit}.json", json.dumps(files, indent=1))
    meta_path = repo_dir / "commits" / f"{commit}.meta.json"
    if not meta_path.exists():
        atomic_write_text(meta_path, json.dumps(meta, indent=1))
    refs_path = repo_dir / "refs.json"
    refs = json.loads(refs_path.read_text()) if refs_path.exists() else {}
    refs[branch] = commit
    atomic_write_text(refs_path, json.dumps(refs, indent=1))
    return commit


class _Refused(Exception):
    """A write request refused: the status, the hub's error code and the message."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _too_large(limit: int) -> _Refused:
    return _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "TooLarge", f"body over {limit} bytes")


@dataclass
class _Ticket:
    repo_id: str
    oid: str
    size: int
    expires: float


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
    token: str | None = None  # set: writes need "Authorization: Bearer <token>"
    tickets: dict[str, _Ticket]  # one-use LFS upload URLs, shared by the server's handlers
    write_lock: threading.Lock  # commits and repo creation, one at a time

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
        if self.close_connection:
            # Said, not only done: a client's pool (huggingface_hub shares one) must not
            # send its next request down a connection this hub is closing.
            self.send_header("Connection", "close")
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
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
        if tree:
            self._tree(tree.group(1), tree.group(2), tree.group(3) or "", query)
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

    # -- the write side: create, preupload, LFS batch and PUT, commit -----------------
    def do_POST(self) -> None:  # noqa: N802
        self._write(self._post_routes)

    def do_PUT(self) -> None:  # noqa: N802
        self._write(self._put_routes)

    def _write(self, route) -> None:
        try:
            route(unquote(urlparse(self.path).path))
        except _Refused as exc:
            # The body may be unread: this connection is not reused.
            self.close_connection = True
            self._send_error(exc.status, exc.code, exc.message)

    def _authorize(self) -> None:
        if self.token is None:
            return
        sent = self.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.token}".encode()):
            raise _Refused(
                HTTPStatus.UNAUTHORIZED, "Unauthorized", "a write to this hub needs its token"
            )

    def _body(self, limit: int):
        """The request body in pieces, at most ``limit`` bytes: Content-Length or chunked."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            total = 0
            while True:
                line = self.rfile.readline(1024)
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "bad chunk") from None
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                total += size
                if total > limit:
                    raise _too_large(limit)
                yield from self._exactly(size)
                self.rfile.readline(16)
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise _Refused(
                HTTPStatus.LENGTH_REQUIRED, "LengthRequired", "a body needs Content-Length"
            ) from None
        if length < 0 or length > limit:
            raise _too_large(limit)
        yield from self._exactly(length)

    def _exactly(self, size: int):
        """``size`` bytes of the body in pieces of at most 1 MiB; refused when it ends sooner."""
        remaining = size
        while remaining:
            piece = self.rfile.read(min(remaining, 1 << 20))
            if not piece:
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "body cut short")
            remaining -= len(piece)
            yield piece

    def _json_body(self) -> dict:
        try:
            data = json.loads(b"".join(self._body(MAX_JSON_BYTES)))
        except (ValueError, UnicodeDecodeError):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "body is not JSON") from None
        if not isinstance(data, dict):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "body is not a JSON object")
        return data

    def _base_url(self) -> str:
        host = self.headers.get("Host") or "{}:{}".format(*self.server.server_address[:2])
        if not re.fullmatch(r"[A-Za-z0-9.\-]+(:\d+)?|\[[0-9A-Fa-f:.]+\](:\d+)?", host):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "bad Host header")
        return f"http://{host}"

    def _writable(self, repo_id: str) -> _Repo:
        repo = self._repo(repo_id)
        if repo is None:
            raise _Refused(HTTPStatus.NOT_FOUND, "RepoNotFound", f"Repository {repo_id} not found")
        return repo

    def _post_routes(self, path: str) -> None:
        routes = (
            (r"/api/repos/create", self._create_repo),
            (r"/api/validate-yaml", self._validate_yaml),
            (r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", self._preupload),
            (r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", self._lfs_batch),
            (r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", self._commit),
        )
        for pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if match:
                self._authorize()
                handler(*match.groups())
                return
        raise _Refused(HTTPStatus.NOT_FOUND, "EntryNotFound", f"no route for POST {path}")

    def _put_routes(self, path: str) -> None:
        match = re.fullmatch(r"/lfs-upload/([A-Za-z0-9_-]{20,100})", path)
        if not match:
            raise _Refused(HTTPStatus.NOT_FOUND, "EntryNotFound", f"no route for PUT {path}")
        self._lfs_put(match.group(1))

    def _create_repo(self) -> None:
        payload = self._json_body()
        name, owner = payload.get("name"), payload.get("organization")
        repo_id = f"{owner}/{name}" if owner else str(name)
        if payload.get("type", "model") not in ("model", None):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "this hub keeps model repos only")
        if not isinstance(name, str) or not re.fullmatch(REPO_ID, repo_id):
            raise _Refused(
                HTTPStatus.BAD_REQUEST, "BadRequest", f"repo id {repo_id[:100]!r} is not owner/name"
            )
        url = f"{self._base_url()}/{repo_id}"
        with self.write_lock:
            directory = self.root / repo_id
            if (directory / "refs.json").exists():
                body = json.dumps({"error": "You already created this model repo", "url": url})
                self.send_response(HTTPStatus.CONFLICT)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())
                return
            # An initial empty commit on main, as a new repo on the public hub has one.
            staging = directory / "commits" / f".create-{secrets.token_hex(8)}.tmp"
            staging.mkdir(parents=True)
            _commit_tree(directory, staging, "main", {"parent": None, "summary": "initial"})
        self._send_json({"url": url, "name": repo_id, "id": repo_id})

    def _validate_yaml(self) -> None:
        content = self._json_body().get("content")
        if not isinstance(content, str):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "content must be a string")
        match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.S)
        try:
            data = yaml.safe_load(match.group(1)) if match else {}
        except yaml.YAMLError as exc:
            raise _Refused(
                HTTPStatus.BAD_REQUEST, "BadRequest", f"invalid YAML: {' '.join(str(exc).split())}"
            ) from None
        if data is not None and not isinstance(data, dict):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "metadata must be a mapping")
        self._send_json({"errors": [], "warnings": []})

    def _preupload(self, repo_id: str, revision: str) -> None:
        repo = self._writable(repo_id)
        files = self._json_body().get("files")
        if not isinstance(files, list) or len(files) > MAX_FILES:
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "files must be a bounded list")
        commit = repo.resolve(revision)
        existing = {e["rfilename"]: e for e in repo.files(commit)} if commit else {}
        answer = []
        for file in files:
            path = file.get("path") if isinstance(file, dict) else None
            size = file.get("size") if isinstance(file, dict) else None
            why = repo_path_error(path)
            if why is None and (not isinstance(size, int) or size < 0):
                why = f"size of {path!r} is not a non-negative integer"
            if why:
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", why)
            old = existing.get(path)
            oid = (old["lfs"]["sha256"] if "lfs" in old else old["blobId"]) if old else None
            mode = "lfs" if _is_lfs(path, size) else "regular"
            answer.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._send_json({"files": answer, "commitOid": commit})

    def _lfs_batch(self, repo_id: str) -> None:
        self._writable(repo_id)
        payload = self._json_body()
        objects = payload.get("objects")
        if payload.get("operation") != "upload" or not isinstance(objects, list):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "an upload batch of objects")
        if "basic" not in (payload.get("transfers") or ["basic"]) or len(objects) > MAX_FILES:
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "basic transfer, bounded batch")
        base, now, answer = self._base_url(), time.monotonic(), []
        for obj in objects:
            oid = obj.get("oid") if isinstance(obj, dict) else None
            size = obj.get("size") if isinstance(obj, dict) else None
            if not isinstance(oid, str) or not SHA256_HEX.fullmatch(oid):
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "oid must be a SHA-256")
            if not isinstance(size, int) or not 0 <= size <= MAX_OBJECT_BYTES:
                answer.append(
                    {
                        "oid": oid,
                        "size": size if isinstance(size, int) else -1,
                        "error": {"code": 422, "message": f"size over {MAX_OBJECT_BYTES} bytes"},
                    }
                )
                continue
            stored = self._object(repo_id, oid)
            if stored.is_file() and stored.stat().st_size == size:
                answer.append({"oid": oid, "size": size})  # no actions: already here
                continue
            ticket = secrets.token_urlsafe(32)
            with self.write_lock:
                for key in [k for k, t in self.tickets.items() if t.expires < now]:
                    del self.tickets[key]
                self.tickets[ticket] = _Ticket(repo_id, oid, size, now + UPLOAD_TICKET_S)
            href = f"{base}/lfs-upload/{ticket}"
            answer.append(
                {
                    "oid": oid,
                    "size": size,
                    "authenticated": True,
                    "actions": {"upload": {"href": href, "expires_in": int(UPLOAD_TICKET_S)}},
                }
            )
        self._send_json({"transfer": "basic", "objects": answer, "hash_algo": "sha256"})

    def _object(self, repo_id: str, oid: str) -> Path:
        return self.root / repo_id / "lfs" / oid[:2] / oid

    def _lfs_put(self, key: str) -> None:
        with self.write_lock:
            ticket = self.tickets.pop(key, None)
        if ticket is None or ticket.expires < time.monotonic():
            raise _Refused(HTTPStatus.FORBIDDEN, "Forbidden", "unknown or used upload URL")
        target = self._object(ticket.repo_id, ticket.oid)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{ticket.oid}.{secrets.token_hex(4)}.part")
        digest, size = hashlib.sha256(), 0
        try:
            with partial.open("wb") as out:
                for piece in self._body(ticket.size):
                    digest.update(piece)
                    size += len(piece)
                    out.write(piece)
            if size != ticket.size or digest.hexdigest() != ticket.oid:
                raise _Refused(
                    HTTPStatus.UNPROCESSABLE_ENTITY,
                    "IntegrityError",
                    f"uploaded bytes (size {size}, sha256 {digest.hexdigest()}) are not object "
                    f"{ticket.oid} of size {ticket.size}",
                )
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
        self._send_json({"oid": ticket.oid, "size": size})

    def _commit(self, repo_id: str, revision: str) -> None:
        repo = self._writable(repo_id)
        if parse_qs(urlparse(self.path).query).get("create_pr"):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "this hub has no pull requests")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", revision) or re.fullmatch(
            r"[0-9a-f]{40}", revision
        ):
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "commit to a branch name")
        lines = b"".join(self._body(MAX_COMMIT_BYTES)).splitlines()
        try:
            items = [json.loads(line) for line in lines if line.strip()]
        except ValueError:
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "body is not NDJSON") from None
        if not items or not isinstance(items[0], dict) or items[0].get("key") != "header":
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "the first line is the header")
        header = items[0].get("value") or {}
        if len(items) > MAX_FILES + 1:
            raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", f"over {MAX_FILES} operations")
        with self.write_lock:
            parent = repo.resolve(revision)
            expected = header.get("parentCommit") if isinstance(header, dict) else None
            if expected is not None and expected != parent:
                raise _Refused(
                    HTTPStatus.PRECONDITION_FAILED,
                    "ParentMismatch",
                    f"{revision} is at {parent}, not at the parent commit {expected}",
                )
            staging = repo.directory / "commits" / f".commit-{secrets.token_hex(8)}.tmp"
            try:
                commit = self._apply(repo, parent, items[1:], staging, revision, header)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        self._send_json(
            {
                "success": True,
                "commitOid": commit,
                "commitUrl": f"{self._base_url()}/{repo_id}/commit/{commit}",
                "pullRequestUrl": None,
            }
        )

    def _apply(
        self, repo: _Repo, parent: str | None, ops: list, staging: Path, branch: str, header: dict
    ) -> str:
        if parent is not None:
            # Hard links: a snapshot's files are never written in place (a change replaces
            # the file), so commits share their unchanged bytes.
            shutil.copytree(repo.directory / "commits" / parent, staging, copy_function=os.link)
        staging.mkdir(parents=True, exist_ok=True)
        for op in ops:
            key = op.get("key") if isinstance(op, dict) else None
            value = op.get("value") if isinstance(op, dict) else None
            path = value.get("path") if isinstance(value, dict) else None
            why = repo_path_error(path)
            if why:
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", why)
            target = staging / path
            if key == "deletedFile":
                if not target.is_file():
                    raise _Refused(
                        HTTPStatus.NOT_FOUND, "EntryNotFound", "A file with this name doesn't exist"
                    )
                target.unlink()
                continue
            if key == "deletedFolder":
                shutil.rmtree(target, ignore_errors=True)
                continue
            if target.is_dir() or any(p.is_file() for p in target.parents if p != staging):
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", f"{path} clashes with a file")
            target.parent.mkdir(parents=True, exist_ok=True)
            if key == "file":
                if value.get("encoding") != "base64" or not isinstance(value.get("content"), str):
                    raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "file content is base64")
                try:
                    data = base64.b64decode(value["content"], validate=True)
                except binascii.Error:
                    raise _Refused(
                        HTTPStatus.BAD_REQUEST, "BadRequest", f"{path}: bad base64"
                    ) from None
                target.unlink(missing_ok=True)
                target.write_bytes(data)
            elif key == "lfsFile":
                oid, size = value.get("oid"), value.get("size")
                if value.get("algo", "sha256") != "sha256" or not isinstance(oid, str):
                    raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", "an lfsFile is sha256")
                stored = self._object(repo.directory.relative_to(self.root).as_posix(), oid)
                if not SHA256_HEX.fullmatch(oid) or not stored.is_file():
                    raise _Refused(
                        HTTPStatus.UNPROCESSABLE_ENTITY,
                        "MissingObject",
                        f"{path}: object {oid[:64]} was never uploaded",
                    )
                if size is not None and size != stored.stat().st_size:
                    raise _Refused(
                        HTTPStatus.UNPROCESSABLE_ENTITY, "BadRequest", f"{path}: size differs"
                    )
                target.unlink(missing_ok=True)
                os.link(stored, target)
            else:
                raise _Refused(HTTPStatus.BAD_REQUEST, "BadRequest", f"unknown operation {key!r}")
        meta = {
            "parent": parent,
            "summary": str(header.get("summary", ""))[:1000],
            "description": str(header.get("description", ""))[:10000],
        }
        return _commit_tree(repo.directory, staging, branch, meta)

    def _tree(self, repo_id: str, revision: str, folder: str, query: dict) -> None:
        """``list_repo_tree``: the files under ``folder`` (all of them when recursive)."""
        repo = self._repo(repo_id)
        commit = repo.resolve(revision) if repo else None
        if commit is None:
            code = "RepoNotFound" if repo is None else "RevisionNotFound"
            self._send_error(HTTPStatus.NOT_FOUND, code, f"{repo_id}@{revision} not found")
            return
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        prefix = f"{folder.strip('/')}/" if folder.strip("/") else ""
        entries, folders = [], set()
        for e in repo.files(commit):
            if not e["rfilename"].startswith(prefix):
                continue
            rest = e["rfilename"][len(prefix) :]
            if not recursive and "/" in rest:
                folders.add(prefix + rest.split("/", 1)[0])
                continue
            entry = {"type": "file", "path": e["rfilename"], "size": e["size"], "oid": e["blobId"]}
            if "lfs" in e:
                entry["lfs"] = {
                    "oid": e["lfs"]["sha256"],
                    "size": e["size"],
                    "pointerSize": e["lfs"]["pointerSize"],
                }
            entries.append(entry)
        entries += [{"type": "directory", "path": f, "oid": "0" * 40} for f in sorted(folders)]
        self._send_json(entries)

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


class QuietHubServer(ThreadingHTTPServer):
    """A client that hangs up (a reset, a broken pipe: a download cut, a keep-alive
    connection closed by the client library) is routine for a hub: logged at debug level,
    not printed as a traceback on stderr, where it would mix with the CLI's one-line errors
    in the same process."""

    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            log.debug("hub: client %s hung up", client_address)
            return
        super().handle_error(request, client_address)


def make_server(
    root: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    handler: type[HubRequestHandler] = HubRequestHandler,
    counter: ByteCounter | None = None,
    token: str | None = None,
) -> ThreadingHTTPServer:
    bound = {
        "root": Path(root),
        "counter": counter,
        "token": token,
        "tickets": {},
        "write_lock": threading.Lock(),
    }
    handler = type("BoundHubHandler", (handler,), bound)
    return QuietHubServer((host, port), handler)


class HubServer:
    """Context manager running the hub endpoint in a background thread (tests, demo)."""

    def __init__(
        self, root: Path, host: str = "127.0.0.1", port: int = 0, *, token: str | None = None
    ) -> None:
        self.counter = ByteCounter()
        self._server = make_server(root, host, port, counter=self.counter, token=token)
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
