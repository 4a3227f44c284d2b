"""The fleet: GPU hosts as workers of the project's Prefect work pool (issue 37, item 1).

A host joins by declaring itself and running a worker on a work queue of its own:

- its **card** (a Prefect Variable ``llm_release_host_<name>``): its GPUs, each with its
  memory, read by the code the planner reads a host with (``gpus.host_gpus``,
  ``hardware.gpu_memory_gib``), or stated by the operator for a host being prepared;
- its **queue** (``host-<name>`` in the ``llm-release`` work pool), whose description says
  the same in words, so the Prefect UI's work-pool page lists the hosts and their workers;
- its **worker** (``LLM_RELEASE_HOST_NAME=<name> prefect worker start --pool llm-release
  --work-queue host-<name> --name <name>``): a flow run placed on the host's queue runs there
  and nowhere else;
- its **slots**: the Prefect limit ``llm-release-host-<name>``, one slot per GPU (one
  without), that the runs of its worker take (``tasks/slots.py``: the worker's
  ``LLM_RELEASE_HOST_NAME`` names it), so hosts sharing one Prefect server count their own
  GPUs.

Why a queue per host and not tags or job variables: a work queue is what a Prefect worker
polls, so a run sent to ``host-<name>`` (``run_deployment(..., work_queue_name=...)``) is
picked up by that host's worker alone; tags only label runs, and job variables configure
the run a worker already took. The pool's default queue stays for runs that may go
anywhere. ``python -m flows.fleet list`` shows the fleet: each host's GPUs, its worker's
status and last heartbeat (Prefect's own record of its workers).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

import httpx
from tabulate import tabulate

from llm_release.errors import ConfigError, ReleaseError
from llm_release.fleet import (
    GPU_NAME,
    POOL,
    QUEUE_PREFIX,
    VARIABLE_PREFIX,
    GpuCard,
    HostCard,
    HostView,
    checked_name,
)


def read_card(
    name: str, gpus: int | None, gpu_memory_gib: float | None, gpu_name: str = ""
) -> HostCard:
    """This host's card: its GPUs as the planner reads them, or as stated (``gpus`` GPUs of
    ``gpu_memory_gib`` each, named ``gpu_name``, for a host being prepared, or one whose
    nvidia-smi is not the one its servers will see)."""
    checked_name(name)
    now = datetime.now(UTC)
    if gpus is not None or gpu_memory_gib is not None:
        if gpus is None or gpu_memory_gib is None or gpus < 0 or gpu_memory_gib <= 0:
            raise ConfigError(
                "--gpus and --gpu-memory-gib go together: a count and each GPU's memory",
                hint="e.g. --gpus 8 --gpu-memory-gib 80 (or neither: read with nvidia-smi)",
            )
        if not GPU_NAME.fullmatch(gpu_name):
            raise ConfigError(
                f"--gpu-name {ascii(gpu_name[:60])} is not a GPU's name",
                hint="printable ASCII, at most 100 characters, as CUDA gives it: e.g. "
                "'NVIDIA A100-SXM4-80GB'",
            )
        cards = [GpuCard(index=i, memory_gib=gpu_memory_gib, name=gpu_name) for i in range(gpus)]
        return HostCard(name=name, gpus=cards, source="stated", declared_at=now)
    from llm_release.hardware import gpu_memory_gib as memory_of
    from llm_release.hardware import gpu_names
    from llm_release.serving.gpus import host_gpus

    names = gpu_names()
    cards = [
        GpuCard(
            index=i,
            memory_gib=round(memory_of(i) or 0, 2),
            name=names[i] if i < len(names) and GPU_NAME.fullmatch(names[i]) else "",
        )
        for i in host_gpus()
    ]
    return HostCard(
        name=name, gpus=[c for c in cards if c.memory_gib > 0], source="nvidia-smi", declared_at=now
    )


def join(card: HostCard) -> tuple[str, int]:
    """Declare ``card``'s host to the Prefect API: the pool (made when missing), the host's
    queue with its description, its slot limit (one slot per GPU; an existing one is left as
    the operator set it), its card, and the fleet's watch on lost measure runs
    (tasks/lost_runs.py); the queue's name (what its worker polls) and the host's slots in
    force."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.variables import Variable

    queue = QUEUE_PREFIX + card.name
    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(POOL)
        except ObjectNotFound:
            try:
                client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
            except ObjectAlreadyExists:
                pass  # another host made it meanwhile
        try:
            client.create_work_queue(queue, description=card.describe(), work_pool_name=POOL)
        except ObjectAlreadyExists:
            (found,) = [q for q in client.read_work_queues(work_pool_name=POOL) if q.name == queue]
            client.update_work_queue(found.id, description=card.describe())
    from tasks.lost_runs import ensure_lost_run_watch
    from tasks.slots import ensure_host_limit

    slots = ensure_host_limit(card.slots, host=card.name)
    ensure_lost_run_watch()
    Variable.set(VARIABLE_PREFIX + card.name, card.model_dump(mode="json"), overwrite=True)
    return queue, slots


