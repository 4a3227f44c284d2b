"""Which running processes are the project's: a pid alone is not an identity.

A pid recorded in the registry or a pid file can belong to an unrelated process once the
recorded one exited and the kernel reused the number. A process is taken for the one
recorded only when its start time matches the one recorded with it (or, for records
without a start time, when its command line names what it must be); nothing else is
signalled. Start times are seconds after boot, as the kernel counts them: the wall clock
moves under a running process (a VM restored from a snapshot, an NTP step) and would make
a server that still runs look gone. A record is also input: a process is the project's
only when its environment carries this home's mark (``is_ours``), so a record naming some
other process's pid and start time (both readable in /proc) gets nothing signalled. ``under_home`` finds the project's servers by command line when the records
are lost (a corrupt registry, a killed flow).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

# Start times come from /proc in clock ticks; the same process reads back the same value.
START_TOLERANCE_S = 0.05
# A recorded start time above this is an older record's: seconds since the epoch (psutil's
# create_time, which follows the wall clock's steps). Seconds after boot stay below it for
# three years of uptime.
EPOCH_FLOOR = 1e8
# An older record's epoch start time against psutil's: /proc/stat's boot time is whole
# seconds and moves with the wall clock's corrections.
EPOCH_TOLERANCE_S = 2.0
# A listening socket psutil has not yet matched to its process (foreign_listeners).
UNSEEN_RETRIES = 5
UNSEEN_WAIT_S = 0.1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
VLLM_MARKER = "vllm.entrypoints.openai.api_server"
# In the environment of every server process the project starts (and of every process
# those start, which inherit it): the project home's path. A process renames itself
# (vLLM's engine core is 'VLLM::EngineCore'); its environment keeps the mark.
HOME_MARK = "LLMRELEASE_SERVED_FROM"
SUPERVISOR_MARKER = "llm_release.serving.supervise"
# Debian's prometheus-alertmanager names its binary so; upstream's tarball 'alertmanager'.
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")


def start_time(pid: int) -> float | None:
    """When ``pid`` started, in seconds after boot (/proc/PID/stat's clock ticks): the value
    records keep. Unlike an epoch time it does not move when the wall clock is stepped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        # Field 22; the command name (field 2, in parentheses) may hold spaces and ')'.
        return int(stat.rsplit(b")", 1)[1].split()[19]) / CLOCK_TICKS
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):
        return _epoch_start_time(pid)  # no /proc (not Linux): psutil's epoch time


def _epoch_start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def same_start(pid: int, started: float) -> bool:
    """``pid`` started when ``started`` says (seconds after boot; an older record's epoch
    seconds are compared with psutil's epoch time, within its whole-second jitter)."""
    if started > EPOCH_FLOOR:
        now = _epoch_start_time(pid)
        return now is not None and abs(now - started) <= EPOCH_TOLERANCE_S
    now = start_time(pid)
    return now is not None and abs(now - started) <= START_TOLERANCE_S


def is_ours(pid: int, home: Path) -> bool:
    """``pid`` is a process the project started for ``home``: its environment carries the
    home's mark (``HOME_MARK``), which only the project's own starts put there. A process of
    another user cannot be read and is not ours."""
    try:
        return psutil.Process(pid).environ().get(HOME_MARK) == str(Path(home).resolve())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        return psutil.Process(pid).cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
        return []


def is_alive(pid: int) -> bool:
    """Running and not a zombie (an exited child not yet reaped is not a server)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, ValueError):
        return False


def is_same(
    pid: int, started: float | None, *, cmdline_has: str | tuple[str, ...] | None = None
) -> bool:
    """``pid`` is alive and is the process recorded: same start time, and — where
    ``cmdline_has`` is given — one argument of its command line equal to it (or to one of
    them; a record without a start time is judged by the command line alone). Both, where
    both are known: a record that names another live process of the same home by its pid
    and start time (both readable in /proc) is not that process's, unless the process's
    command line names it too. Equal, not contained: a forged release id that begins
    another's (``x-1`` of ``x-10``) names nothing of it."""
    if pid <= 0 or not is_alive(pid):
        return False
    if started is not None and not same_start(pid, started):
        return False
    if cmdline_has:
        wanted = {cmdline_has} if isinstance(cmdline_has, str) else set(cmdline_has)
        return any(part in wanted for part in _cmdline(pid))
    return started is not None


