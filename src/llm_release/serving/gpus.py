"""Which GPUs each running server of the project holds, and how much of each: servers share
a GPU only while their ``gpu_memory_utilization`` adds up to at most ``SHARE_CAP``.

The ledger is the record's ``gpu_claims`` table (``llm_release.record``: SQLite under the
project home, or PostgreSQL shared by several workers), changed in one transaction that
locks it first (``store.lock_gpu_claims``), so two servers starting at once take turns
and the second sees the first's GPUs taken. The old ``gpus.json`` is imported once, at the
record's first start on this home (``record/legacy.py``). A server
claims its GPUs before it starts (holder: its name; identity: the claiming pipeline
process until the server's own pid or container is bound to the claim) and gives them
back when it stops. A claim whose holder no longer runs — a killed pipeline, a server
that died, a container removed by hand — is dropped at the next claim, so a crash never
locks a GPU away for good.

Each claim holds a share of its GPUs, its server's ``gpu_memory_utilization`` (vLLM takes that
fraction of the GPU's memory and checks at its start that it is free): at the default 0.9 a
server has its GPUs to itself, as before; at 0.3 the stable release, its canary and a
measured candidate fit on one GPU (the GPU demo's sizing, configs/demo-gpu.json). A new
server takes wholly free GPUs first, then the least used ones with room.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select

from llm_release import paths
from llm_release.config import ServingConfig
from llm_release.errors import ServeError
from llm_release.record import store
from llm_release.record.schema import GpuClaimRow
from llm_release.serving import processes
from llm_release.serving.backends.docker_client import container_running
from llm_release.settings import settings

log = logging.getLogger(__name__)


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # A claim read back from the record is input: its texts reach errors and the Docker
    # API, its indices the GPU choice; one that does not read is dropped (``_claims``).
    holder: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,299}$")
    gpus: list[Annotated[int, Field(ge=0, lt=1024)]] = Field(max_length=1024)
    backend: Literal["process", "docker"] = "process"
    # Who holds the GPUs: a process (pid and start time) or a container (id).
    pid: int | None = Field(None, ge=1, le=2**31)
    pid_started: float | None = None
    container: str | None = Field(None, pattern=r"^[0-9a-f]{12,64}$")
    # the part of each of its GPUs' memory it holds (its gpu_memory_utilization)
    share: float = Field(1.0, gt=0, le=1)
    # the fleet host whose GPUs these are ('': the one host without a name)
    host: str = Field("", pattern=r"^([a-z][a-z0-9_]{0,39})?$")


# Servers share a GPU while their shares add up to at most this: vLLM's own CUDA context and
# the driver's reserve are outside every server's budget.
SHARE_CAP = 0.95


class Ledger(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claims: list[Claim] = Field(default_factory=list)

    def held(self) -> dict[int, str]:
        """GPU index → the servers holding a share of it (names, comma-separated)."""
        held: dict[int, list[str]] = {}
        for c in self.claims:
            for gpu in c.gpus:
                held.setdefault(gpu, []).append(c.holder)
        return {gpu: ", ".join(names) for gpu, names in held.items()}

    def used(self) -> dict[int, float]:
        """GPU index → the shares of it held."""
        used: dict[int, float] = {}
        for c in self.claims:
            for gpu in c.gpus:
                used[gpu] = used.get(gpu, 0.0) + c.share
        return used


def ledger_path() -> Path:
    """The ledger's old JSON file: imported into the record once (its first start on this
    home), then left as it was."""
    return paths.home() / "gpus.json"


def _query_gpus(fields: str) -> str:
    """``nvidia-smi --query-gpu=FIELDS`` as CSV rows; empty without nvidia-smi or when it
    fails."""
    try:
        return subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def host_gpus() -> list[int]:
    """The indices of this host's NVIDIA GPUs (none without ``nvidia-smi``)."""
    out = _query_gpus("index")
    return sorted(int(line) for line in out.split() if line.strip().isdigit())


def compute_capabilities() -> dict[int, float]:
    """Each NVIDIA GPU's CUDA compute capability by index (empty without ``nvidia-smi`` or
    when it fails; a line it cannot read is left out)."""
    caps = {}
    for line in _query_gpus("index,compute_cap").splitlines():
        index, _, cap = (part.strip() for part in line.partition(","))
        try:
            caps[int(index)] = float(cap)
        except ValueError:
            continue
    return caps


