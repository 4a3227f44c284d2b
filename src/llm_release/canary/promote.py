"""Promote: put the stable release and the winner behind HAProxy; promote or roll back.

One canary at a time; its weight steps through ``set_canary_weight`` (1..99). A server
leaves the router before it stops: rollback and promote first drain its slot (no new
request reaches it from that instant), then wait until HAProxy and vLLM both count no
request in flight on it, and only then stop it — so no client request is lost.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict

from llm_release import paths, registry
from llm_release.canary import alertmanager, basic_auth, prometheus
from llm_release.canary.drain import DrainResult, drain_and_stop
from llm_release.canary.publish import origin_of
from llm_release.canary.router import Router, SlotTarget
from llm_release.errors import ConfigError, ReleaseError, StateError
from llm_release.fileio import atomic_write_text
from llm_release.registry import RegistryState, Release
from llm_release.results import DeployTarget
from llm_release.serving import backends, processes
from llm_release.serving.factory import start_detached
from llm_release.serving.serve import Endpoint, Owner, stop_process_group
from llm_release.settings import settings

logger = logging.getLogger(__name__)


def default_router_port() -> int:
    return settings().router_port


def router_for(state: RegistryState) -> Router:
    return Router(paths.router_dir(), state.router_port or default_router_port())


def release_alive(release: Release) -> bool:
    """The recorded server still runs: same pid and start time (older records: a command
    line naming the release), or the release's own container. A reused pid is some other
    process, never ours."""
    return backends.release_alive(release)


def stop_release(release: Release) -> bool:
    """Stop ``release``'s server if it is still the recorded one; False otherwise."""
    return backends.stop_release(release)


def _server_identity(endpoint: Endpoint) -> dict:
    """What a release records of its server, whichever backend runs it."""
    return {
        "port": endpoint.port,
        "pid": endpoint.pid,
        "pid_started": processes.start_time(endpoint.pid) if endpoint.pid else None,
        "container": endpoint.container,
        "supervisor_port": endpoint.supervisor_port,
    }


def ensure_no_canary() -> None:
    state = registry.load()
    if state.canary is not None and release_alive(state.canary):
        raise StateError(
            f"a canary is already live ({state.canary.release_id} at {state.canary_weight}%)",
            hint="finish it first: 'llm-release canary promote' or 'llm-release canary rollback'",
        )


def _start_release(target: DeployTarget, public_name: str, role: str) -> Release:
    release_id = f"{target.candidate}-{target.commit[:8]}-{time.strftime('%Y%m%d%H%M%S')}"
    log_path = paths.servers_dir() / f"{role}-{release_id}.log"
    endpoint = start_detached(
        target.model_dir,
        [public_name, release_id],
        target.serving,
        log_path,
        # picked by the server: one another server binds first is picked again
        owner=Owner(role=role, release_id=release_id, candidate=target.candidate),
    )
    return Release(
        release_id=release_id,
        candidate=target.candidate,
        scheme=target.scheme,
        repo_id=target.repo_id,
        commit=target.commit,
        model_dir=str(target.model_dir),
        public_name=public_name,
        **_server_identity(endpoint),
        log_path=str(log_path),
        run_dir=str(target.run_dir) if target.run_dir else None,
        serving=target.serving,
        origin=origin_of(target.model_dir, target.scheme, hash_missing=True),
    )


def _restart(release: Release, role: str = "stable") -> Release:
    # The registry is a record anyone with access to its database can edit: a restart
    # serves a model only from the project's own model folders (the check publishing makes
    # too) and writes a log only under the home, where the pipeline put them.
    what = f"the release registry's {role} release"
    model_dir = registry.recorded_model_dir(release, what)
    log_path = registry.recorded_log_path(release, what)
    endpoint = start_detached(
        model_dir,
        [release.public_name, release.release_id],
        release.serving,
        log_path,
        owner=Owner(role=role, release_id=release.release_id, candidate=release.candidate),
    )
    return release.model_copy(update=_server_identity(endpoint))


def _slot(release: Release | None, weight: int) -> SlotTarget | None:
    return SlotTarget("127.0.0.1", release.port, weight) if release else None


