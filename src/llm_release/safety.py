"""Names and paths that come from outside, checked before anything touches the disk.

A hub decides the file names in its listing, the shard names in a safetensors index and
the commit id that names the model folder; users name eval sets and calibration sets.
None of them may say where on this machine a file goes: each is checked against a strict
grammar and, when joined to its folder, must resolve inside that folder. The checks run
before any file is created, replaced or removed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from llm_release.errors import ConfigError

# One path part: letters, digits, '.', '_', '-'; never '.' or '..', never hidden (a
# leading '.'), except the one dot-file every git-backed hub lists.
PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
ALLOWED_DOT_FILES = frozenset({".gitattributes"})
MAX_PART = 255
MAX_PATH = 1024
# Transfers stream into '<name>.part' next to the target; a listed '.part' file would
# collide with another file's partial transfer.
RESERVED_SUFFIX = ".part"
# Every commit id the project produces or accepts: a git commit (Hugging Face) or the
# sha1 content address of a listing (the project's hub, ModelScope, local folders).
COMMIT = re.compile(r"[0-9a-f]{40}")
# Eval sets and calibration sets: one folder or file name, lower case.
SET_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
# A name vLLM serves a model under (a release's public name, its release id, a candidate's
# name): the run form's rule for public_name, and the record's for every name read back.
# It never starts with '-' (vLLM's argv would read it as a flag) and holds no '/' or space.
SERVED_NAME_PATTERN = r"^[A-Za-z0-9][\w.-]*$"
SERVED_NAME = re.compile(SERVED_NAME_PATTERN)
MAX_SERVED_NAME = 128
SERVED_NAME_RULE = (
    f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most "
    f"{MAX_SERVED_NAME} characters"
)


class UnsafeNameError(ConfigError):
    """A name from outside would leave its folder or breaks the name grammar."""


def relative_path(name: object, what: str) -> str:
    """``name`` as a safe relative POSIX path, or :class:`UnsafeNameError`."""
    if not isinstance(name, str) or not name:
        raise UnsafeNameError(f"{what} {name!r} is not a file name")
    shown = ascii(name)[:120]
    if len(name) > MAX_PATH:
        raise UnsafeNameError(f"{what} {shown} is longer than {MAX_PATH} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in name) or "\\" in name:
        raise UnsafeNameError(f"{what} {shown} holds a control character or a backslash")
    if name.startswith("/"):
        raise UnsafeNameError(f"{what} {shown} is an absolute path")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise UnsafeNameError(f"{what} {shown} has an empty, '.' or '..' part")
        if len(part) > MAX_PART:
            raise UnsafeNameError(f"{what} {shown} has a part longer than {MAX_PART}")
        if not (PART.fullmatch(part) or part in ALLOWED_DOT_FILES):
            raise UnsafeNameError(
                f"{what} {shown}: part {ascii(part)} may only use letters, digits, '.', '_', '-' "
                "and may not start with '.'"
            )
    if name.endswith(RESERVED_SUFFIX):
        raise UnsafeNameError(f"{what} {shown} ends in {RESERVED_SUFFIX!r}, kept for transfers")
    return name


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, resolved (symlinks included) and proven to stay under ``root``."""
    base = Path(root).resolve()
    target = (base / relative).resolve()
    if target == base or base not in target.parents:
        raise UnsafeNameError(f"{relative!r} resolves to {target}, outside {base}")
    return target


def within(root: Path, path: str | Path) -> bool:
    """``path`` (absolute, e.g. read from a state file) resolves under ``root``."""
    base = Path(root).resolve()
    return base in Path(path).resolve().parents


def listing(names: Iterable[str], what: str) -> list[str]:
    """Every name safe, none repeated, none both a file and another file's folder."""
    checked = [relative_path(n, what) for n in names]
    seen: set[str] = set()
    for name in checked:
        if name in seen:
            raise UnsafeNameError(f"{what} {name!r} is listed twice")
        seen.add(name)
    folders = {"/".join(n.split("/")[:i]) for n in checked for i in range(1, n.count("/") + 1)}
    clash = sorted(seen & folders)
    if clash:
        raise UnsafeNameError(f"{what} {clash[0]!r} is both a file and a folder")
    return checked


def commit_id(commit: object, source: str) -> str:
    """A commit id as the hub sent it, checked before it names a folder."""
    if not isinstance(commit, str) or not COMMIT.fullmatch(commit):
        raise UnsafeNameError(
            f"{source} answered with commit id {ascii(commit)[:80]}, not 40 hex digits",
            hint="the hub is misconfigured or hostile; do not use it",
        )
    return commit


def served_name(name: object, what: str) -> str:
    """A name a model is served under, or :class:`UnsafeNameError` (one line)."""
    if not isinstance(name, str) or len(name) > MAX_SERVED_NAME or not SERVED_NAME.fullmatch(name):
        raise UnsafeNameError(
            f"{what} {ascii(name)[:80]} is not a served name ({SERVED_NAME_RULE})",
            hint="name the model with letters and digits; a name may not read as a flag",
        )
    return name


def set_name(name: object, what: str) -> str:
    """An eval-set or calibration-set name: one lower-case folder/file name."""
    if not isinstance(name, str) or not SET_NAME.fullmatch(name) or len(name) > 100:
        raise UnsafeNameError(
            f"{what} name {ascii(name)[:80]} is not allowed",
            hint="use lower-case letters, digits, '_' and '-', starting with a letter or digit",
        )
    return name
