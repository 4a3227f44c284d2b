"""Local model folders (``source.hub: local``), confined to roots the operator configures.

``source.local_path`` is a run parameter: whoever fills in the run form must not reach the
worker's files through it. The operator lists the folders local models may come from in
``LLM_RELEASE_LOCAL_ROOTS`` (the worker's environment, absolute paths separated by
``os.pathsep``); without it ``hub: local`` is refused. The folder a run names must resolve
inside one of those roots, and so must every file in it, links followed: a link to
``/etc`` inside a model folder is refused, file by file, before any file is read. Files are
then opened without following a final link and checked again through ``/proc/self/fd``, so
a link swapped in after the check reads nothing outside the root either.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llm_release import paths
from llm_release.errors import AcquireError, ConfigError
from llm_release.fileio import HASH_CHUNK
from llm_release.settings import LOCAL_ROOTS_HINT, settings

ROOTS_ENV = "LLM_RELEASE_LOCAL_ROOTS"
# A model folder holds tens of files, a few hundred at most; a walk past this is a folder
# that is no model (a whole model store, a home directory) and stops before any hashing.
MAX_FILES = 10_000
ALLOW_HINT = LOCAL_ROOTS_HINT


@dataclass(frozen=True)
class LocalFile:
    relative: str  # posix path under the model folder, as the manifest names it
    real: Path  # links resolved; inside ``root``
    size: int


@dataclass(frozen=True)
class LocalFolder:
    root: Path  # the configured root that holds the folder (resolved)
    folder: Path  # the model folder (resolved)


def roots() -> list[Path]:
    """The configured roots, resolved; empty when the operator configured none."""
    return list(settings().local_roots)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _shown(text: str) -> str:
    return ascii(text[:200])


def folder(local_path: str) -> LocalFolder:
    """The real model folder ``local_path`` names, and the root that allows it. Refuses a
    path outside every configured root (and every path when none is configured) in one
    line, whether or not it exists, before anything under it is read."""
    allowed = roots()
    if not allowed:
        raise ConfigError(
            f"source.local_path {_shown(local_path)}: local model folders are not allowed on "
            f"this worker ({ROOTS_ENV} is not set)",
            hint=ALLOW_HINT,
        )
    path = Path(local_path)
    if not path.is_absolute():
        raise ConfigError(
            f"source.local_path {_shown(local_path)} is not an absolute path",
            hint="name the model folder by its absolute path under one of "
            + ", ".join(str(r) for r in allowed),
        )
    real = Path(os.path.realpath(path))
    for root in allowed:
        if _inside(real, root):
            if not real.is_dir():
                raise AcquireError(
                    f"local model folder {_shown(local_path)} does not exist",
                    hint="check local_path (a mounted model store must be mounted)",
                )
            return LocalFolder(root, real)
    raise ConfigError(
        f"source.local_path {_shown(local_path)} is outside the folders local models may come "
        f"from ({', '.join(str(r) for r in allowed)})",
        hint=f"put the model in a folder under one of them, or ask the operator to add its "
        f"folder to {ROOTS_ENV}",
    )


def _hidden(relative: str) -> bool:
    return any(part.startswith(".") for part in relative.split("/"))


def checked_file(where: LocalFolder, relative: str) -> LocalFile:
    """``relative`` under the folder, resolved; refused when it (or a link on its way)
    leads out of the root, or is not a regular file (a FIFO would block a read forever)."""
    path = where.folder / relative
    real = Path(os.path.realpath(path))
    if not _inside(real, where.root):
        raise ConfigError(
            f"local model file {_shown(relative)} is a link that leads outside {where.root}",
            hint="replace the link with the file itself, or remove it from the model folder",
        )
    try:
        info = os.stat(real)
    except OSError as exc:
        raise AcquireError(
            f"local model file {_shown(relative)} cannot be read: {exc.strerror}"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(
            f"local model file {_shown(relative)} is not a regular file",
            hint="a model folder holds plain files; remove it from the folder",
        )
    return LocalFile(relative, real, info.st_size)


def files(where: LocalFolder) -> list[LocalFile]:
    """Every non-hidden file of the folder (``.part`` files left out), each checked with
    :func:`checked_file`; no file is opened. Linked folders are followed only while they
    stay inside the root, each real folder once (a link loop ends)."""
    found: list[LocalFile] = []
    seen = {where.folder}
    for dirpath, dirnames, filenames in os.walk(where.folder, followlinks=True):
        base = Path(dirpath)
        keep = []
        for name in sorted(dirnames):
            if name.startswith("."):
                continue
            real = Path(os.path.realpath(base / name))
            relative = (base / name).relative_to(where.folder).as_posix()
            if not _inside(real, where.root):
                raise ConfigError(
                    f"local model folder {_shown(relative)} is a link that leads outside "
                    f"{where.root}",
                    hint="replace the link with the folder itself, or remove it",
                )
            if real not in seen:
                seen.add(real)
                keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            relative = (base / name).relative_to(where.folder).as_posix()
            if _hidden(relative) or name.endswith(".part"):
                continue
            found.append(checked_file(where, relative))
            if len(found) > MAX_FILES:
                raise ConfigError(
                    f"local model folder {where.folder} holds more than {MAX_FILES} files: "
                    "not a model folder",
                    hint="name the folder of one model (the one with config.json)",
                )
    return sorted(found, key=lambda f: f.relative)


def checked_folder(local_path: str) -> Path:
    """The resolved model folder, after every file in it was checked (for readers that
    open files by name, such as the planner's header reader)."""
    where = folder(local_path)
    files(where)
    return where.folder


def open_file(where: LocalFolder, local: LocalFile) -> BinaryIO:
    """``local`` opened for reading: no link followed at the last step, and the opened
    file proven to be inside the root (a link swapped in after the check is caught)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(local.real, flags)
    except OSError as exc:
        raise AcquireError(
            f"local model file {_shown(local.relative)} cannot be opened: {exc.strerror}"
        ) from None
    proc = Path(f"/proc/self/fd/{fd}")
    if proc.exists():
        opened = Path(os.readlink(proc))
        if not _inside(opened, where.root):
            os.close(fd)
            raise ConfigError(
                f"local model file {_shown(local.relative)} changed into a link outside "
                f"{where.root} while it was read",
                hint="leave the model folder alone during a release",
            )
    return os.fdopen(fd, "rb", buffering=0)


def sha256(where: LocalFolder, local: LocalFile) -> str:
    digest = hashlib.sha256()
    with open_file(where, local) as fh:
        buf = bytearray(HASH_CHUNK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def served_folder(model_dir: str, what: str = "model_dir") -> Path:
    """A model folder a run names to be served (the ``eval-only`` flow's ``model_dir``),
    resolved: one of the project's own model folders (``paths.own_model_folder``: downloads
    and candidates), else a folder inside ``LLM_RELEASE_LOCAL_ROOTS`` whose every file stays
    inside its root, as a local source's. Anything else is refused in one line, whether or
    not it exists, before anything under it is read."""
    path = Path(model_dir)
    if not path.is_absolute():
        raise ConfigError(
            f"{what} {_shown(model_dir)} is not an absolute path",
            hint="give the folder's full path on the worker's host",
        )
    own = paths.own_model_folder(path)
    if own is not None:
        return own
    real = Path(os.path.realpath(path))
    root = next((r for r in roots() if _inside(real, r)), None)
    if root is None:
        allowed = [str(r) for r in (*paths.model_roots(), *roots())]
        raise ConfigError(
            f"{what} {_shown(model_dir)} is outside the folders a run may serve "
            f"({', '.join(allowed)})",
            hint=f"copy the model into one of them, or ask the operator to add its folder to "
            f"{ROOTS_ENV}",
        )
    if not real.is_dir():
        raise ConfigError(f"{what} {_shown(model_dir)} does not exist", hint="check the path")
    files(LocalFolder(root, real))  # no file of it leads out of the root
    return real