def choose(
    wanted: Literal["auto", "all"] | int | list[int],
    tensor_parallel_size: int,
    host: list[int],
    held: dict[int, str],
    used: dict[int, float] | None = None,
    share: float = 1.0,
) -> list[int]:
    """The GPUs a new server holding ``share`` of each gets: ``wanted`` out of ``host``, each
    with room (``used``: GPU index → the shares held, by default a whole GPU for each in
    ``held``; ``held``: GPU index → the servers holding it). Wholly free GPUs first, then the
    least used. Raises naming the holders when they do not fit."""
    used = {g: 1.0 for g in held} if used is None else used

    def room(g: int) -> bool:
        taken = used.get(g, 0.0)
        return taken == 0 or taken + share <= SHARE_CAP + 1e-9

    free = sorted((g for g in host if room(g)), key=lambda g: (used.get(g, 0.0), host.index(g)))

    def refuse(what: str, busy: list[int]) -> ServeError:
        holders = ", ".join(f"GPU {g}: {held[g]}" for g in busy) or "none"
        return ServeError(
            f"{what}; GPUs on this host: {host or 'none'}, held by running servers: {holders}",
            hint="wait for a running candidate to finish, roll back or promote the canary, "
            "lower serving.gpus / tensor_parallel_size, lower gpu_memory_utilization so that "
            f"servers share a GPU (theirs add up to at most {SHARE_CAP}), or run "
            "'llm-release down' when the holders are gone",
        )

    if wanted == "all":
        busy = [g for g in host if not room(g)]
        if busy or not host:
            raise refuse(f"serving.gpus 'all' needs room for {share:g} on every GPU", busy)
        return list(host)
    if isinstance(wanted, list):
        unknown = [g for g in wanted if g not in host]
        if unknown:
            raise refuse(f"serving.gpus names GPU(s) {unknown} this host does not have", [])
        busy = [g for g in wanted if not room(g)]
        if busy:
            raise refuse(f"serving.gpus {wanted}: GPU(s) {busy} are held", busy)
        return sorted(wanted)
    count = tensor_parallel_size if wanted == "auto" else wanted
    if count > len(free):
        raise refuse(
            f"{count} GPU(s) with room for {share:g} of their memory needed "
            f"(tensor_parallel_size {tensor_parallel_size}, gpu_memory_utilization {share:g}), "
            f"{len(free)} have it",
            sorted(held),
        )
    return sorted(free[:count])


def _claims(rows: list[GpuClaimRow]) -> list[Claim]:
    claims = []
    for row in rows:
        try:
            claims.append(Claim.model_validate({f: getattr(row, f) for f in Claim.model_fields}))
        except ValidationError:
            # The ledger only prevents collisions between live servers: a claim that does
            # not read is dropped rather than blocking every start.
            log.warning("GPU claim %r in the record does not read; it is dropped", row.holder)
    return claims


def this_host() -> str:
    """This host's name in the fleet ('' for the one host without a name): a record shared
    by several hosts holds every host's claims, and each reads, prunes and writes its own
    (its processes and containers are the only ones it can see alive)."""
    return settings().host_name or ""


@contextlib.contextmanager
def _locked() -> Iterator[Ledger]:
    """This host's ledger, locked to the end of the block (claimers take turns); written
    back on a clean exit, left as it was when the block raises. Other hosts' claims are
    left as they are; a holder name one of them uses is refused."""
    host = this_host()
    with store.transaction() as session:
        rows = store.lock_gpu_claims(session)
        mine = [r for r in rows if (r.host or "") == host]
        foreign = {r.holder: r.host for r in rows if (r.host or "") != host}
        ledger = Ledger(claims=_claims(mine))
        yield ledger
        kept = {c.holder: c for c in ledger.claims}
        taken = sorted(set(kept) & set(foreign))
        if taken:
            raise ServeError(
                f"GPU claim {taken[0]!r} is held by host {foreign[taken[0]] or '(unnamed)'} "
                "in the shared record",
                hint="give every host of the fleet its own LLM_RELEASE_HOST_NAME "
                "(make fleet-join HOST=NAME)",
            )
        for row in mine:
            if row.holder not in kept:
                session.delete(row)
        session.flush()
        for c in kept.values():
            session.merge(GpuClaimRow(**(c.model_dump() | {"host": host})))
        session.flush()


def ledger() -> Ledger:
    """This host's claims as last committed (a read: it waits for no claimer)."""
    if store.missing() and not ledger_path().exists():
        return Ledger()  # nothing recorded, nothing to import: no record made
    with store.transaction(write=False) as session:
        query = select(GpuClaimRow).where(GpuClaimRow.host == this_host())
        rows = session.execute(query.order_by(GpuClaimRow.holder)).scalars()
        return Ledger(claims=_claims(list(rows)))


def claim_alive(claim: Claim) -> bool:
    """The claim's holder still runs: its process (pid and start time), or its container."""
    if claim.container:
        return container_running(claim.container)
    if claim.pid is None:
        return False
    return processes.is_same(claim.pid, claim.pid_started)


def claim(
    holder: str,
    serving: ServingConfig,
    host: list[int],
    *,
    backend: Literal["process", "docker"] = "process",
    alive: Callable[[Claim], bool] = claim_alive,
) -> list[int]:
    """Reserve GPUs for ``holder`` (held by this process until ``bind``); [] without GPUs."""
    if not host:
        return []
    with _locked() as ledger:
        ledger.claims = [c for c in ledger.claims if c.holder != holder and alive(c)]
        share = serving.gpu_memory_utilization
        chosen = choose(
            serving.gpus, serving.tp_size, host, ledger.held(), ledger.used(), share=share
        )
        me = os.getpid()
        ledger.claims.append(
            Claim(
                holder=holder,
                gpus=chosen,
                backend=backend,
                pid=me,
                pid_started=processes.start_time(me),
                share=share,
            )
        )
    return chosen


def bind(
    holder: str,
    *,
    pid: int | None = None,
    pid_started: float | None = None,
    container: str | None = None,
) -> None:
    """The running server holds the claim from now on (it outlives the pipeline process)."""
    if store.missing():
        return
    with _locked() as ledger:
        for c in ledger.claims:
            if c.holder == holder:
                c.pid, c.pid_started, c.container = pid, pid_started, container


def give_back(holder: str) -> None:
    if store.missing():
        return
    with _locked() as ledger:
        ledger.claims = [c for c in ledger.claims if c.holder != holder]
