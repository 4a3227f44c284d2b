"""vLLM's prefix-cache hit rate at each load level: what a shared system prompt buys.

vLLM counts, per engine, the prompt tokens it looked up in its prefix cache and the ones it
found (``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total`` at
``/metrics``, ``vllm/v1/metrics/loggers.py``). GuideLLM runs every level in one process, so
the counters are read every ``INTERVAL_S`` while it runs (``CacheSampler``, a thread) and
each level's rate is the counters' growth between the last reading answered before its first
request and the first one asked for after its last (``hit_rate``): a page's counters are of
some moment between the asking and the answer, and on a loaded machine the answer can come
a second after the asking, so a reading only closes a level that was over when it was asked
for (one that closed it on its answer once counted 2 of a level's 6 requests). Parsed with prometheus_client's
own text parser. A server that exposes no such counters (not vLLM, or caching off) gives
None, never a made-up 0.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import requests

from llm_release import server_key

QUERIES = "vllm:prefix_cache_queries"
HITS = "vllm:prefix_cache_hits"
INTERVAL_S = 0.5


@dataclass(frozen=True)
class Reading:
    asked: float  # time.time() when the page was asked for: its counters are of this or later
    answered: float  # time.time() when it came: its counters are of this or earlier
    queries: float
    hits: float


def parse_counters(page: str) -> tuple[float, float] | None:
    """(queries, hits) summed over the page's engines; None when the page has neither."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        if family.name not in (QUERIES, HITS):
            continue
        for sample in family.samples:
            if sample.name == f"{family.name}_total":
                totals[family.name] = totals.get(family.name, 0.0) + sample.value
    if QUERIES not in totals or HITS not in totals:
        return None
    return totals[QUERIES], totals[HITS]


def read(base_url: str, timeout_s: float = 2.0) -> Reading | None:
    asked = time.time()
    try:
        reply = requests.get(f"{base_url}/metrics", headers=server_key.headers(), timeout=timeout_s)
        counters = parse_counters(reply.text) if reply.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None
    return Reading(asked, time.time(), *counters) if counters else None


class CacheSampler:
    """Reads the counters of the server at ``base_url`` every ``interval_s`` while in use."""

    def __init__(self, base_url: str, interval_s: float = INTERVAL_S) -> None:
        self.base_url = base_url
        self.interval_s = interval_s
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prefix-cache", daemon=True)

    def _run(self) -> None:
        while True:
            reading = read(self.base_url)
            if reading is not None:
                self.readings.append(reading)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> CacheSampler:
        self._thread.start()
        return self

    def take(self) -> None:
        """A reading now (after a run of GuideLLM: its last level's requests are done)."""
        reading = read(self.base_url)
        if reading is not None:
            self.readings.append(reading)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def hit_rate(readings: list[Reading], start: float, end: float) -> float | None:
    """The share of prompt tokens found in the cache between ``start`` and ``end``: from
    the last reading answered at or before ``start`` to the first asked for at or after
    ``end``. None when the readings do not bracket the window or no prompt token was looked
    up."""
    before = [r for r in readings if r.answered <= start]
    after = [r for r in readings if r.asked >= end]
    if not before or not after:
        return None
    first = max(before, key=lambda r: r.answered)
    last = min(after, key=lambda r: r.asked)
    queries = last.queries - first.queries
    if queries <= 0:
        return None
    return max(0.0, min(1.0, (last.hits - first.hits) / queries))
