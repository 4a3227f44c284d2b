"""systemd units that keep a project home's releases serving across a reboot and the loss
of a supervisor (``llm-release systemd``).

Two units per home (their names from ``--name``, default ``llm-release``):

* ``NAME-up.service``, ``Type=oneshot``: ``llm-release up --unattended`` in the project
  folder with ``LLM_RELEASE_HOME`` set, enabled for the boot (``multi-user.target``, or
  ``default.target`` for a user unit). ``KillMode=process``: the servers ``up`` starts are
  detached (their own sessions) and must outlive the oneshot that started them; systemd
  would kill the whole control group of a finished oneshot otherwise.
* ``NAME-up.timer``: runs that service again 30 s after each run ends
  (``OnUnitInactiveSec=``), so a supervisor that was killed, or a HAProxy, Prometheus or
  Alertmanager that died, is started again within about 30 s. ``up`` leaves every release
  still serving alone, starts nothing after ``llm-release down`` (until a plain ``up`` or a
  deploy), and leaves a crash-looping release to an operator.

The project never calls ``systemctl``: it writes the files and prints the lines to run.
Paths go into the units escaped by systemd's rules (``%`` doubled for the specifiers,
the program's path double-quoted); a path systemd cannot take on one
line (a newline, a control character, a backslash or a double quote) is refused.
"""

from __future__ import annotations

import getpass
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from llm_release.errors import ConfigError
from llm_release.settings import in_force

# How long after a run of 'up' ends the timer runs it again.
EVERY_S = 30
# A boot's 'up' waits for every release to be healthy (vLLM loading a model: minutes).
UP_TIMEOUT = "1h"
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


@dataclass
class Units:
    service: str
    timer: str
    files: dict[str, str]  # file name -> text


def _check_path(path: Path, what: str) -> str:
    text = str(path)
    bad = [c for c in text if c in '\\"' or ord(c) < 32 or ord(c) == 127]
    if bad:
        raise ConfigError(
            f"{what} {text!r} holds {bad[0]!r}, which a systemd unit cannot take on one line",
            hint="move the project (or LLM_RELEASE_HOME) to a path without newlines, control "
            "characters, backslashes or double quotes",
        )
    if not path.is_absolute():
        raise ConfigError(f"{what} {text!r} is not an absolute path")
    return text


def _specifiers(text: str) -> str:
    """``%`` starts a specifier in every unit setting that takes a path or a command."""
    return text.replace("%", "%%")


def _exec_path(text: str) -> str:
    """The program of ``ExecStart=``: quoted (spaces), ``%`` doubled. Not ``$``: systemd
    expands variables in the arguments only (``systemd-analyze verify`` says a doubled one
    in the path is not executable)."""
    return '"' + _specifiers(text) + '"'


def llm_release_bin() -> Path:
    """This interpreter's ``llm-release`` script (the project's .venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "llm-release"
    if beside.exists():
        return beside.absolute()
    found = shutil.which("llm-release")
    if found is None:
        raise ConfigError(
            "no llm-release script beside this interpreter nor on PATH",
            hint="install the project into its .venv ('make setup') and run "
            ".venv/bin/llm-release systemd",
        )
    return Path(found).absolute()


def environment() -> dict[str, str]:
    """The settings in force here that the units' 'up' must see too: every variable the
    project reads (``settings.in_force``: LLM_RELEASE_*, HF_ENDPOINT, PREFECT_API_URL...)
    that is set, and PATH (the tools 'up' starts: HAProxy, Prometheus, Alertmanager).
    LLM_RELEASE_HOME is the unit's own setting."""
    found = in_force(extra=("PATH",))
    found.pop("LLM_RELEASE_HOME", None)
    return found


def env_file_text(variables: dict[str, str]) -> str:
    """An ``EnvironmentFile=``: each value single-quoted (taken literally by systemd: no
    escapes, no variables); a value systemd cannot take so is refused naming the variable
    (never the value: it may be a secret)."""
    lines = ["# Written by 'llm-release systemd': the settings its units' 'up' runs with."]
    for name, value in sorted(variables.items()):
        if "'" in value or any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ConfigError(
                f"{name} holds a single quote or a control character, which the units' "
                "environment file cannot take",
                hint=f"set {name} without them, or write the units' environment by hand",
            )
        lines.append(f"{name}='{value}'")
    return "\n".join(lines) + "\n"


def owner(path: Path) -> str:
    try:
        return path.owner()
    except (KeyError, OSError):  # a uid without a name: the user running this
        return getpass.getuser()