def started_before(pid: int, moment: float) -> bool:
    """``pid`` is alive and started no later than ``moment`` (e.g. its pid file's mtime):
    a reused pid belongs to a process that started after the file was written."""
    started = _epoch_start_time(pid)
    return is_alive(pid) and started is not None and started <= moment + 1.0


def in_my_pid_namespace(pid: int) -> bool:
    """False for a process of a container (another PID namespace): the docker backend's
    servers are stopped through the daemon, never by signalling their processes."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return True  # no /proc namespace links (not Linux): no containers to tell apart


def under_home(home: Path) -> list[int]:
    """Group leaders of this user's vLLM servers, HAProxy, Prometheus and Alertmanager whose
    command line names a path under ``home``: what the project started there, records or not
    (processes in containers excepted: they are the docker backend's)."""
    home_text = str(Path(home).resolve())
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            cmdline = proc.info["cmdline"] or []
            uids = proc.info["uids"]
            if uids is None or uids.real != os.getuid() or proc.pid == os.getpid():
                continue
            if not in_my_pid_namespace(proc.pid):
                continue
            text = " ".join(cmdline)
            if home_text + "/" not in text:
                continue
            is_server = VLLM_MARKER in text or (
                cmdline and Path(cmdline[0]).name == "haproxy" and "-f" in cmdline
            )
            is_server = is_server or bool(
                cmdline and Path(cmdline[0]).name in ("prometheus", *ALERTMANAGER_BINARIES)
            )
            if is_server and os.getpgid(proc.pid) == proc.pid:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return sorted(found)


def read_int(path: Path) -> int | None:
    """An integer a daemon's file records (a pid, a port), or None when absent or garbled."""
    try:
        return int(Path(path).read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def pid_from_file(path: Path, cmdline_has: str) -> int | None:
    """The pid a pid file names, if that process still runs ``cmdline_has``: the file
    outlives its daemon, and a reused pid is somebody else's process."""
    pid = read_int(path)
    if pid is None or not is_same(pid, None, cmdline_has=cmdline_has):
        return None
    return pid


def marked_groups(home: Path) -> list[int]:
    """Process groups holding a process of this user marked with ``home``
    (``HOME_MARK``): the servers the project started there and their children, orphans
    included, whatever they call themselves now. Groups of a supervisor come first (stopped
    first, it restarts nothing more); this process's own group never."""
    home_text = str(Path(home).resolve())
    own_group = os.getpgid(0)
    supervisors: set[int] = set()
    groups: set[int] = set()
    for proc in psutil.process_iter(["pid", "uids"]):
        try:
            uids = proc.info["uids"]
            if uids is None or uids.real != os.getuid() or proc.pid == os.getpid():
                continue
            if proc.environ().get(HOME_MARK) != home_text:
                continue
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            group = os.getpgid(proc.pid)
            if group == own_group:
                continue
            groups.add(group)
            if any(SUPERVISOR_MARKER in part for part in proc.cmdline()):
                supervisors.add(group)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return sorted(supervisors) + sorted(groups - supervisors)


def group_alive(pgid: int) -> bool:
    """A process of group ``pgid`` still runs (zombies, exited and waiting for whoever
    adopted them to collect them, do not run)."""
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
            continue
    return False


def listeners(port: int) -> list[int | None]:
    """The processes listening on TCP ``port`` on this host (any address): their pids, None
    for a socket whose process this user may not see (another user's)."""
    return [
        conn.pid
        for conn in psutil.net_connections(kind="tcp")
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    ]


def tree(pid: int) -> set[int]:
    """``pid`` and every process below it (empty when it is gone)."""
    try:
        root = psutil.Process(pid)
        return {pid} | {child.pid for child in root.children(recursive=True)}
    except (psutil.NoSuchProcess, ValueError):
        return set()


def foreign_listeners(port: int, ours: set[int]) -> list[str]:
    """Who else listens on ``port``: pids outside ``ours``, or 'another user' for a socket
    whose process this user cannot see.

    psutil names a socket's process by scanning every process's descriptors after it read
    the kernel's socket table, so a socket bound between the two reads has no pid for a
    moment: a pid-less socket is looked at again (``UNSEEN_RETRIES`` times, ``UNSEEN_WAIT_S``
    apart) before it is taken for another user's. Another user's stays pid-less."""
    found = listeners(port)
    for _ in range(UNSEEN_RETRIES):
        if None not in found:
            break
        time.sleep(UNSEEN_WAIT_S)
        found = listeners(port)
    return [
        "another user's process" if pid is None else f"pid {pid}"
        for pid in found
        if pid is None or pid not in ours
    ]