def check_ports(state: RegistryState) -> None:
    """Before HAProxy or Prometheus is pointed at the record's servers (both send them the
    servers' key): every recorded port is the release's own server's, or free. A record
    edited to name another process's port is refused, nothing sent there."""
    for role, release in (("stable", state.stable), ("canary", state.canary)):
        problems = backends.port_problems(release) if release is not None else []
        if problems:
            raise StateError(
                f"the record's {role} release {release.release_id}: {'; '.join(problems)}, "
                "not its own server: no key is sent there",
                hint="'make down' then 'make up' serves it again on ports of its own; "
                "check who edited the record",
            )


def _apply(router: Router, state: RegistryState) -> None:
    check_ports(state)
    stable_weight = 100 - state.canary_weight if state.canary else 100
    stable = _slot(state.stable, stable_weight)
    canary = _slot(state.canary, state.canary_weight)
    if router.running() and router.outdated():
        logger.warning("restarting HAProxy: its config predates the vLLM servers' key")
        router.stop()
    if router.running():
        router.set_target("stable", stable)
        router.set_target("canary", canary)
    else:
        router.start(stable, canary)
    # Metrics follow the registry; a canary nobody can measure is not deployed.
    _sync_metrics(state, router.metrics_port)


def _sync_metrics(state: RegistryState, haproxy_metrics_port: int | None) -> None:
    """Prometheus follows the registry and sends the alerts that fire to the project's
    Alertmanager (each started if it is not running)."""
    check_ports(state)
    alerts = alertmanager.for_home().ensure_running()
    prometheus.sync_targets(state, haproxy_metrics_port, alerts.address)


def _follow_metrics(state: RegistryState, router: Router) -> None:
    """Best effort: a rollback or promotion never fails because Prometheus could not follow."""
    try:
        _sync_metrics(state, router.metrics_port if router.running() else None)
    except ReleaseError as exc:
        logger.warning("Prometheus does not follow this change: %s", exc.one_line())


def deploy(
    stable_target: DeployTarget | None,
    canary_target: DeployTarget | None,
    *,
    public_name: str,
    canary_weight: int,
    router_port: int | None = None,
) -> RegistryState:
    """Make sure a stable release serves, add the canary at ``canary_weight`` percent."""
    down_mark().unlink(missing_ok=True)  # serving again: the units bring it back again
    with registry.locked() as state:
        if state.canary is not None and release_alive(state.canary):
            raise StateError(
                f"a canary is already live ({state.canary.release_id})",
                hint="'llm-release canary promote' or 'llm-release canary rollback' first",
            )
        state.canary = None
        if router_port:
            state.router_port = router_port
        state.router_port = state.router_port or default_router_port()
        started: list[Release] = []
        try:
            if state.stable is None:
                if stable_target is None:
                    raise StateError("there is no stable release and no baseline to make stable")
                state.stable = _start_release(stable_target, public_name, "stable")
                started.append(state.stable)
                state.log("stable", release=state.stable.release_id)
            elif not release_alive(state.stable):
                stop_release(state.stable)  # a supervisor that gave up on it, if any
                state.stable = _restart(state.stable)
                started.append(state.stable)
            if canary_target is not None:
                state.canary = _start_release(canary_target, public_name, "canary")
                started.append(state.canary)
                state.canary_weight = canary_weight
            _apply(router_for(state), state)
        except BaseException:
            for release in started:
                stop_release(release)
            raise
        if state.canary:
            state.log("canary", release=state.canary.release_id, weight=canary_weight)
        return state


class RollbackResult(BaseModel):
    """The rolled-back release and how its server left (``drain.confirmed_empty``)."""

    model_config = ConfigDict(extra="forbid")

    release: Release
    drain: DrainResult

    @property
    def release_id(self) -> str:
        return self.release.release_id


def rollback(drain_timeout_s: float = 120, reason: str | None = None) -> RollbackResult:
    with registry.locked() as state:
        if state.canary is None:
            raise StateError(
                "there is no canary to roll back",
                hint="'llm-release canary status' shows the current releases",
            )
        router = router_for(state)
        canary = state.canary
        if router.running():
            # Out of the rotation first: no new request reaches the canary from this
            # instant on; the ones it has finish there.
            router.drain("canary")
            router.set_weight("canary", 0)
            router.set_weight("stable", 100)
        state.canary = None
        state.canary_weight = 0
        state.log("rollback", release=canary.release_id, reason=reason or "by hand")
        _follow_metrics(state, router)
    drain = drain_and_stop(canary, drain_timeout_s, router=router, slot="canary")
    # The slot is parked under the lock, and only while no new canary took it: a release
    # deployed during the drain owns the slot now, and HAProxy must agree with the registry.
    with registry.locked() as state:
        if not drain.confirmed_empty:
            state.log(
                "drain", release=canary.release_id, outcome=drain.outcome, detail=drain.detail
            )
        router = router_for(state)
        if state.canary is None and router.running():
            router.set_target("canary", None)
    return RollbackResult(release=canary, drain=drain)


