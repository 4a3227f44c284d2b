"""The fleet's records, read by the plan stage and the fleet's CLI alike (no Prefect here):
a host's card (what it declares of itself when it joins: its GPUs and their memory), a host
as the fleet sees it, and where the measure stage measures each contender (``place``: a pure
policy; the release reads the fleet and sends the contenders, ``flows/release.py``), and
where a contender queued at home goes once a host frees a slot (``seat_queued``).
``flows/fleet.py`` joins and lists hosts through Prefect; ``tasks/fleet.py`` reads their
cards and free slots for a release."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llm_release.errors import ConfigError

POOL = "llm-release"
QUEUE_PREFIX = "host-"
VARIABLE_PREFIX = "llm_release_host_"
# A host's name: a queue, a worker and a Prefect variable are named after it.
HOST_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
GPU_NAME = re.compile(r"[ -~]{0,100}")  # printable ASCII, as CUDA names its devices
MAX_GPUS = 1024


class GpuCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, lt=MAX_GPUS)
    memory_gib: float = Field(gt=0, le=4096)
    name: str = Field(
        "",
        pattern=f"^{GPU_NAME.pattern}$",
        description="the GPU's name as CUDA gives it ('' where stated without one): vLLM "
        "gives an A100 smaller batch defaults than other GPUs of its memory",
    )


class HostCard(BaseModel):
    """What a host declares of itself when it joins."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=HOST_NAME.pattern, max_length=40)
    gpus: list[GpuCard] = Field(default_factory=list, max_length=MAX_GPUS)
    source: str = Field(description="'nvidia-smi' (read on the host) or 'stated'")
    declared_at: datetime

    @property
    def slots(self) -> int:
        """Its host slots: one per GPU, one without a GPU."""
        return max(1, len(self.gpus))

    def describe(self) -> str:
        if not self.gpus:
            return f"llm-release host {self.name}: no GPU ({self.source})"
        sizes = sorted({g.memory_gib for g in self.gpus})
        memory = " / ".join(f"{s:.1f} GiB" for s in sizes)
        return f"llm-release host {self.name}: {len(self.gpus)} GPU × {memory} ({self.source})"


class HostView(BaseModel):
    """A host as the fleet sees it now: its card and its worker's state."""

    name: str
    queue: str
    gpus: int
    gpu_memory_gib: list[float]
    slots: int | None = Field(description="its slot limit now (None: missing)")
    worker: str = Field(description="ONLINE, OFFLINE, or 'none' (no worker has polled)")
    last_heartbeat: datetime | None = None


def checked_name(name: str) -> str:
    if not HOST_NAME.fullmatch(name or ""):
        shown = ascii(name[:60]) + ("..." if len(name) > 60 else "")
        raise ConfigError(
            f"host name {shown} is not a host name",
            hint="use a lower-case letter, then lower-case letters, digits or '_' "
            "(at most 40): it names the host's work queue, worker and card",
        )
    return name


def wrong_home(queue: str | None, own: str | None) -> str | None:
    """Why a release run must not go on here, or None: a run sent to host X's queue
    (``host-X``, ``flows.release --deployment --home X``) pinned X as its home, and the worker
    that took it is not X (another name, or none: a default worker polling every queue)."""
    if not queue or not queue.startswith(QUEUE_PREFIX):
        return None
    sent = queue.removeprefix(QUEUE_PREFIX)
    if sent == own:
        return None
    here = f"host {own!r}" if own else "a worker with no LLM_RELEASE_HOST_NAME"
    return f"this run was sent to host {sent!r} (queue {queue}) but {here} took it"


# ---------------------------------------------------------------- where each contender is measured


