"""Streaming, verifying, resumable file transfer for the acquire stage.

Each file streams into ``<name>.part`` while its SHA-256 (and, for non-LFS files, its git
blob id) is computed on the same bytes, so every byte is read once. An interrupted
transfer resumes from the bytes already in the ``.part`` file (they are hashed once on
resume). Only a file whose size and hash match what the hub published is renamed into
place; anything else is deleted and fetched again, a bounded number of times. A transfer
that makes no progress for ``stall_timeout_s`` is aborted and retried.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llm_release.fileio import HASH_CHUNK, git_blob_hasher

CHUNK = 1024 * 1024
ProgressFn = Callable[[str, int], None]


@dataclass(frozen=True)
class Expected:
    path: str
    size: int | None
    sha256: str | None
    blob_id: str | None


class TransferError(Exception):
    """One attempt failed; the message says why. Retried by the caller."""


class _Hashes:
    def __init__(self, size: int | None, want_blob: bool) -> None:
        self.sha256 = hashlib.sha256()
        self.blob = git_blob_hasher(size) if want_blob and size is not None else None

    def update(self, data: bytes | memoryview) -> None:
        self.sha256.update(data)
        if self.blob is not None:
            self.blob.update(data)


class _HashPipe:
    """Hashes chunks on a thread of its own, so the next network read and file write go
    on while the previous chunk is hashed (hashlib releases the GIL on large buffers).
    Without it a single stream pays receive + write + hash in series."""

    def __init__(self, hashes: _Hashes) -> None:
        self.hashes = hashes
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=16)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (chunk := self.queue.get()) is not None:
            self.hashes.update(chunk)

    def update(self, chunk: bytes) -> None:
        self.queue.put(chunk)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()


def _hash_existing(path: Path, hashes: _Hashes) -> int:
    done = 0
    with path.open("rb", buffering=0) as fh:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            hashes.update(view[:n])
            done += n
    return done


def check(expected: Expected, size: int, sha256: str, blob_id: str | None) -> str | None:
    if expected.size is not None and size != expected.size:
        kind = "short" if size < expected.size else "long"
        return f"{kind} file: {size} bytes, published {expected.size}"
    if expected.sha256 and sha256 != expected.sha256:
        return f"sha256 {sha256[:12]}… != published {expected.sha256[:12]}…"
    if not expected.sha256 and expected.blob_id and blob_id != expected.blob_id:
        return f"git blob {blob_id and blob_id[:12]}… != published {expected.blob_id[:12]}…"
    return None


def fetch_once(
    client,
    url: str,
    headers: dict[str, str],
    target: Path,
    expected: Expected,
    *,
    stall_timeout_s: float,
    progress: ProgressFn | None = None,
) -> str:
    """One attempt: resume or start ``target``.part, verify, rename. Returns the SHA-256."""
    import httpx

    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    hashes = _Hashes(expected.size, want_blob=expected.sha256 is None)
    offset = _hash_existing(part, hashes) if part.exists() else 0
    if expected.size is not None and offset > expected.size:
        part.unlink()
        raise TransferError(f"partial file longer than published ({offset} > {expected.size})")
    if not part.exists():
        part.touch()  # an empty file gets no request; its empty bytes are still verified
    request_headers = dict(headers)
    if offset and (expected.size is None or offset < expected.size):
        request_headers["Range"] = f"bytes={offset}-"
    done = offset
    if expected.size is None or offset < expected.size:
        timeout = httpx.Timeout(
            connect=stall_timeout_s,
            read=stall_timeout_s,
            write=stall_timeout_s,
            pool=stall_timeout_s,
        )
        limit = None if expected.size is None else expected.size + 1
        overrun = False
        try:
            with client.stream(
                "GET", url, headers=request_headers, timeout=timeout, follow_redirects=True
            ) as response:
                if response.status_code >= 400:
                    raise TransferError(f"HTTP {response.status_code} for {expected.path}")
                if offset and response.status_code != 206:
                    # The server ignored the range: start over rather than append twice.
                    hashes = _Hashes(expected.size, want_blob=expected.sha256 is None)
                    offset = done = 0
                with part.open("ab" if offset else "wb") as out:
                    pipe = _HashPipe(hashes)
                    try:
                        for chunk in response.iter_bytes(CHUNK):
                            if limit is not None and done + len(chunk) > limit:
                                # One byte past the published size proves the stream too
                                # long; nothing more is written (a hostile hub could fill
                                # the disk).
                                chunk = chunk[: limit - done]
                                overrun = True
                            out.write(chunk)
                            pipe.update(chunk)
                            done += len(chunk)
                            if progress:
                                progress(expected.path, len(chunk))
                            if overrun:
                                break
                    finally:
                        pipe.close()
        except httpx.TimeoutException as exc:
            raise TransferError(
                f"stalled: no bytes for {stall_timeout_s:.0f}s "
                f"({type(exc).__name__}) after {done} bytes"
            ) from exc
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise TransferError(
                f"connection broke after {done} bytes: {type(exc).__name__}"
            ) from exc
    if expected.size is not None and done > expected.size:
        part.unlink(missing_ok=True)
        raise TransferError(f"long stream: more than the published {expected.size} bytes")
    if expected.size is not None and done < expected.size:
        raise TransferError(f"short transfer: {done} of {expected.size} bytes (will resume)")
    sha256 = hashes.sha256.hexdigest()
    problem = check(expected, done, sha256, hashes.blob.hexdigest() if hashes.blob else None)
    if problem:
        part.unlink(missing_ok=True)
        raise TransferError(problem)
    os.replace(part, target)
    return sha256


@dataclass
class Outcome:
    sha256: str | None = None
    error: str | None = None
    attempts: int = 0
    bytes: int = 0


def fetch(
    client,
    url: str,
    headers: dict[str, str],
    target: Path,
    expected: Expected,
    *,
    max_attempts: int,
    stall_timeout_s: float,
    backoff_s: float,
    progress: ProgressFn | None = None,
) -> Outcome:
    outcome = Outcome()
    for attempt in range(1, max_attempts + 1):
        outcome.attempts = attempt
        try:
            outcome.sha256 = fetch_once(
                client,
                url,
                headers,
                target,
                expected,
                stall_timeout_s=stall_timeout_s,
                progress=progress,
            )
            outcome.error = None
            outcome.bytes = target.stat().st_size
            return outcome
        except TransferError as exc:
            outcome.error = str(exc)
            if attempt < max_attempts:
                time.sleep(min(backoff_s * 2 ** (attempt - 1), 10))
    return outcome


def copy_verified(
    source: Path,
    target: Path,
    expected: Expected,
    *,
    open_source: Callable[[], BinaryIO] | None = None,
) -> str:
    """Copy a local file into place, hashing the bytes as they are copied. ``open_source``
    opens ``source`` when plain ``open`` is not safe enough (local_source.open_file)."""
    part = target.with_name(target.name + ".part")
    target.parent.mkdir(parents=True, exist_ok=True)
    hashes = _Hashes(expected.size, want_blob=False)
    done = 0
    opened = open_source() if open_source else source.open("rb", buffering=0)
    with opened as src, part.open("wb") as out:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := src.readinto(buf):
            out.write(view[:n])
            hashes.update(view[:n])
            done += n
    sha256 = hashes.sha256.hexdigest()
    problem = check(expected, done, sha256, None)
    if problem:
        part.unlink(missing_ok=True)
        raise TransferError(f"{source} changed while it was copied: {problem}")
    os.replace(part, target)
    return sha256