def promote(drain_timeout_s: float = 120) -> Release:
    with registry.locked() as state:
        if state.canary is None:
            raise StateError(
                "there is no canary to promote",
                hint="run a release first; 'llm-release canary status' shows state",
            )
        router = router_for(state)
        old, new = state.stable, state.canary
        if router.running():
            # The new release takes every new request in the slot it serves from now; the
            # old one leaves the rotation and finishes the requests it has. Re-pointing
            # the stable slot at once would hide the old server's in-flight count.
            router.set_weight("canary", 100)
            if old is not None:
                router.drain("stable")
                router.set_weight("stable", 0)
        state.stable, state.canary, state.canary_weight = new, None, 0
        state.log("promote", release=new.release_id, replaced=old.release_id if old else None)
        _follow_metrics(state, router)
    drain = None
    if old is not None:
        drain = drain_and_stop(old, drain_timeout_s, router=router, slot="stable")
    # Then the slots are made to agree with the registry (stable slot -> the new release
    # before the canary slot is parked, so some server is always in the rotation), under
    # the lock: a release deployed during the drain owns the canary slot.
    with registry.locked() as state:
        if drain is not None and not drain.confirmed_empty:
            state.log("drain", release=drain.release_id, outcome=drain.outcome, detail=drain.detail)
        router = router_for(state)
        if router.running():
            _apply(router, state)
    return new


def set_canary_weight(weight: int) -> RegistryState:
    """Step the live canary to ``weight`` percent (1..99); the stable release gets the rest.

    100 is ``promote()`` and 0 is ``rollback()``: both take a server out, so neither is a
    weight step. Weights change in HAProxy without touching a connection.
    """
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 99:
        raise ConfigError(
            f"canary weight {weight!r} is out of range",
            hint="pass 1..99; 100 is 'llm-release canary promote', 0 is "
            "'llm-release canary rollback'",
        )
    with registry.locked() as state:
        if state.canary is None or not release_alive(state.canary):
            raise StateError(
                "there is no live canary to weigh",
                hint="run a release first; 'llm-release canary status' shows the releases",
            )
        previous = state.canary_weight
        state.canary_weight = weight
        router = router_for(state)
        if router.running():
            router.set_weight("canary", weight)
            router.set_weight("stable", 100 - weight)
        else:
            _apply(router, state)
        state.log(
            "canary_weight", release=state.canary.release_id, weight=weight, previous=previous
        )
        return state


def status() -> dict:
    state = registry.load()
    router = router_for(state)
    running = router.running()
    stats = router.stats() if running else {}
    releases = []
    for role, release in (("stable", state.stable), ("canary", state.canary)):
        if release is None:
            continue
        row = stats.get(role, {})
        releases.append(
            {
                "role": role,
                "release_id": release.release_id,
                "candidate": release.candidate,
                "scheme": release.scheme,
                "repo_id": release.repo_id,
                "commit": release.commit,
                "backend_url": f"http://127.0.0.1:{release.port}",
                "process_alive": release_alive(release),
                # Restarts of its server (its supervisor's, or Docker's count) and state.
                "server": backends.server_summary(release),
                "weight": int(row["weight"]) if row.get("weight") else None,
                "requests": int(row["stot"]) if row.get("stot") else 0,
                "health": row.get("status"),
            }
        )
    alerts = alertmanager.for_home()
    webhook = alerts.webhook_url()
    return {
        "lb_url": router.url,
        # The project's own key: the loopback listener takes it (the demo's key).
        "api_key_file": str(router.api_key_path),
        "router_running": running,
        # Where firing alerts go: the receiver's host only (its URL may carry a token).
        # Its API asks for basic auth: the user, the file with the password, amtool's flags.
        "alertmanager": {
            "url": alerts.url,
            "running": alerts.running(),
            "notifies": urlsplit(webhook).hostname if webhook else None,
            "user": basic_auth.USERNAME,
            "password_file": str(alerts.credentials.password_path),
            "amtool": ["amtool", *alerts.amtool_args()],
        },
        "canary_weight": state.canary_weight if state.canary else 0,
        "releases": releases,
        # The canary's walk: its step and the last analysis window's verdict.
        "rollout": state.rollout.model_dump(mode="json") if state.rollout else None,
        "history": state.history[-10:],
    }