class Seat(BaseModel):
    """A contender as placement sees it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    role: Literal["champion", "baseline", "quantized"]
    slots: int = Field(1, ge=1, description="the host slots its measurement holds")
    slots_on: dict[str, int] = Field(
        default_factory=dict,
        description="the slots it holds on a host whose GPUs make that another count than "
        "``slots`` (a server on every GPU holds as many slots as its host has GPUs)",
    )
    settled: bool = Field(
        False, description="its result is known already (skipped, failed to build): no GPU"
    )

    def needs(self, host: str) -> int:
        """The slots its measurement holds on ``host``."""
        return max(1, self.slots_on.get(host, self.slots))


class Placement(BaseModel):
    """Where each contender is measured: ``home`` (the host that runs the release) or
    another host of the fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    home: str
    hosts: dict[str, str] = Field(description="contender: the host that measures it")
    queued: list[str] = Field(
        default_factory=list,
        description="contenders no host they fit had a free slot for: queued home when they "
        "fit there (``waiting``), else where they wait on that host's own slots",
    )
    spare: dict[str, list[str]] = Field(
        default_factory=dict,
        description="a contender sent away: the other hosts it fits, most free slots first, "
        "then home when it fits there (through its own queue), to measure it on if its host "
        "is lost",
    )
    waiting: list[Seat] = Field(
        default_factory=list,
        description="the contenders queued at home, in order: each goes to the first host it "
        "fits that frees the slots it needs (``seat_queued``)",
    )
    fits: dict[str, list[str]] = Field(
        default_factory=dict, description="a waiting contender: the hosts it fits"
    )
    read: dict[str, int] = Field(
        default_factory=dict, description="each host's free slots as last read"
    )
    left: dict[str, int] = Field(
        default_factory=dict,
        description="each host's free slots at that read once the seated contenders have "
        "taken theirs (never below 0): what the waiting ones may take",
    )

    def at_home(self, name: str) -> bool:
        return self.hosts[name] == self.home

    def away(self) -> dict[str, str]:
        """The contenders measured on another host, with their host."""
        return {name: host for name, host in self.hosts.items() if host != self.home}


def _most_free(hosts: Sequence[str], free: Mapping[str, int]) -> str:
    """The host with the most free slots, ties by name."""
    return min(hosts, key=lambda h: (-free.get(h, 0), h))


def _spare(fitting: Sequence[str], where: str, home: str, free: Mapping[str, int]) -> list[str]:
    """The hosts to measure a contender sent to ``where`` on should ``where`` be lost: the
    other hosts it fits, most free slots first (ties by name), then home when it fits there
    (in a fleet of two, the host that is left is home: a lost contender that fits there is
    measured there rather than failed)."""
    others = [h for h in fitting if h not in (where, home)]
    return sorted(others, key=lambda h: (-free.get(h, 0), h)) + ([home] if home in fitting else [])


def seat_now(seat: Seat, fits: Sequence[str], home: str, free: Mapping[str, int]) -> str | None:
    """Where ``seat`` is measured with ``free`` slots on each host: home when it fits there
    and home has the slots it needs, else the host it fits with the most free slots among
    those that have the slots it needs there (``Seat.needs``; ties by name). None: no host it
    fits has them now."""
    fitting = sorted(set(fits))
    if home in fitting and free.get(home, 0) >= seat.needs(home):
        return home
    open_hosts = [h for h in fitting if h != home and free.get(h, 0) >= seat.needs(h)]
    return _most_free(open_hosts, free) if open_hosts else None


