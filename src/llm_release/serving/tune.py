"""Serving settings tuned per candidate for goodput under the SLO.

Goodput here is the highest load level (concurrent streams) at which TTFT p95 and ITL p95
stay under the SLO and the error rate under its ceiling, every lower level passing too
(``loadtest.goodput``, the same figure that ranks the challengers in select);
among settings of equal goodput the one with more output tokens/s at that level is better
(GuideLLM's requests/s of a single wave of 8 requests is not a stable figure: measured
0.94 req/s next to 117 tokens/s at 8 streams).

A server start dominates the cost (about 85 s for SmolLM2 on 2 loaded cores against
10-15 s for a load level), so the search saves starts first and levels second:

* **pruned by the planner** — a setting the planner says cannot fit (or that vLLM refuses
  at start, e.g. ``max_num_batched_tokens < max_num_seqs``) is never started;
* **equivalent settings collapsed** — under a load of at most ``top`` concurrent requests,
  every ``max_num_seqs ≥ top`` schedules alike, and so does every
  ``max_num_batched_tokens ≥ top × (prompt + output)``: one of each class is measured;
* **coordinate descent from the planner's start** — start where the planner points
  (``max_num_seqs`` = the top load level, on a GPU at most the untuned server's: see
  ``start_seqs``; the default batch budget, the release's prefix caching), then step each
  dimension to its neighbours, keeping a step only while it wins;
* **one direction where the failure names it** — the best setting's first failing level
  says which way ``max_num_seqs`` and ``max_num_batched_tokens`` can help (``directions``,
  vLLM's scheduler: at most ``max_num_seqs`` requests run and the rest wait, and each step
  carries at most ``max_num_batched_tokens`` tokens, prefill chunks beside the decodes):
  TTFT alone over the SLO with fewer sequences than streams — requests queued: more
  sequences (with every stream running, both ways); ITL alone over it — steps too
  long: fewer sequences or a smaller batch budget; TTFT alone — prefill waits for budget:
  a larger one. Both over it, errors, or another dimension: both directions. On a 3 × 3 grid
  this is what brings the search to a third of the grid's starts (the GPU time is in the
  starts: 103-191 s each on an H100 against ~10 s a level);
* **racing** — a trial setting is measured from the best setting's goodput level up: failing
  at or below that goodput it cannot win, and its server stops there (a session that does not
  warm its servers up first measures the level below too, as the best setting had one);
* **warm servers** — each server's first level follows one unmeasured level at the top of the
  sweep (``load.warm_up``): one-time costs such as kernels compiled on first use are billed
  to no setting;
* **early stop** — a setting's sweep stops at its first failing level, and the search stops
  once the best setting passes the top level (nothing on the grid can do better);
* **ties confirmed** — a setting that beats the best one at equal goodput by output tokens/s
  alone is taken only if it also beats the best one started again (``tune.confirm_ties``):
  two starts of one setting can differ by more than the tie margin.

**Speculative decoding** (``tune.speculation``: prompt lookup or the model's MTP head) is a
dimension like the others, with "none" always on the grid and measured first (the planner's
start). Speculation must not change what the model answers: each server the tuner starts
answers the same few greedy prompts (the domain calibration texts, one at a time), and a
setting with speculation whose answers differ from those of a setting without it, or that
has none to compare with, is never chosen (``Trial.answers_changed``), whatever its goodput.

``exhaustive`` measures every grid point at every level, for the benchmark.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from pydantic import Field

from llm_release.config import Gates, LoadProfile, ServingConfig, Speculation, TuneConfig
from llm_release.evaluation.items import traffic as eval_set_traffic
from llm_release.fileio import atomic_write_text
from llm_release.hardware import Hardware
from llm_release.load.loadtest import Messages, goodput, level_verdict, run_load_test, slo_for
from llm_release.results import LoadLevel, Pruned, Record, Setting, Slo, Trial, TuneResult
from llm_release.serving import capacity, reasoning
from llm_release.serving.factory import make_server
from llm_release.sizing.planner import _flag

log = logging.getLogger(__name__)

DIMENSIONS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "gpu_memory_utilization",
    "speculation",
)


__all__ = ["Grid", "Tuner", "goodput", "level_verdict", "tune_candidate"]


class Grid(Record):
    """Values per dimension; a dimension with one value is not searched."""

    max_num_seqs: list[int]
    max_num_batched_tokens: list[int | None] = Field(default_factory=lambda: [None])
    enable_prefix_caching: list[bool] = Field(default_factory=lambda: [True])
    gpu_memory_utilization: list[float | None] = Field(default_factory=lambda: [None])
    speculation: list[Speculation | None] = Field(default_factory=lambda: [None])
    default_batched_tokens: int | None = Field(
        None,
        description="vLLM's own budget where max_num_batched_tokens is None (its default "
        "sorts there); None: larger than every value",
    )

    def values(self, dim: str) -> list:
        raw = getattr(self, dim)
        if dim == "enable_prefix_caching":
            return sorted(set(raw))
        if dim == "speculation":  # none first, then fewer drafted tokens first
            return sorted(
                set(raw),
                key=lambda v: (
                    v is not None,
                    v.label() if v else "",
                    v and v.num_speculative_tokens,
                ),
            )
        if dim == "max_num_batched_tokens":
            # None (vLLM's default) sorts at vLLM's own budget, after an equal value
            default = self.default_batched_tokens
            return sorted(
                set(raw),
                key=lambda v: (v, 0) if v is not None else (default or float("inf"), 1),
            )
        return sorted(set(raw), key=lambda v: (v is None, v or 0))  # None: vLLM's default

    def points(self) -> list[Setting]:
        return [
            Setting(**dict(zip(DIMENSIONS, combo, strict=True)))
            for combo in itertools.product(*(self.values(d) for d in DIMENSIONS))
        ]

    def neighbour(self, setting: Setting, dim: str, step: int) -> Setting | None:
        values = self.values(dim)
        i = values.index(getattr(setting, dim)) + step
        if not 0 <= i < len(values):
            return None
        return setting.model_copy(update={dim: values[i]})


# A server session for one setting: a context manager that yields probe(concurrency).
Session = Callable[[Setting], AbstractContextManager[Callable[[int], LoadLevel]]]
Fits = Callable[[Setting], str | None]
# The greedy answers a setting's server gave (recorded by its session), None if none.
Answers = Callable[[Setting], list[str] | None]


def static_problem(setting: Setting) -> str | None:
    """What vLLM 0.32 refuses at start whatever the memory (SchedulerConfig checks)."""
    b = setting.max_num_batched_tokens
    if b is not None and b < setting.max_num_seqs:
        return f"max_num_batched_tokens {b} < max_num_seqs {setting.max_num_seqs} (vLLM refuses it)"
    return None


def representative(setting: Setting, top: int, step_tokens: int, grid: Grid) -> Setting:
    """The setting every equivalent one is measured as under at most ``top`` concurrent
    requests of ``step_tokens`` tokens (prompt + output): the smallest grid value that is
    not a limit, for max_num_seqs and max_num_batched_tokens; vLLM's default budget (None)
    is the grid's explicit value of the same size, where there is one."""
    seqs = [v for v in grid.values("max_num_seqs") if v >= top]
    update: dict = {}
    if setting.max_num_seqs >= top and seqs:
        update["max_num_seqs"] = seqs[0]
    enough = top * step_tokens
    explicit = [v for v in grid.values("max_num_batched_tokens") if v is not None]
    batched = [v for v in explicit if v >= enough]
    b = setting.max_num_batched_tokens
    if b is None:
        b = grid.default_batched_tokens
        if b in explicit:  # vLLM's default and the same value stated: one server
            update["max_num_batched_tokens"] = b
    if b is not None and b >= enough and batched:
        update["max_num_batched_tokens"] = batched[0]
    return setting.model_copy(update=update)