def hosts() -> list[HostView]:
    """Every host of the fleet: the pool's host queues, each with its card and its worker."""
    from prefect.client.orchestration import get_client

    from tasks.fleet import card_of, host_limits, host_queues

    names = host_queues()
    if not names:
        return []
    with get_client(sync_client=True) as client:
        workers = {w.name: w for w in client.read_workers_for_work_pool(POOL)}
        limits = host_limits(client, names)
    views = []
    for name in names:
        card = card_of(name)  # a variable anyone with the API can edit: None if invalid
        worker = workers.get(name)
        views.append(
            HostView(
                name=name,
                queue=QUEUE_PREFIX + name,
                gpus=len(card.gpus) if card else 0,
                gpu_memory_gib=sorted({g.memory_gib for g in card.gpus}) if card else [],
                slots=limits[name].limit if limits[name] is not None else None,
                worker=worker.status.value if worker else "none",
                last_heartbeat=worker.last_heartbeat_time if worker else None,
            )
        )
    return views


def table(views: list[HostView]) -> str:
    rows = [
        [
            v.name,
            v.queue,
            v.gpus,
            ", ".join(f"{m:g}" for m in v.gpu_memory_gib) or "-",
            "-" if v.slots is None else v.slots,
            v.worker,
            v.last_heartbeat.strftime("%Y-%m-%d %H:%M:%S UTC") if v.last_heartbeat else "-",
        ]
        for v in views
    ]
    headers = ["host", "queue", "GPUs", "GiB each", "slots", "worker", "last heartbeat"]
    return tabulate(rows, headers=headers) if rows else "no host has joined the fleet"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.fleet", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    joining = sub.add_parser("join", help="declare this host (its card and queue)")
    joining.add_argument("name", help="the host's name: its queue is host-NAME")
    joining.add_argument("--gpus", type=int, help="GPUs stated (else read with nvidia-smi)")
    joining.add_argument("--gpu-memory-gib", type=float, help="each stated GPU's memory")
    joining.add_argument(
        "--gpu-name",
        default="",
        help="each stated GPU's name as CUDA gives it, e.g. 'NVIDIA A100-SXM4-80GB' (vLLM "
        "gives an A100 smaller batch defaults)",
    )
    listing = sub.add_parser("list", help="the fleet: hosts, GPUs, workers")
    listing.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    try:
        if args.command == "join":
            card = read_card(args.name, args.gpus, args.gpu_memory_gib, args.gpu_name)
            from tasks.slots import limit_name

            queue, slots = join(card)
            print(f"{card.describe()}; queue {queue} of pool {POOL}")
            limit = limit_name(card.name)
            print(
                f"slots: {limit} = {slots}"
                + (
                    f" (kept as it was set; the card has {card.slots} slot(s): "
                    f"'prefect gcl update {limit} --limit {card.slots}' to follow it)"
                    if slots != card.slots
                    else ""
                )
            )
            print(
                f"start its worker: LLM_RELEASE_HOST_NAME={card.name} prefect worker start "
                f"--pool {POOL} --work-queue {queue} --name {card.name}"
            )
            return 0
        views = hosts()
    except ReleaseError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except httpx.HTTPError as exc:  # no server there, or it refused the credentials
        from prefect.settings import PREFECT_API_URL

        print(
            f"error: the Prefect API at {PREFECT_API_URL.value()} did not answer: "
            f"{' '.join(str(exc).split())[:200]} (how to fix: 'make prefect-up', and "
            "PREFECT_API_URL and PREFECT_API_AUTH_STRING as the Makefile sets them)",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps([v.model_dump(mode="json") for v in views], indent=2))
    else:
        print(table(views))
    return 0


if __name__ == "__main__":
    sys.exit(main())
