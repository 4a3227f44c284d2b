"""The fleet's records, read by the plan stage and the fleet's CLI alike (no Prefect here):
a host's card (what it declares of itself when it joins: its GPUs and their memory), and a
host as the fleet sees it. ``flows/fleet.py`` joins and lists hosts through Prefect;
``tasks/fleet.py`` reads their cards for a release."""

from __future__ import annotations

import re
from datetime import datetime

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
