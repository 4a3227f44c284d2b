"""The drain: a server leaves the router before it stops, and stops only once nothing is in
flight on it — HAProxy's sessions on its slot and vLLM's running and waiting requests both
read 0 — or at a deadline, saying whether requests were cut (``DrainResult``). Rollback and
promote (``promote.py``) drain the server they retire.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

import requests
from pydantic import BaseModel, ConfigDict, Field

from llm_release import server_key
from llm_release.canary import prometheus
from llm_release.canary.router import Router
from llm_release.errors import RouterError
from llm_release.registry import Release
from llm_release.serving import backends

# How often a drain looks at the in-flight counts (HAProxy's socket and vLLM's /metrics).
DRAIN_POLL_S = 0.25
# vLLM's gauges of the requests it is running and has queued (one series per model name).
IN_FLIGHT_GAUGES = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})

logger = logging.getLogger(__name__)


def running_requests(release: Release, timeout_s: float = 5) -> float | None:
    """In-flight plus queued requests on a vLLM server, from its Prometheus metrics; None
    when they cannot be read (no answer, an error status, a page that does not parse, or no
    such gauge in the answer): an unreadable count is unknown, never 0."""
    try:
        response = requests.get(
            f"http://127.0.0.1:{release.port}/metrics",
            headers=server_key.headers(),
            timeout=timeout_s,
        )
    except requests.RequestException:
        return None
    if response.status_code != 200:
        return None
    try:
        counts = prometheus.scraped_values(response.text, IN_FLIGHT_GAUGES)
    except ValueError:  # a page that does not parse counts nothing we can trust
        return None
    return sum(counts) if counts else None


def router_in_flight(router: Router | None, slot: str | None, port: int) -> int | None:
    """HAProxy's requests in flight on ``slot``; 0 when no HAProxy runs (nothing can be in
    flight through it); None when one runs but its runtime API does not answer."""
    if router is None or slot is None or router.pid() is None:
        return 0
    try:
        return router.in_flight(slot, port)
    except (RouterError, OSError):
        return None


class DrainResult(BaseModel):
    """How a server left: ``drained`` (both in-flight counts read 0, or it had exited),
    ``busy`` (requests still in flight at the deadline) or ``unknown`` (a count could not be
    read at the deadline: nobody confirmed the server was empty). It is stopped in every
    case; only ``drained`` means no request was cut."""

    model_config = ConfigDict(extra="forbid")

    release_id: str
    outcome: Literal["drained", "busy", "unknown"]
    waited_s: float
    router_in_flight: int | None = Field(description="HAProxy's last count; None: unreadable")
    server_in_flight: float | None = Field(description="vLLM's last count; None: unreadable")
    detail: str

    @property
    def confirmed_empty(self) -> bool:
        return self.outcome == "drained"


def _count(value: float | None) -> str:
    return "unknown" if value is None else f"{value:g}"


def drain_and_stop(
    release: Release,
    timeout_s: float = 120,
    *,
    router: Router | None = None,
    slot: str | None = None,
) -> DrainResult:
    """Stop ``release``'s server once nothing is in flight on it, and say how it went.

    The caller took it out of the rotation first (``Router.drain``). Nothing in flight
    means HAProxy's sessions on ``slot`` (a request it assigned but vLLM has not seen
    yet) and vLLM's running + waiting requests (also those that came around the router)
    both read 0. A count that cannot be read is unknown, not 0: the drain waits to its
    deadline. After ``timeout_s`` the server is stopped all the same, and the result says
    whether requests were still in flight (``busy``) or nobody could tell (``unknown``).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    lb: int | None = None
    vllm: float | None = None
    # The record's port is input: one another process holds is not asked (its /metrics
    # read carries the servers' key), and nothing confirms an empty server there.
    foreign = backends.port_problems(release)
    while True:
        if foreign:
            outcome = "unknown"
            detail = (
                f"its recorded {'; '.join(foreign)}, not its server: not asked for its "
                "requests (the servers' key is not sent there)"
            )
            logger.warning("%s: %s; stopping it all the same", release.release_id, detail)
            break
        if not backends.release_alive(release):
            outcome, detail = "drained", "its server had already exited"
            break
        lb = router_in_flight(router, slot, release.port)
        remaining = deadline - time.monotonic()
        vllm = running_requests(release, timeout_s=min(5.0, max(0.5, remaining)))
        if lb == 0 and vllm == 0:
            outcome, detail = "drained", "HAProxy and the server counted no request in flight"
            break
        if time.monotonic() >= deadline:
            outcome = "unknown" if lb is None or vllm is None else "busy"
            counts = f"HAProxy {_count(lb)}, server {_count(vllm)}"
            if outcome == "unknown":
                detail = (
                    f"could not confirm an empty server in {timeout_s:.0f} s ({counts}): "
                    "stopped without knowing whether requests were cut"
                )
            else:
                detail = f"requests still in flight after {timeout_s:.0f} s ({counts})"
            logger.warning("%s: %s; stopping it all the same", release.release_id, detail)
            break
        time.sleep(DRAIN_POLL_S)
    backends.stop_release(release)
    return DrainResult(
        release_id=release.release_id,
        outcome=outcome,
        waited_s=round(time.monotonic() - started, 2),
        router_in_flight=lb,
        server_in_flight=vllm,
        detail=detail,
    )
