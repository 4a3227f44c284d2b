"""Secret files the project reads or makes: a key, a password, a TLS PEM. Each must be a
regular file of this user that no group and no other user can read, write or run
(``private_file``); one the project makes is made at random, 0600 whatever the umask, the
first time it is asked for (``made_secret``). Used by the door (the load balancer's keys),
the basic-auth passwords of Prometheus and Alertmanager, and the vLLM servers' key
(``server_key``)."""

from __future__ import annotations

import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from llm_release.errors import ConfigError


def private_file(path: Path, setting: str, what: str) -> os.stat_result:
    """``path``'s stat, if it is a regular file of this user that no group and no other
    user can read, write or run (mode 0600 or 0400); ConfigError in one line with the fix
    otherwise. A secret another user owns could be swapped for theirs at any time."""
    try:
        info = Path(path).stat()
    except OSError as exc:
        raise ConfigError(
            f"{setting}: cannot read {path} ({exc.strerror})", hint=f"point it at {what}"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{setting}: {path} is not a file", hint=f"point it at {what}")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{setting}: {path} is owned by uid {info.st_uid}, not by this user "
            f"(uid {os.geteuid()})",
            hint=f"chown {os.geteuid()} {path} && chmod 600 {path}, as the user the worker runs as",
        )
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{setting}: {path} is open to its group or other users (mode "
            f"{stat.S_IMODE(info.st_mode):04o}; it must be 0600 or 0400)",
            hint=f"chmod 600 {path}",
        )
    return info


def made_secret(
    path: Path, setting: str, valid: Callable[[str], bool], hint: str, kind: str = "secret"
) -> tuple[str, bool]:
    """The secret in ``path`` and whether it was made now: made at random (0600 whatever
    the umask) the first time; an existing file must be this user's and closed to others
    (``private_file``) and hold what ``valid`` accepts, else ConfigError with ``hint``.

    The file appears whole: the secret is written to a private temporary file beside it,
    then linked to ``path`` (``link`` fails if ``path`` exists). Two processes making it at
    once both read the one that won; neither reads a file still empty (CI, 2026-12-05: a
    test read the servers' key file between another's create and write)."""
    path = Path(path)
    if not path.exists():
        secret = secrets.token_urlsafe(32)
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # 0600
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secret + "\n")
            os.link(scratch, path)
            return secret, True
        except FileExistsError:
            pass  # another process made it first: its secret is read below
        finally:
            os.unlink(scratch)
    private_file(path, setting, "a file only its owner reads")
    secret = path.read_text("utf-8").strip()
    if not valid(secret):
        raise ConfigError(f"{setting} {path} holds no {kind}", hint=hint) from None
    return secret, False


# What secrets.token_urlsafe(32) makes, with room for a longer one written by hand.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,256}")


def token_valid(value: str) -> bool:
    return bool(_TOKEN.fullmatch(value))


def home_token(path: Path, setting: str, hint: str, kind: str = "token") -> str:
    """The token in ``path`` (its folder made if missing), made the first time
    (``made_secret``, checked with ``token_valid``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    secret, _ = made_secret(path, setting, token_valid, hint, kind=kind)
    return secret