def _better(a: Trial, b: Trial, tie_margin: float) -> bool:
    """a beats b: higher goodput, or the same with ``tie_margin`` more output tokens/s."""
    if a.below is not None or a.answers_changed is not None:
        return False
    if a.goodput != b.goodput:
        return a.goodput > b.goodput
    return a.goodput > 0 and a.goodput_tok_s > b.goodput_tok_s * (1 + tie_margin)


class Tuner:
    def __init__(
        self,
        grid: Grid,
        levels: list[int],
        slo: Slo,
        session: Session,
        fits: Fits,
        *,
        step_tokens: int,
        max_settings: int = 8,
        tie_margin: float = 0.05,
        confirm: bool = True,
        answers: Answers | None = None,
        warmed_up: bool = False,
        directed: bool = True,
    ) -> None:
        self.grid = grid
        self.levels = sorted(set(levels))
        self.slo = slo
        self.session = session
        self.fits = fits
        self.step_tokens = step_tokens
        self.max_settings = max_settings
        self.tie_margin = tie_margin
        self.confirm = confirm
        self.answers = answers or (lambda setting: None)
        # the session runs an unmeasured level before each server's first (load.warm_up)
        self.warmed_up = warmed_up
        # steps only the way the best setting's failure points (``directions``); False: both
        # ways along every dimension, the search before 2026-12-07 (bench/tune_replay.py)
        self.directed = directed
        self.trials: dict[Setting, Trial] = {}
        self.again: list[Trial] = []  # second starts of measured settings (``confirmed``)
        self.pruned: dict[Setting, Pruned] = {}
        self.skipped: list[str] = []  # directions the coordinate search left out, and why

    # ------------------------------------------------------------------ measuring

    def problem(self, setting: Setting) -> str | None:
        if setting in self.pruned:
            return self.pruned[setting].reason
        reason = static_problem(setting) or self.fits(setting)
        if reason:
            self.pruned[setting] = Pruned(setting=setting, reason=reason)
        return reason

    def starts(self) -> int:
        return len(self.trials) + len(self.again)

    def measure(
        self, setting: Setting, *, start_at: int = 0, stop_early: bool = True, again: bool = False
    ) -> Trial:
        """Start the server once and sweep the levels from ``start_at`` upwards; ``again``: a
        setting measured before, started once more (kept beside its first trial)."""
        assert self.problem(setting) is None, "never start a setting that cannot fit"
        trial = Trial(setting=setting, again=again)
        begun = time.monotonic()
        todo = [c for c in self.levels if c >= start_at] or self.levels[-1:]
        if start_at and not self.warmed_up:
            # A server's first level after its start is slower (H100, 2026-12-06: TTFT p95
            # 585 and 623 ms at 100 streams as the first level, 281-376 ms after a level of
            # 50): with no warm-up level from the session, the level below first, as the best
            # setting had it before its goodput level, or the raced setting is billed for its
            # warm-up. With one (load.warm_up; H100, 2026-12-07: the warm-up wave's TTFT p95
            # 17.3x the measured level's) that level would be measured for nothing.
            warm = [c for c in self.levels if c < todo[0]]
            todo = warm[-1:] + todo
        try:
            with self.session(setting) as probe:
                for c in todo:
                    level = probe(c)
                    trial.levels.append(level)
                    why = level_verdict(level, self.slo)
                    if why:
                        trial.failures[c] = why
                        if stop_early:
                            break
        except Exception as exc:  # noqa: BLE001 - a setting that fails to serve loses, the search goes on
            trial.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            log.warning("tune: %s failed: %s", setting.label(), trial.error)
        trial.seconds = round(time.monotonic() - begun, 2)
        if setting.speculation is not None and not trial.error:
            trial.answers_changed = self.changed_answers(setting)
        failed = min(trial.failures, default=None)
        if start_at and failed is not None and failed <= start_at:
            trial.below = failed
        elif not trial.error:
            # the levels below start_at were not measured: the best setting passed them
            best = goodput(trial.levels, self.slo)
            trial.goodput, trial.goodput_tok_s = best.concurrency, best.output_tokens_per_s
        if again:
            self.again.append(trial)
        else:
            self.trials[setting] = trial
        log.info(
            "tune: %s → goodput %s (%.0f s)",
            setting.label(),
            f"< {trial.below}" if trial.below else trial.goodput,
            trial.seconds,
        )
        return trial

    def changed_answers(self, setting: Setting) -> str | None:
        """Why ``setting``'s greedy answers cannot stand for those without speculation
        (the first measured setting without it that has answers); None when they match."""
        given = self.answers(setting)
        reference = next(
            (
                ans
                for s in self.trials
                if s.speculation is None and (ans := self.answers(s)) is not None
            ),
            None,
        )
        if given is None or reference is None:
            return "no greedy answers to compare with those without speculation"
        if len(given) != len(reference):
            return f"{len(given)} greedy answers against {len(reference)} without speculation"
        differ = [i for i, (a, b) in enumerate(zip(given, reference, strict=True)) if a != b]
        if differ:
            return (
                f"{len(differ)} of {len(given)} greedy answers differ from those without "
                f"speculation (first: prompt {differ[0] + 1})"
            )
        return None

    def confirmed(self, trial: Trial, best: Trial) -> bool:
        """Whether ``trial``'s lead over ``best`` by output tokens/s alone (equal goodput)
        holds against ``best`` started once more and measured at the same levels. Two
        starts of one setting differ by more than the tie margin on a GPU (one H100,
        2026-12-06: vLLM's defaults at 100 streams gave 10,297, 12,238 and 13,913 tok/s in
        three starts), so one start each cannot rank them; without a start left in
        ``max_settings`` the best setting is kept."""
        if not self.confirm or trial.goodput != best.goodput:
            return True
        if self.starts() >= self.max_settings:
            return False
        best_again = self.measure(best.setting, start_at=best.goodput, again=True)
        return _better(trial, best_again, self.tie_margin)

    # ------------------------------------------------------------------ strategies

    def start_point(self, start: Setting) -> Setting | None:
        """The planner's start, snapped to the grid; else the first grid point that fits."""
        snapped = {}
        for dim in DIMENSIONS:
            values = self.grid.values(dim)
            want = getattr(start, dim)
            if want in values:
                snapped[dim] = want
            elif dim == "speculation":
                snapped[dim] = None  # always on the grid: the reference answers
            elif dim == "max_num_seqs":
                snapped[dim] = min(values, key=lambda v: abs(v - want))
            else:
                snapped[dim] = values[-1]
        first = Setting(**snapped)
        # what does not fit usually fits with fewer sequences: step those down first
        fewer = [
            first.model_copy(update={"max_num_seqs": v})
            for v in reversed(self.grid.values("max_num_seqs"))
            if v < first.max_num_seqs
        ]
        for s in [first, *fewer, *self.grid.points()]:
            if self.problem(s) is None:
                return s
        return None

    def coordinate(self, start: Setting) -> TuneResult:
        top = self.levels[-1]
        begun = self.start_point(start)
        if begun is None:
            return self._result("coordinate", None)
        first = representative(begun, top, self.step_tokens, self.grid)
        best = self.measure(first if self.problem(first) is None else begun)
        dims = [d for d in DIMENSIONS if len(self.grid.values(d)) > 1]
        improved = True
        while improved and best.goodput < top and self.starts() < self.max_settings:
            improved = False
            for dim in dims:
                for step in self.directions(best, dim) if self.directed else (1, -1):
                    moved = False
                    while best.goodput < top and self.starts() < self.max_settings:
                        nxt = self.grid.neighbour(best.setting, dim, step)
                        if nxt is None:
                            break
                        nxt = representative(nxt, top, self.step_tokens, self.grid)
                        if nxt == best.setting or nxt in self.trials:
                            break
                        if self.problem(nxt):
                            break  # the next step along this dimension costs more memory
                        trial = self.measure(nxt, start_at=best.goodput)
                        if not _better(trial, best, self.tie_margin):
                            break
                        if not self.confirmed(trial, best):
                            break  # its lead was within what two starts of one setting differ
                        best, moved, improved = trial, True, True
                    if moved:
                        break  # one direction per dimension and pass
        return self._result("coordinate", best)

    def directions(self, best: Trial, dim: str) -> tuple[int, ...]:
        """The steps along ``dim`` that can raise ``best``'s goodput, read from its first
        failing level (see the module's notes); both where that level does not say. A
        direction left out is noted in ``self.skipped``."""
        both = (1, -1)
        failed = min(best.failures, default=None)
        level = next((lv for lv in best.levels if lv.concurrency == failed), None)
        if dim not in ("max_num_seqs", "max_num_batched_tokens") or level is None:
            return both
        if not level.requests or level.error_rate > self.slo.max_error_rate:
            return both  # errors or nothing completed: no latency to read
        slow_first = level.ttft_p95_ms > self.slo.ttft_p95_ms
        slow_steps = level.itl_p95_ms > self.slo.itl_p95_ms
        if slow_first == slow_steps:
            return both
        seqs = best.setting.max_num_seqs
        why = level_verdict(level, self.slo)  # the one objective it broke
        if slow_steps:
            steps = (-1,)
        elif dim == "max_num_batched_tokens":
            steps = (1,)
        elif seqs < failed:
            steps = (1,)
            why = f"TTFT p95 over the SLO with {seqs} sequences running, the rest queued"
        else:
            # every stream ran: no queue to read; fewer sequences leave more of each step's
            # budget to prefills, and one start's TTFT differs from the next's by up to 30%
            return both
        left = [s for s in both if s not in steps and self.grid.neighbour(best.setting, dim, s)]
        note = (
            f"{dim} {' or '.join('up' if s == 1 else 'down' for s in left)} "
            f"from {best.setting.label()} not tried: {why} at {failed} streams"
        )
        if left and note not in self.skipped:
            self.skipped.append(note)
            log.info("tune: %s", note)
        return steps

    def exhaustive(self) -> TuneResult:
        best: Trial | None = None
        for setting in self.grid.points():
            if self.problem(setting):
                continue
            trial = self.measure(setting, stop_early=False)
            if trial.answers_changed is None and (best is None or _better(trial, best, 0.0)):
                best = trial
        return self._result("exhaustive", best)

    def _result(self, strategy, best: Trial | None) -> TuneResult:
        trials = [*self.trials.values(), *self.again]
        return TuneResult(
            strategy=strategy,
            slo=self.slo,
            levels=self.levels,
            chosen=best.setting if best else None,
            chosen_goodput=best.goodput if best else 0,
            chosen_goodput_tok_s=best.goodput_tok_s if best else 0.0,
            trials=trials,
            pruned=list(self.pruned.values()),
            grid_size=len(self.grid.points()),
            seconds=round(sum(t.seconds for t in trials), 2),
            levels_measured=sum(len(t.levels) for t in trials),
            skipped=self.skipped,
        )


