"""The canary's quality check: the same questions to canary and stable, scored alike.

Latency and errors say nothing of what a release answers: a canary whose chat template
broke, or that stopped refusing what it must refuse, is as fast as before. So after every
analysis window the canary and the stable release answer the same probe set, and each
critical slice of the eval sets compares the two.

- The probe set: ``quality_probe_items`` items of each critical eval set (operator
  setting), sampled with a seed derived from the release id, so every window of a release
  asks the same questions. Each slice tag of a set gets ``quality_probe_min_items`` of its
  items first, where the set has them, so that the set's own slices can be judged.
- The prompt is the set's ``doc_to_text``, the decoding ``eval_sets/decoding.yaml`` (the
  offline evaluation's); each answer is scored with the set's own metrics
  (``evaluation.metrics``). Nothing here invents a score.
- A slice is a metric of a critical set (all its items) or one of its ``slices`` (items of
  one tag), with the set's ``max_drop``. Over the items both releases answered, the drop is
  the stable's mean minus the canary's (paired, with the set's bootstrap confidence). It
  fails when the drop exceeds the margin and its interval lies above zero: a handful of
  items cannot fail a release by the luck of the draw, a broken one fails at once. A drop
  beyond the margin within noise is inconclusive, never a pass (the same items come back
  every window); so are fewer than ``quality_probe_min_items`` items answered by both.

The sending (``send_probes``) goes through the load balancer with ``router.PIN_HEADER``, so
the probes take the path users take, and HAProxy counts them apart (backend ``probes``).
The flow sends them after a window ends, so the window's vLLM numbers hold none of them.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import requests
from pydantic import BaseModel, ConfigDict, Field

from llm_release.canary.router import ANSWERED_BY_HEADER, PIN_HEADER
from llm_release.errors import EvalError
from llm_release.evaluation import evalsets, metrics
from llm_release.evaluation.evaluate import load_decoding
from llm_release.evaluation.items import chat_messages, load_items
from llm_release.evaluation.stats import paired_drop_ci

log = logging.getLogger(__name__)

ROLES = ("stable", "canary")
CHECK_PREFIX = "quality"
# Scores equal within this are equal (means of 0/1 scores).
EPS = 1e-9


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProbeItem(StrictModel):
    eval_set: str
    id: str
    tags: list[str]
    messages: list[dict[str, str]]
    doc: dict = Field(description="the item as the eval set holds it; the metrics read it")

    @property
    def key(self) -> str:
        return f"{self.eval_set}/{self.id}"


class Slice(StrictModel):
    """A critical slice: one metric of one critical eval set, on all its items or on the
    items of one tag, with the set's margin."""

    eval_set: str
    metric: str
    tag: str | None = None
    max_drop: float
    higher_is_better: bool = True
    confidence: float = 0.95

    @property
    def name(self) -> str:
        where = f"{self.eval_set}[{self.tag}]" if self.tag else self.eval_set
        return f"{CHECK_PREFIX} {where} {self.metric}"


class ProbeSet(StrictModel):
    release_id: str
    seed: int
    items: list[ProbeItem]
    slices: list[Slice]
    decoding: dict


class SliceScore(StrictModel):
    """One slice's numbers in one window."""

    slice: str
    items: int = Field(description="items of the slice in the probe set")
    answered: int = Field(description="of them, answered by canary and stable alike")
    canary: float | None
    stable: float | None
    drop: float | None
    ci_low: float | None
    ci_high: float | None
    max_drop: float
    outcome: str
    reason: str


class ProbeRun(StrictModel):
    """What one window's probes sent and got back, per role."""

    sent: dict[str, int]
    answered: dict[str, int]
    errors: dict[str, list[str]] = Field(default_factory=dict)
    seconds: float = Field(0.0, description="how long the window's probes took, all told")
    answers: dict[str, dict[str, str | None]] = Field(
        default_factory=dict, description="role -> item key -> answer text (None: no answer)"
    )


# -- the probe set ---------------------------------------------------------------------------
def probe_seed(release_id: str) -> int:
    """The seed of a release's probe set: the same release, the same questions."""
    return int.from_bytes(hashlib.sha256(release_id.encode()).digest()[:8], "big")


