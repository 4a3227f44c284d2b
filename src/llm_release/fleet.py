"""The fleet's records, read by the plan stage and the fleet's CLI alike (no Prefect here):
a host's card (what it declares of itself when it joins: its GPUs and their memory), a host
as the fleet sees it, and where the measure stage measures each contender (``place``: a pure
policy; the release reads the fleet and sends the contenders, ``flows/release.py``).
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
MAX_GPUS = 1024


class GpuCard(BaseModel):
    model_config = ConfigDict(extra="forbid")

    index: int = Field(ge=0, lt=MAX_GPUS)
    memory_gib: float = Field(gt=0, le=4096)


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
        description="contenders no host they fit had a free slot for: queued where they "
        "wait on that host's own slots (home, when they fit there)",
    )
    spare: dict[str, list[str]] = Field(
        default_factory=dict,
        description="a contender sent away: the other hosts it fits, most free slots first, "
        "then home when it fits there (through its own queue), to measure it on if its host "
        "is lost",
    )

    def at_home(self, name: str) -> bool:
        return self.hosts[name] == self.home

    def away(self) -> dict[str, str]:
        """The contenders measured on another host, with their host."""
        return {name: host for name, host in self.hosts.items() if host != self.home}


def _most_free(hosts: Sequence[str], free: Mapping[str, int]) -> str:
    """The host with the most free slots, ties by name."""
    return min(hosts, key=lambda h: (-free.get(h, 0), h))


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
    waits on home's own slots), else the host it fits with the most free slots. One that fits
    no host is a ``ConfigError``: the plan stage refuses such a release."""
    left = {host: max(0, count) for host, count in free.items()}
    hosts: dict[str, str] = {}
    queued: list[str] = []
    spare: dict[str, list[str]] = {}
    for seat in contenders:
        if seat.role == "champion" or seat.settled:
            hosts[seat.name] = home
            if not seat.settled:
                left[home] = left.get(home, 0) - seat.needs(home)
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
        open_hosts = [h for h in fitting if h != home and left.get(h, 0) >= seat.needs(h)]
        if home in fitting and left.get(home, 0) >= seat.needs(home):
            where = home
        elif open_hosts:
            where = _most_free(open_hosts, left)
        else:
            where = home if home in fitting else _most_free(fitting, left)
            queued.append(seat.name)
        hosts[seat.name] = where
        left[where] = left.get(where, 0) - seat.needs(where)
        if where != home:
            others = [h for h in fitting if h not in (where, home)]
            # home last: in a fleet of two, the host that is left is home, and a lost
            # contender that fits there is measured there rather than failed
            spare[seat.name] = sorted(others, key=lambda h: (-left.get(h, 0), h)) + (
                [home] if home in fitting else []
            )
    return Placement(
        home=home,
        hosts={seat.name: hosts[seat.name] for seat in contenders},
        queued=queued,
        spare=spare,
    )