# ---------------------------------------------------------------- the real thing: vLLM + GuideLLM


def apply_setting(serving: ServingConfig, setting: Setting) -> ServingConfig:
    """``serving`` with the setting's values; --max-num-batched-tokens replaces any given."""
    args = drop_flag(serving.extra_args, "--max-num-batched-tokens")
    if setting.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(setting.max_num_batched_tokens)]
    update: dict = {
        "max_num_seqs": setting.max_num_seqs,
        "enable_prefix_caching": setting.enable_prefix_caching,
        "extra_args": args,
    }
    if setting.gpu_memory_utilization is not None:
        update["gpu_memory_utilization"] = setting.gpu_memory_utilization
    update["speculation"] = setting.speculation
    return serving.model_copy(update=update)


def drop_flag(args: list[str], flag: str) -> list[str]:
    """``args`` without ``flag value`` / ``flag=value`` (vLLM's '_' spelling too)."""
    out: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if name == flag:
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def planner_fits(model_dir: Path, serving: ServingConfig, host: Hardware) -> Fits:
    """None for a setting the planner says fits, else its verdict (read the folder once)."""
    files = capacity.folder_files(Path(model_dir))

    def fits(setting: Setting) -> str | None:
        plan = capacity.plan_for_dir(model_dir, apply_setting(serving, setting), host, files)
        return None if plan.fits else f"the planner: {plan.verdict}"

    return fits