def sample(
    items: list[dict], n: int, *, tags: list[str], min_per_tag: int, rng: np.random.Generator
) -> list[dict]:
    """``n`` of ``items`` (all, when fewer), in a random order that ``rng`` fixes: first
    ``min_per_tag`` items of each tag in ``tags`` (where there are that many), then the rest."""
    order = [items[i] for i in rng.permutation(len(items))]
    chosen: list[dict] = []
    for tag in tags:
        have = sum(1 for item in chosen if tag in (item.get("tags") or []))
        for item in order:
            if have >= min_per_tag or len(chosen) >= n:
                break
            if tag in (item.get("tags") or []) and item not in chosen:
                chosen.append(item)
                have += 1
    for item in order:
        if len(chosen) >= n:
            break
        if item not in chosen:
            chosen.append(item)
    return chosen


def slices_of(eval_set: evalsets.EvalSet) -> list[Slice]:
    gates = eval_set.gates
    common = {"eval_set": eval_set.name, "confidence": gates.confidence}
    found = [
        Slice(
            metric=name,
            max_drop=gate.max_drop if gate.max_drop is not None else 0.0,
            higher_is_better=metrics.get(name).higher_is_better,
            **common,
        )
        for name, gate in gates.metrics.items()
        if name in eval_set.metric_names
    ]
    found += [
        Slice(
            metric=s.metric,
            tag=s.tag,
            max_drop=s.max_drop if s.max_drop is not None else 0.0,
            higher_is_better=metrics.get(s.metric).higher_is_better,
            **common,
        )
        for s in gates.slices
    ]
    return found


def build_probe_set(
    release_id: str, *, items_per_set: int, min_per_slice: int, names: list[str] | None = None
) -> ProbeSet:
    """The release's probe set from the critical eval sets (``names``: of these only)."""
    seed = probe_seed(release_id)
    rng = np.random.default_rng(seed)
    probe_items: list[ProbeItem] = []
    slices: list[Slice] = []
    for name in names if names is not None else evalsets.available():
        eval_set = evalsets.load_eval_set(name)
        if not eval_set.gates.critical:
            continue
        set_slices = slices_of(eval_set)
        tags = sorted({s.tag for s in set_slices if s.tag})
        chosen = sample(
            load_items(eval_set),
            items_per_set,
            tags=tags,
            min_per_tag=min_per_slice,
            rng=rng,
        )
        for item in chosen:
            doc = {k: v for k, v in item.items() if k != "_line"}
            probe_items.append(
                ProbeItem(
                    eval_set=name,
                    id=str(item["id"]),
                    tags=list(item.get("tags") or []),
                    messages=chat_messages(eval_set, item),
                    doc=doc,
                )
            )
        slices += set_slices
    if not slices:
        raise EvalError(
            "no critical eval set to probe the canary with",
            hint="mark an eval set critical (gates.critical: true in its task.yaml)",
        )
    return ProbeSet(
        release_id=release_id, seed=seed, items=probe_items, slices=slices, decoding=load_decoding()
    )


# -- the policy ------------------------------------------------------------------------------
def score_answers(
    probe_set: ProbeSet, answers: dict[str, str | None]
) -> dict[str, dict[str, float]]:
    """item key -> metric -> score, by the eval set's own metrics; unanswered items left out."""
    names = {s.eval_set: set() for s in probe_set.slices}
    for s in probe_set.slices:
        names[s.eval_set].add(s.metric)
    scored: dict[str, dict[str, float]] = {}
    for item in probe_set.items:
        answer = answers.get(item.key)
        if answer is None:
            continue
        scored[item.key] = {
            m: float(metrics.get(m).score(item.doc, answer)) for m in sorted(names[item.eval_set])
        }
    return scored


