"""Small file helpers shared by the stages: atomic writes, locked JSON records, hashing."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

Record = TypeVar("Record", bound=BaseModel)

HASH_CHUNK = 8 * 1024 * 1024


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` so readers see either the old file or the whole new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, payload: object) -> None:
    atomic_write_text(path, json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def locked_json(path: Path, load: Callable[[], Record]) -> Iterator[Record]:
    """The record ``load()`` reads from the JSON file ``path``, changed under an exclusive
    lock (``flock`` on ``path`` with the suffix ``.lock``, held to the end of the block):
    written back atomically on a clean exit, left as it was when the block raises. Two
    processes (or threads) changing the same record take turns; no change is lost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = load()
        yield record
        atomic_write_text(path, json.dumps(record.model_dump(), indent=2) + "\n")


def _hash_file(path: Path, digest):
    with Path(path).open("rb", buffering=0) as fh:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest


def sha256_file(path: Path) -> str:
    return _hash_file(path, hashlib.sha256()).hexdigest()


def folder_sha256(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Each regular file under ``folder`` (relative POSIX path, links not followed) with its
    SHA-256, in path order; names in ``skip`` (at any depth) left out."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.is_symlink() and p.name not in skip
    }


def git_blob_hasher(size: int):
    """A SHA-1 primed with git's header for a blob of ``size`` bytes: fed those bytes, its
    hex digest is their git blob id."""
    return hashlib.sha1(b"blob %d\0" % size)


def git_blob_sha1(source: bytes | Path) -> str:
    """The git blob id of ``source`` (bytes, or a file's contents): what ``git hash-object``
    prints, and what the hub publishes as a non-LFS file's ``blobId``."""
    if isinstance(source, bytes | bytearray | memoryview):
        digest = git_blob_hasher(len(source))
        digest.update(source)
        return digest.hexdigest()
    return _hash_file(source, git_blob_hasher(Path(source).stat().st_size)).hexdigest()