def vllm_session(
    model_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    tokenizer_dir: Path,
    profile: LoadProfile,
    out_dir: Path,
    *,
    prompts: list[str] | None = None,
    answers: dict[Setting, list[str]] | None = None,
    traffic: list[Messages] | None = None,
) -> Session:
    """One vLLM server per setting, kept up while GuideLLM measures its levels one by one
    (one GuideLLM run per level, so the sweep can stop at the first failing level). With
    ``prompts``, each server first answers them greedily, one at a time, into ``answers``.
    ``traffic``: the chat messages of the profile's ``prompts_from``."""
    request_body = reasoning.request_body(model_dir, serving.thinking)

    @contextmanager
    def session(setting: Setting) -> Iterator[Callable[[int], LoadLevel]]:
        folder, start = out_dir / _slug(setting), 1
        while folder.exists():  # a setting started again (Tuner.confirmed) keeps both logs
            start += 1
            folder = out_dir / f"{_slug(setting)}_start{start}"
        server = make_server(
            model_dir, served_names, apply_setting(serving, setting), folder / "vllm.log"
        )
        with server:
            if prompts and answers is not None:
                answers[setting] = greedy_answers(
                    server.base_url, served_names[0], prompts, request_body
                )
                atomic_write_text(folder / "answers.json", json.dumps(answers[setting], indent=1))

            runs = 0  # load tests this server has run

            def probe(concurrency: int) -> LoadLevel:
                # the server's first level only follows a warm-up, at the top level: every
                # batch size the sweep can reach has been through the server once
                nonlocal runs
                one = profile.model_copy(
                    update={"concurrencies": [concurrency], "warm_up": profile.warm_up and not runs}
                )
                runs += 1
                result = run_load_test(
                    server.base_url,
                    served_names[0],
                    tokenizer_dir,
                    one,
                    folder / f"c{concurrency}",
                    request_body=request_body,
                    prompts=traffic,
                    warm_up_at=max(profile.concurrencies),
                    # prompts the server has not seen: its prefix cache would serve a
                    # level's prompts sent again (97% of the tokens on an H100 before)
                    run_index=runs - 1,
                )
                return result.levels[0]

            yield probe

    return session