def place(
    contenders: Sequence[Seat],
    home: str,
    fits: Mapping[str, Sequence[str]],
    free: Mapping[str, int],
) -> Placement:
    """Where each contender is measured (pure, deterministic: the same input gives the same
    placement whatever the order of ``fits``' and ``free``'s keys).

    ``fits``: each contender's hosts whose card fits its model (home among them when it fits
    there); ``free``: each host's free slots now; a seat's slots are counted on each host
    with that host's GPUs (``Seat.needs``). The champion serves users from home and its
    folder is home's, and a settled contender takes no GPU: both stay home. Every other one,
    in the given order, goes home while home has the free slots it needs, else to the host it
    fits with the most free slots (ties by name), whose free slots it then takes. One that
    fits some host but finds no free slot anywhere is queued: home when it fits there (it
    waits there, in ``waiting``, for the first host it fits to free a slot: ``seat_queued``),
    else the host it fits with the most free slots. One that fits no host is a
    ``ConfigError``: the plan stage refuses such a release."""
    read = {host: max(0, count) for host, count in free.items()}
    left = dict(read)
    held = dict.fromkeys(read, 0)  # the slots the seated (not queued) contenders take
    hosts: dict[str, str] = {}
    queued: list[str] = []
    waiting: list[Seat] = []
    fits_of: dict[str, list[str]] = {}
    spare: dict[str, list[str]] = {}
    for seat in contenders:
        if seat.role == "champion" or seat.settled:
            hosts[seat.name] = home
            if not seat.settled:
                left[home] = left.get(home, 0) - seat.needs(home)
                held[home] = held.get(home, 0) + seat.needs(home)
    for seat in contenders:
        if seat.name in hosts:
            continue
        fitting = sorted(set(fits.get(seat.name, ())))
        if not fitting:
            raise ConfigError(
                f"contender {seat.name} fits no host of the fleet: it cannot be measured",
                hint="the plan stage refuses a release that fits no host; start the release "
                "again, or join a host with more GPU memory ('make fleet-join')",
            )
        where = seat_now(seat, fitting, home, left)
        if where is None:
            where = home if home in fitting else _most_free(fitting, left)
            queued.append(seat.name)
            if where == home:
                waiting.append(seat)
                fits_of[seat.name] = fitting
        else:
            held[where] = held.get(where, 0) + seat.needs(where)
        hosts[seat.name] = where
        left[where] = left.get(where, 0) - seat.needs(where)
        if where != home:
            spare[seat.name] = _spare(fitting, where, home, left)
    return Placement(
        home=home,
        hosts={seat.name: hosts[seat.name] for seat in contenders},
        queued=queued,
        spare=spare,
        waiting=waiting,
        fits=fits_of,
        read=read,
        left={host: max(0, read.get(host, 0) - held[host]) for host in sorted(held)},
    )


def seat_queued(placed: Placement, now: Mapping[str, int], ended: int = 0) -> Placement:
    """``placed`` after the fleet's free slots were read again (``now``; pure).

    The slots its waiting contenders may take on a host are what was left for them at the
    last read (``placed.left``), plus what the host freed since (its count risen over
    ``placed.read``), plus at home ``ended``, the slots of home's own measurements that ended
    since (one whose result was reused never took its slots), never more than the host has
    free now. A count that falls is a seated measurement taking the slots it was given
    (already out of ``left``) or another run's: either way a contender seated or sent
    moments ago is not counted twice. Each waiting contender, in order, then goes where
    ``seat_now`` puts it (home first), off the queue (with its spare hosts, as ``place`` gives
    them, when it goes elsewhere), and takes its slots there; the rest wait on."""
    home = placed.home
    free: dict[str, int] = {}
    for host, count in now.items():
        risen = max(0, count - placed.read.get(host, count))
        back = ended if host == home else 0
        free[host] = max(0, min(count, placed.left.get(host, 0) + risen + back))
    hosts, spare = dict(placed.hosts), dict(placed.spare)
    seated: set[str] = set()
    for seat in placed.waiting:
        fitting = placed.fits.get(seat.name, [])
        where = seat_now(seat, fitting, home, free)
        if where is None:
            continue
        seated.add(seat.name)
        hosts[seat.name] = where
        free[where] -= seat.needs(where)
        if where != home:
            spare[seat.name] = _spare(fitting, where, home, free)
    return placed.model_copy(
        update={
            "hosts": hosts,
            "spare": spare,
            "queued": [name for name in placed.queued if name not in seated],
            "waiting": [seat for seat in placed.waiting if seat.name not in seated],
            "fits": {name: f for name, f in placed.fits.items() if name not in seated},
            "read": dict(now),
            "left": free,
        }
    )