def judge_slice(
    probe_set: ProbeSet,
    slice_: Slice,
    canary: dict[str, dict[str, float]],
    stable: dict[str, dict[str, float]],
    min_items: int,
) -> SliceScore:
    keys = [
        item.key
        for item in probe_set.items
        if item.eval_set == slice_.eval_set and (slice_.tag is None or slice_.tag in item.tags)
    ]
    both = [k for k in keys if k in canary and k in stable]
    c = np.array([canary[k][slice_.metric] for k in both], dtype=float)
    s = np.array([stable[k][slice_.metric] for k in both], dtype=float)
    numbers = {"slice": slice_.name, "items": len(keys), "answered": len(both)}
    numbers["max_drop"] = slice_.max_drop
    if len(both) < min_items:
        return SliceScore(
            **numbers,
            canary=float(c.mean()) if both else None,
            stable=float(s.mean()) if both else None,
            drop=None,
            ci_low=None,
            ci_high=None,
            outcome="inconclusive",
            reason=f"{len(both)} of {len(keys)} items answered by both; at least {min_items} needed",
        )
    drop, low, high = paired_drop_ci(
        s.tolist(),
        c.tolist(),
        higher_is_better=slice_.higher_is_better,
        confidence=slice_.confidence,
    )
    scores = (
        f"canary {c.mean():.3f}, stable {s.mean():.3f} on {len(both)} items: "
        f"drop {drop:+.3f} [{low:+.3f}, {high:+.3f}]"
    )
    # Beyond the margin and beyond noise fails. Beyond the margin but within noise cannot
    # pass: the probes are the same items every window (temperature 0), so a canary that
    # lost some of them would lose them again in every window and pass them all.
    if drop > slice_.max_drop + EPS and low > EPS:
        outcome, reason = "fail", f"{scores} exceeds the margin {slice_.max_drop:g}"
    elif drop > slice_.max_drop + EPS:
        outcome = "inconclusive"
        reason = (
            f"{scores} exceeds the margin {slice_.max_drop:g}, but its interval reaches 0: "
            f"{len(both)} items cannot tell the drop from noise"
        )
    else:
        outcome, reason = "pass", f"{scores} within the margin {slice_.max_drop:g}"
    return SliceScore(
        **numbers,
        canary=float(c.mean()),
        stable=float(s.mean()),
        drop=drop,
        ci_low=low,
        ci_high=high,
        outcome=outcome,
        reason=reason,
    )


def judge(probe_set: ProbeSet, run: ProbeRun, min_items: int) -> list[SliceScore]:
    """Every critical slice of the probe set, canary against stable, from one window's
    answers. Pure: the same answers give the same scores."""
    canary = score_answers(probe_set, run.answers.get("canary", {}))
    stable = score_answers(probe_set, run.answers.get("stable", {}))
    return [judge_slice(probe_set, s, canary, stable, min_items) for s in probe_set.slices]


# -- the effect ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRoute:
    """Where and how the probes reach the load balancer."""

    url: str
    api_key: str
    service: str
    request_body: dict


def request_json(probe_set: ProbeSet, item: ProbeItem, route: ProbeRoute) -> dict:
    d = probe_set.decoding
    body = dict(route.request_body) | {
        "model": route.service,
        "messages": item.messages,
        "max_tokens": int(d["max_gen_toks"]),
        "temperature": float(d["temperature"]),
        "top_p": float(d.get("top_p", 1.0)),
        "stop": list(d["until"]),
    }
    return body


def send_probes(
    probe_set: ProbeSet, route: ProbeRoute, *, concurrency: int, timeout_s: float
) -> ProbeRun:
    """Every item of the probe set to both slots through the load balancer, pinned; at most
    ``concurrency`` in flight. An answer is counted only from the slot it was pinned to."""
    headers = {"Authorization": f"Bearer {route.api_key}"}
    jobs = [(role, item) for item in probe_set.items for role in ROLES]

    def ask(job: tuple[str, ProbeItem]) -> tuple[str, str, str | None, str | None]:
        role, item = job
        try:
            response = requests.post(
                f"{route.url}/v1/chat/completions",
                json=request_json(probe_set, item, route),
                headers=headers | {PIN_HEADER: role},
                timeout=timeout_s,
            )
        except requests.RequestException as exc:
            return role, item.key, None, f"{type(exc).__name__}"
        if response.status_code != 200:
            return role, item.key, None, f"HTTP {response.status_code}"
        answered_by = response.headers.get(ANSWERED_BY_HEADER)
        if answered_by != role:
            return role, item.key, None, f"answered by {answered_by or 'an unknown slot'}"
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return role, item.key, None, "no answer in the response"
        return role, item.key, str(content or ""), None

    answers: dict[str, dict[str, str | None]] = {role: {} for role in ROLES}
    errors: dict[str, list[str]] = {role: [] for role in ROLES}
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for role, key, answer, error in pool.map(ask, jobs):
            answers[role][key] = answer
            if error is not None:
                errors[role].append(f"{key}: {error}")
    run = ProbeRun(
        sent={role: len(probe_set.items) for role in ROLES},
        answered={role: sum(a is not None for a in answers[role].values()) for role in ROLES},
        errors={role: e[:5] for role, e in errors.items() if e},
        seconds=round(time.monotonic() - started, 3),
        answers=answers,
    )
    log.info("quality probes: sent %s, answered %s in %.1f s", run.sent, run.answered, run.seconds)
    return run