# The answers compared: a few domain texts, each cut to a prompt, answered greedily.
ANSWER_PROMPTS = 6
ANSWER_PROMPT_CHARS = 600
ANSWER_TOKENS = 48


def answer_prompts() -> list[str]:
    """The prompts whose greedy answers a setting with speculation must keep: the first
    calibration texts (the domain's own), each asked to be continued."""
    from llm_release.evaluation.set_checks import calibration_texts

    texts = calibration_texts()[:ANSWER_PROMPTS]
    return [f"Continue this text:\n\n{text[:ANSWER_PROMPT_CHARS]}" for text in texts]


def greedy_answers(
    base_url: str, served_name: str, prompts: list[str], request_body: dict
) -> list[str]:
    """Each prompt's greedy answer from the server at ``base_url``, one request at a time
    (a batch of one: what batching does to the sums is not what is compared)."""
    import requests

    from llm_release import server_key

    out = []
    for prompt in prompts:
        body = {
            "model": served_name,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": ANSWER_TOKENS,
            **request_body,
        }
        reply = requests.post(
            f"{base_url}/v1/chat/completions",
            json=body,
            headers=server_key.headers(),
            timeout=300,
        )
        reply.raise_for_status()
        out.append(reply.json()["choices"][0]["message"]["content"] or "")
    return out