def render(
    project: Path,
    home: Path,
    *,
    user: bool,
    name: str = "llm-release",
    executable: Path | None = None,
    run_as: str | None = None,
) -> Units:
    """The unit files' text for ``home`` (a system unit runs as ``run_as``, by default the
    owner of the home, or of the project while there is no home yet: 'sudo llm-release
    systemd' still runs the servers as the user whose files they are, not as root)."""
    if not NAME_RE.fullmatch(name):
        raise ConfigError(
            f"unit name {name!r} is not a plain name",
            hint="letters, digits, '_', '.', '-'; at most 64 characters",
        )
    project_text = _check_path(project, "the project folder")
    home_text = _check_path(home, "LLM_RELEASE_HOME")
    exe_text = _check_path(executable or llm_release_bin(), "the llm-release script")
    service, timer = f"{name}-up.service", f"{name}-up.timer"
    run_as = None if user else (run_as or owner(home if home.exists() else project))
    if run_as is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", run_as):
        raise ConfigError(f"user name {run_as!r} is not one systemd takes")
    description = _specifiers(f"llm-release: bring the releases of {home_text} back")
    service_text = "\n".join(
        [
            "# Written by 'llm-release systemd'; written again by it, edits are lost.",
            "[Unit]",
            f"Description={description}",
            # A user manager has no network-online.target (the system's is not its unit).
            *([] if user else ["Wants=network-online.target", "After=network-online.target"]),
            "",
            "[Service]",
            "Type=oneshot",
            *([f"User={run_as}"] if run_as else []),
            f"WorkingDirectory={_specifiers(project_text)}",
            f'Environment="LLM_RELEASE_HOME={_specifiers(home_text)}"',  # no $ expansion here
            # The other settings (0600 in the home: a database URL may hold a password).
            f"EnvironmentFile=-{_specifiers(str(env_path(home)))}",
            f"ExecStart={_exec_path(exe_text)} up --unattended",
            # The servers 'up' starts outlive it (they are the point of it).
            "KillMode=process",
            f"TimeoutStartSec={UP_TIMEOUT}",
            "",
            "[Install]",
            f"WantedBy={'default.target' if user else 'multi-user.target'}",
            "",
        ]
    )
    timer_text = "\n".join(
        [
            "# Written by 'llm-release systemd'; written again by it, edits are lost.",
            "[Unit]",
            f"Description={description} every {EVERY_S} s (a dead supervisor restarted)",
            "",
            "[Timer]",
            f"OnBootSec={EVERY_S}s",
            f"OnUnitInactiveSec={EVERY_S}s",
            "AccuracySec=1s",
            f"Unit={service}",
            "",
            "[Install]",
            "WantedBy=timers.target",
            "",
        ]
    )
    return Units(service, timer, {service: service_text, timer: timer_text})


def env_path(home: Path) -> Path:
    return home / "systemd.env"


def write_env(home: Path, variables: dict[str, str]) -> Path:
    """The units' environment file, 0600 (created so: never readable by others meanwhile)."""
    text = env_file_text(variables)
    path = env_path(home)
    home.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    if os.geteuid() == 0:  # written by root (sudo): the home's owner keeps it
        os.chown(path, home.stat().st_uid, home.stat().st_gid)
    return path


def default_dir(user: bool) -> Path:
    if user:
        return Path.home() / ".config" / "systemd" / "user"
    return Path("/etc/systemd/system")


def write(units: Units, directory: Path) -> list[Path]:
    written = []
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for file_name, text in units.files.items():
            path = directory / file_name
            path.write_text(text)
            path.chmod(0o644)
            written.append(path)
    except OSError as exc:  # not allowed, a read-only file system, a path under /proc
        raise ConfigError(
            f"cannot write the units to {directory}: {exc.strerror}",
            hint="pass --output DIR and copy them as printed (with sudo for system units; "
            "sudo itself would drop your LLM_RELEASE_* settings), or --user",
        ) from exc
    return written


def commands(units: Units, directory: Path, *, user: bool) -> list[str]:
    """What the operator runs to install them (never run here)."""
    flag = " --user" if user else ""
    sudo = "" if user else "sudo "
    lines = []
    if directory.resolve() != default_dir(user).resolve():
        target = default_dir(user)
        names = " ".join(shlex.quote(str(directory / f)) for f in units.files)
        lines.append(f"{sudo}cp {names} {shlex.quote(str(target))}/")
    # The service at every boot; the timer now (its first run within seconds, then every
    # EVERY_S after each run ends): 'enable --now' of the service would wait for 'up'.
    lines += [
        f"{sudo}systemctl{flag} daemon-reload",
        f"{sudo}systemctl{flag} enable {units.service}",
        f"{sudo}systemctl{flag} enable --now {units.timer}",
    ]
    if user:
        lines.append(f"sudo loginctl enable-linger {getpass.getuser()}  # run at boot, no login")
    return lines