def down(problems: list[str] | None = None) -> list[str]:
    """Stop every server the project started and the router; keep the records.

    The registry's servers are stopped only if they are still the recorded processes. A
    registry that cannot be read stops nothing less: its problem goes to ``problems`` (or
    is raised after the stopping when no list is given), and the servers are found by
    their command lines under the project home.
    """
    stopped = []
    error: ReleaseError | None = None
    if paths.home().is_dir():  # the systemd units' 'up --unattended' leaves it down
        atomic_write_text(down_mark(), "stopped by 'llm-release down'\n")
    try:
        state = registry.load()
    except StateError as exc:
        error, state = exc, RegistryState()
    for release in (state.canary, state.stable):
        if release is not None and stop_release(release):
            server = (
                f"container {release.container[:12]}" if release.container else f"pid {release.pid}"
            )
            stopped.append(f"vLLM {release.release_id} ({server})")
    if router_for(state).stop():
        stopped.append("HAProxy")
    # Its data stays under the home: the next release adds to the same history.
    if prometheus.for_home().stop():
        stopped.append("Prometheus")
    # Its notification log stays too: a restarted Alertmanager does not page again.
    if alertmanager.for_home().stop():
        stopped.append("Alertmanager")
    # Every process group the project's servers started, by the mark in their environment:
    # supervisors first (they restart nothing more), then the rest, orphans included (a
    # vLLM engine core whose API server died).
    for group in processes.marked_groups(paths.home()):
        if stop_process_group(group, grace_s=10):
            stopped.append(f"server process group {group}")
    for pid in processes.under_home(paths.home()):
        if stop_process_group(pid, grace_s=10):
            stopped.append(f"unrecorded server (pid {pid})")
    # Containers labelled with this project and home, recorded or not (none without Docker).
    stopped += backends.sweep_containers(paths.home(), everything=True)
    if error is not None:
        if problems is None:
            raise error
        problems.append(error.one_line())
    return stopped


def crash_looping(release: Release) -> str | None:
    """Why ``release``'s server is crash-looping (no longer restarted), or None: the
    canary's walk rolls a crash-looping canary back."""
    return backends.crash_looping(release)


def down_mark() -> Path:
    """Written by 'llm-release down', removed by a plain 'llm-release up': while it is
    there, the systemd units' 'up --unattended' starts nothing (what an operator stopped
    stays stopped, across a reboot too)."""
    return paths.home() / "down.mark"


def up(*, unattended: bool = False) -> tuple[RegistryState, list[str]]:
    """Bring every release in the record back (after a reboot, or a 'down'): each server
    not alive is started again on the record's model and settings, healthy before the
    router points at it; the canary keeps its weight. Returns the state and what started.

    ``unattended`` (the systemd units' boot and every-30-s run): nothing at all after
    'llm-release down' (``down_mark``), no error for a record with no release, and a
    release whose server crash-loops is left to an operator (a plain 'up' restarts it)."""
    if unattended and down_mark().exists():
        return registry.load(), []
    if not unattended:
        down_mark().unlink(missing_ok=True)
    with registry.locked() as state:
        if state.stable is None and state.canary is None:
            if unattended:
                return state, []
            raise StateError(
                "the release record has no release to bring back",
                hint="run a release first ('make demo' or the release flow)",
            )
        state.router_port = state.router_port or default_router_port()
        started: list[Release] = []
        try:
            for role in ("stable", "canary"):
                release = getattr(state, role)
                if release is not None and release_alive(release):
                    watch = backends.ensure_watched(release, role)
                    if watch is not None:
                        logger.warning("%s role: started %s again", role, watch)
                    continue
                if release is None:
                    continue
                if unattended and crash_looping(release):
                    continue
                stop_release(release)  # what is left: a supervisor that gave up, a container
                release = _restart(release, role)
                started.append(release)
                setattr(state, role, release)
                state.log("up", role=role, release=release.release_id)
            _apply(router_for(state), state)
        except BaseException:
            for release in started:  # the record keeps what it had: nothing unrecorded runs
                stop_release(release)
            raise
        return state, [f"{r.release_id} (port {r.port})" for r in started]