def _slug(setting: Setting) -> str:
    return re.sub(r"[^a-z0-9=.-]+", "_", setting.label().lower())


def start_seqs(levels: list[int], model_dir: Path, serving: ServingConfig, host: Hardware) -> int:
    """The search's first ``max_num_seqs``: the top level (every request of it admitted at
    once), on a GPU at most what the candidate serves with untuned (its own value, or the
    plan's batch default: the workload's requests its KV cache holds at once). Sequences the
    KV cache cannot hold only preempt, and a start above the untuned server can end as the
    choice without ever being measured against it: on one H100 (2026-12-07) the hybrid
    Qwen3.5-35B-A3B shape's search started at 128 (100 snapped to the grid), measured the
    default's 62 10% ahead at equal goodput, could not confirm it with no start left, and
    kept 128, 0.94x the untuned server at 100 streams. From the untuned setting, the tuned
    one is the untuned one unless another beats it, confirmed."""
    top = max(levels)
    if not host.cuda:
        return top
    return min(top, capacity.resolve_batch(model_dir, serving, host).max_num_seqs or top)


def tune_candidate(
    tune: TuneConfig,
    *,
    model_dir: Path,
    tokenizer_dir: Path,
    served_names: list[str],
    serving: ServingConfig,
    load: LoadProfile,
    gates: Gates,
    host: Hardware,
    out_dir: Path,
    session: Session | None = None,
) -> tuple[TuneResult, ServingConfig]:
    """Search ``tune``'s grid for this candidate; the serving settings it chose (the
    candidate's own when nothing could be measured) and the search's record."""
    levels = tune.concurrencies or load.concurrencies
    profile = load.model_copy(
        update={
            "concurrencies": levels,
            "requests_per_level": tune.requests_per_level or load.requests_per_level,
        }
    )
    first = start_seqs(levels, model_dir, serving, host)
    utils: list[float | None] = [None]
    if host.cuda:
        utils = list(tune.gpu_memory_utilization) or [serving.gpu_memory_utilization]
    grid = Grid(
        # on a GPU the untuned server's batch is a choice too (start_seqs)
        max_num_seqs=[*tune.max_num_seqs, *([first] if host.cuda else [])],
        max_num_batched_tokens=tune.max_num_batched_tokens,
        enable_prefix_caching=tune.enable_prefix_caching,
        gpu_memory_utilization=utils,
        # the candidate's own speculation is a choice too, never dropped unmeasured
        speculation=[*tune.speculation, serving.speculation],
        default_batched_tokens=capacity.default_batched_tokens(serving, host),
    )
    slo = slo_for(gates, tune.itl_p95_slo_ms)
    batched = _flag(serving.extra_args, "--max-num-batched-tokens")
    start = Setting(
        max_num_seqs=first,
        max_num_batched_tokens=int(batched) if batched else None,
        enable_prefix_caching=serving.enable_prefix_caching,
        gpu_memory_utilization=serving.gpu_memory_utilization if host.cuda else None,
        speculation=None,  # the reference every setting with speculation is checked against
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    answers: dict[Setting, list[str]] = {}
    prompts = answer_prompts() if any(grid.values("speculation")) else []
    tuner = Tuner(
        grid,
        levels,
        slo,
        session
        or vllm_session(
            model_dir,
            served_names,
            serving,
            tokenizer_dir,
            profile,
            out_dir,
            prompts=prompts,
            answers=answers,
            traffic=eval_set_traffic(load.prompts_from) if load.prompts_from else None,
        ),
        planner_fits(model_dir, serving, host),
        step_tokens=load.prompt_tokens + load.output_tokens,
        max_settings=tune.max_settings,
        tie_margin=tune.tie_margin,
        confirm=tune.confirm_ties,
        answers=answers.get,
        warmed_up=session is None and profile.warm_up,
    )
    result = tuner.coordinate(start) if tune.strategy == "coordinate" else tuner.exhaustive()
    atomic_write_text(out_dir / "tune.json", result.model_dump_json(indent=2) + "\n")
    chosen = apply_setting(serving, result.chosen) if result.chosen else serving
    return result, chosen
