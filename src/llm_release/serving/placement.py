"""Where measurements run side by side on a host with several GPUs (pure: no GPU, no Prefect).

The measure stage starts every contender at once; each waits for as many host slots as it
needs GPUs (``slots_for``), out of a host limit of one slot per GPU (``host_slots``), so a
candidate that needs more GPUs than are free waits, and one on a CPU host (one slot) runs
alone, as before. The GPUs themselves come from the ledger (``gpus.claim``): a slot is a
count, the ledger says which. The load test's client runs on the CPUs that go with its
GPUs (``client_cpus``), so two measurements' clients do not skew each other.
"""

from __future__ import annotations

from llm_release.config import ServingConfig


def host_slots(host_gpus: list[int]) -> int:
    """The host limit a fresh host gets: one slot per GPU, one on a CPU host."""
    return max(1, len(host_gpus))


def gpus_needed(serving: ServingConfig, host_gpus: list[int]) -> int:
    """How many GPUs a server of ``serving`` takes on this host (0 on a CPU host)."""
    if not host_gpus:
        return 0
    wanted = serving.gpus
    if wanted == "all":
        return len(host_gpus)
    if isinstance(wanted, list):
        return len(wanted)
    if wanted == "auto":
        return serving.tp_size
    return wanted


def slots_for(serving: ServingConfig, host_gpus: list[int], limit: int) -> int:
    """The host slots a measurement holds: its GPUs, one on a CPU host. Never more than the
    host's limit, which could then never be met: a server that wants more GPUs than the
    host has is refused by the ledger, with the holders named."""
    return max(1, min(gpus_needed(serving, host_gpus), limit))


def client_cpus(gpu_ids: list[int], host_gpus: list[int], cpus: list[int]) -> list[int] | None:
    """The CPUs a load test's client runs on: the host's CPUs cut into one equal share per
    GPU, and the shares of the GPUs the server holds. None (no pinning) on a CPU host, for
    a server without GPUs, or with fewer CPUs than GPUs."""
    if not host_gpus or not gpu_ids or len(cpus) < len(host_gpus):
        return None
    ordered = sorted(cpus)
    share = len(ordered) // len(host_gpus)
    chosen: list[int] = []
    for gpu in sorted(gpu_ids):
        if gpu not in host_gpus:
            continue
        at = host_gpus.index(gpu) * share
        chosen += ordered[at : at + share]
    return chosen or None
