"""Load test: GuideLLM against a candidate endpoint, one concurrency level at a time; and
goodput, the load the candidate serves within the SLO.

Goodput is the highest load level (concurrent streams) whose TTFT p95, ITL p95 and error
rate meet the SLO, every lower measured level meeting it too; the output tokens/s measured
at that level breaks a tie. It is read from the percentiles GuideLLM reports, for the levels
the load profile runs (what the host can afford), and it is what ranks the candidates
(select) and the tuner's settings (tune) alike. GuideLLM is also given the SLO (its
``--metrics`` ``slo``: ``ttft_ms``, and ``tpot_ms``, which it compares with each request's
inter-token latency) and reports per level the share of requests that met it and the
requests/s that did (``slo_attainment``, ``request_goodput``): the report shows both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from llm_release import server_key
from llm_release.config import Gates, LoadProfile
from llm_release.errors import LoadTestError
from llm_release.hub.credentials import child_env
from llm_release.load import prefix_cache
from llm_release.load.prefix_cache import CacheSampler
from llm_release.results import Goodput, LoadLevel, LoadResult, Slo

if TYPE_CHECKING:
    from guidellm.benchmark.schemas.benchmark import GenerativeBenchmark
    from guidellm.benchmark.schemas.report import GenerativeBenchmarksReport
    from guidellm.schemas import StatusDistributionSummary

log = logging.getLogger(__name__)


def backend_arg(base_url: str, served_name: str, request_body: dict | None = None) -> str:
    """GuideLLM's ``--backend``; with ``request_body`` (the thinking switch of a reasoning
    model) as JSON, whose ``extras.body`` GuideLLM's openai_http backend merges into every
    request's body (guidellm/schemas/backends/openai_http.py, ``extras``)."""
    if not request_body:
        return f"kind=openai_http,target={base_url},model={served_name}"
    backend = {"kind": "openai_http", "target": base_url, "model": served_name}
    return json.dumps(backend | {"extras": {"body": request_body}})


def slo_for(gates: Gates, itl_p95_ms: float | None = None) -> Slo:
    """The gates' SLO: TTFT p95 and the error ceiling, and ITL p95 (``itl_p95_ms``, e.g. the
    tuner's own, replaces the gates' ITL ceiling)."""
    return Slo(
        ttft_p95_ms=gates.ttft_p95_slo_s * 1000,
        itl_p95_ms=itl_p95_ms or gates.itl_p95_slo_ms,
        max_error_rate=gates.max_error_rate,
    )


def level_verdict(level: LoadLevel, slo: Slo) -> str | None:
    """None when the level meets the SLO, else what broke it."""
    if level.requests == 0:
        return "no request completed"
    if level.error_rate > slo.max_error_rate:
        return f"error rate {level.error_rate:.1%} > {slo.max_error_rate:.1%}"
    if level.ttft_p95_ms > slo.ttft_p95_ms:
        return f"TTFT p95 {level.ttft_p95_ms:.0f} ms > {slo.ttft_p95_ms:.0f} ms"
    if level.itl_p95_ms > slo.itl_p95_ms:
        return f"ITL p95 {level.itl_p95_ms:.0f} ms > {slo.itl_p95_ms:.0f} ms"
    return None


def goodput(levels: list[LoadLevel], slo: Slo) -> Goodput:
    """The highest measured level that meets ``slo`` with every lower measured level meeting
    it too, its output tokens/s, and why each failing level failed."""
    out = Goodput()
    for level in sorted(levels, key=lambda lv: lv.concurrency):
        why = level_verdict(level, slo)
        if why:
            out.failures[level.concurrency] = why
        elif not out.failures:
            out.concurrency = level.concurrency
            out.output_tokens_per_s = level.output_tokens_per_s
    return out


def slo_metrics(slo: Slo | None) -> list[str]:
    """GuideLLM's own goodput accounting (``--metrics`` with an ``slo``): per level, the share
    of requests within the SLO and their rate."""
    if slo is None:
        return []
    objectives = {"ttft_ms": slo.ttft_p95_ms, "tpot_ms": slo.itl_p95_ms}
    return ["--metrics", json.dumps({"kind": "generative", "slo": objectives})]


# A chat request as OpenAI's API takes it: [{"role": ..., "content": ...}, ...]
Messages = list[dict[str, str]]


def write_prompts(
    prompts: list[Messages], profile: LoadProfile, path: Path, run_index: int = 0
) -> Path:
    """GuideLLM's data file for ``prompts`` (a load profile's ``prompts_from``): one row a
    request of the sweep, the prompts cycled in order (a server's ``run_index``-th run goes
    on where the runs before it left off, as one run of all their levels would), each with
    its system message as
    GuideLLM's ``system_prompt`` column (its chat requests send it as the system message,
    guidellm/backends/openai/request_handlers.py), its user text as ``prompt`` and the
    profile's output length as ``output_tokens_count``."""
    if not prompts:
        raise LoadTestError(
            f"the load profile's prompts_from {profile.prompts_from!r} gave no prompts",
            hint="name an eval set with items (llm-release eval-sets list)",
        )
    sent = profile.requests_per_level * len(profile.concurrencies)  # a run's requests
    rows = max(len(prompts), sent)
    with path.open("w") as out:
        for index in range(rows):
            messages = prompts[(run_index * sent + index) % len(prompts)]
            system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
            row = {
                "prompt": "\n\n".join(m["content"] for m in messages if m["role"] == "user"),
                "output_tokens_count": profile.output_tokens,
            }
            out.write(json.dumps(row | ({"system_prompt": system} if system else {})) + "\n")
    return path


def data_arg(profile: LoadProfile, prompts_file: Path | None = None) -> str:
    """GuideLLM's ``--data``: with ``prompts_file`` (``write_prompts``), that file; else
    synthetic text of the profile's lengths; with a shared prefix,
    its ``prefix_buckets`` (guidellm/schemas/data/deserializers/synthetic.py): ``share`` of
    the requests start with one of ``distinct`` prefixes of ``tokens`` tokens, the rest
    with none; with ``turns`` above 1, conversations of that many user turns (its
    ``turns``: each later request resends the conversation's history)."""
    if prompts_file is not None:
        return json.dumps({"kind": "json_file", "path": str(prompts_file)})
    prefix = profile.shared_prefix
    if prefix is None and profile.turns == 1:
        return (
            f"kind=synthetic_text,prompt_tokens={profile.prompt_tokens},"
            f"output_tokens={profile.output_tokens}"
        )
    data: dict = {
        "kind": "synthetic_text",
        "prompt_tokens": profile.prompt_tokens,
        "output_tokens": profile.output_tokens,
    }
    if prefix is not None:
        shared = min(100, max(1, round(prefix.share * 100)))  # GuideLLM's weights: whole numbers
        buckets = [
            {
                "bucket_weight": shared,
                "prefix_count": prefix.distinct,
                "prefix_tokens": prefix.tokens,
            }
        ]
        if shared < 100:
            buckets.append({"bucket_weight": 100 - shared, "prefix_count": 1, "prefix_tokens": 0})
        data["prefix_buckets"] = buckets
    if profile.turns > 1:
        data["turns"] = profile.turns
    return json.dumps(data)


# GuideLLM draws a run's synthetic prompts from its seed (42 by default), the Nth benchmark
# of the run from seed + N and a few offsets above it (guidellm/data/deserializers/
# synthetic.py): a second run with the same seed sends the first run's prompts again, and
# vLLM's prefix cache serves them. Measured in the tuner's one-run-a-level sweeps before
# 2026-12-07: 97% of the prompt tokens from the cache at every level after a server's first
# (one H100, 512-token prompts), 81% on 2 CPU cores (128-token prompts), against 3% in the
# release's one-run sweep. Runs that must not see each other's prompts take seeds this far
# apart.
GUIDELLM_SEED = 42
PROMPT_SEED_STRIDE = 1000


def build_command(
    base_url: str,
    served_name: str,
    tokenizer_dir: Path,
    profile: LoadProfile,
    output_path: Path,
    request_body: dict | None = None,
    *,
    slo: Slo | None = None,
    scenario: Path | None = None,
    prompts_file: Path | None = None,
    warm_up: int | None = None,
    prompt_seed: int | None = None,
) -> list[str]:
    """GuideLLM's command line. ``scenario``: a JSON file GuideLLM merges under the
    options (``secret_scenario``: the server's key, which never goes into argv).
    ``warm_up``: a level of that many streams runs first (GuideLLM runs the streams in
    their order), its benchmark the report's first; ``parse_report`` leaves it out. It
    sends one wave, a request a stream (at most ``requests_per_level``): GuideLLM takes a
    list of counts, one a benchmark (GuideLLM 0.8.1 does not keep a short list's last count
    for the benchmarks past its end: [4, 8] gave 4, 8, 4), so the list names each level's.
    ``prompt_seed``: GuideLLM's ``--seed`` (None: its default, 42), from which its synthetic
    prompts are drawn: two runs with one seed send the same prompts (``PROMPT_SEED_STRIDE``)."""
    levels = ([warm_up] if warm_up else []) + list(profile.concurrencies)
    streams = ",".join(str(c) for c in levels)
    count = profile.requests_per_level
    requests = (
        json.dumps(
            {
                "kind": "max_requests",
                "count": [min(warm_up, count)] + [count] * len(profile.concurrencies),
            }
        )
        if warm_up
        else f"kind=max_requests,count={count}"
    )
    return [
        sys.executable,
        "-m",
        "guidellm",
        "run",
        *(["--config", str(scenario)] if scenario else []),
        "--backend",
        backend_arg(base_url, served_name, request_body),
        "--tokenizer",
        f"kind=hf_auto,model={tokenizer_dir}",
        "--data",
        data_arg(profile, prompts_file),
        "--profile",
        f"kind=concurrent,streams={levels[0]}",
        "--override",
        "profile.streams",
        streams,
        "--constraint",
        requests,
        "--constraint",
        f"kind=max_duration,seconds={profile.max_seconds_per_level}",
        *slo_metrics(slo),
        *(["--seed", f"kind=static,value={prompt_seed}"] if prompt_seed is not None else []),
        "--output",
        f"kind=json,path={output_path}",
    ]


# Sets the CPU affinity, then becomes the command (exec: same pid, affinity inherited by
# GuideLLM's worker processes). No preexec_fn: measurements run in threads side by side.
_PIN = (
    "import os, sys; "
    "os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(',')]); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def pinned(command: list[str], cpus: list[int] | None) -> list[str]:
    """``command`` run on ``cpus`` only (None: where the scheduler puts it)."""
    if not cpus:
        return command
    return [sys.executable, "-c", _PIN, ",".join(str(c) for c in cpus), *command]


def _optional(value) -> float | None:
    return None if value is None else float(value)


def read_report(path: Path) -> GenerativeBenchmarksReport:
    """GuideLLM's JSON report, read by GuideLLM's own report model (``load_file``)."""
    # Imported here: GuideLLM is the pipeline extra, and importing it takes seconds.
    from guidellm.benchmark.schemas.report import GenerativeBenchmarksReport
    from pydantic import ValidationError

    try:
        return GenerativeBenchmarksReport.load_file(path)
    except (ValidationError, ValueError) as exc:
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise LoadTestError(
            f"{path} is not a GuideLLM report this GuideLLM reads ({first})",
            hint="run the load test again; a report from another GuideLLM version is not read",
        ) from None


def _stat(metric: StatusDistributionSummary, key: str, status: str = "successful") -> float:
    summary = getattr(metric, status)
    if summary is None:
        return 0.0
    value = (
        getattr(summary, key) if key in ("mean", "median") else getattr(summary.percentiles, key)
    )
    return float(value or 0.0)


def _stopped_by_time(bench: GenerativeBenchmark) -> bool:
    state = bench.scheduler_state
    return any(
        "max_duration" in constraints
        for constraints in (state.end_queuing_constraints, state.end_processing_constraints)
    )


def parse_report(
    report: GenerativeBenchmarksReport, requests_planned: int = 0, *, skip: int = 0
) -> list[LoadLevel]:
    """One LoadLevel per benchmark (concurrency level) of GuideLLM's report, but for the
    first ``skip`` (the warm-up: ``build_command``)."""
    levels = []
    for bench in report.benchmarks[skip:]:
        strategy = bench.config.strategy
        metrics = bench.metrics
        totals = metrics.request_totals
        done = int(totals.successful or 0)
        errors = int(totals.errored or 0) + int(totals.incomplete or 0)
        total = max(done + errors, 1)
        goodput = metrics.request_goodput.successful if metrics.request_goodput else None
        levels.append(
            LoadLevel(
                concurrency=int(
                    getattr(strategy, "streams", None)
                    or getattr(strategy, "max_concurrency", None)
                    or 0
                ),
                requests=done + errors,
                requests_planned=requests_planned,
                time_limited=_stopped_by_time(bench),
                errors=errors,
                error_rate=errors / total,
                ttft_p50_ms=_stat(metrics.time_to_first_token_ms, "p50"),
                ttft_p95_ms=_stat(metrics.time_to_first_token_ms, "p95"),
                itl_p50_ms=_stat(metrics.inter_token_latency_ms, "p50"),
                itl_p95_ms=_stat(metrics.inter_token_latency_ms, "p95"),
                output_tokens_per_s=_stat(metrics.output_tokens_per_second, "mean", "total"),
                requests_per_s=_stat(metrics.requests_per_second, "mean", "total"),
                slo_attainment=_optional(metrics.slo_attainment),
                goodput_rps=_optional(goodput.mean if goodput else None),
            )
        )
    return levels


def short_levels(levels: list[LoadLevel]) -> list[int]:
    """Levels that recorded fewer requests than planned although no time limit stopped them.

    GuideLLM 0.8.1 can close a level while requests are still queued when they finish in
    tens of milliseconds (a race in its scheduler); such a level measured less than it was
    asked to and is run again.
    """
    return [
        lv.concurrency for lv in levels if lv.requests < lv.requests_planned and not lv.time_limited
    ]


# GuideLLM's error when a level ended with no request measured (guidellm/benchmark/schemas/
# metrics.py, GenerativeMetrics.compile).
NOTHING_MEASURED = "No measurement start or end times available"


@contextlib.contextmanager
def secret_scenario() -> Iterator[Path]:
    """A GuideLLM scenario file holding only the backend's ``api_key`` (the vLLM server's
    key, ``llm_release.server_key``), 0600, removed when the run ends. GuideLLM merges it
    under the command line's ``--backend`` (``BenchmarkScenario.create``: deep_update), so
    the key is never in argv, where every local user reads it; its report shows the key
    as a SecretStr does (``**********``)."""
    fd, name = tempfile.mkstemp(prefix="llm-release-guidellm-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"spec": {"backend": {"api_key": server_key.key()}}}, fh)
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _run_guidellm(
    base_url: str,
    served_name: str,
    tokenizer_dir: Path,
    profile: LoadProfile,
    report_path: Path,
    log_path: Path,
    request_body: dict | None = None,
    *,
    slo: Slo | None = None,
    cpus: list[int] | None = None,
    cache: CacheSampler | None = None,
    prompts_file: Path | None = None,
    warm_up: int | None = None,
    prompt_seed: int | None = None,
) -> list[LoadLevel]:
    env = child_env(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # no secrets for GuideLLM
    runs = len(profile.concurrencies) + (1 if warm_up else 0)
    budget = profile.max_seconds_per_level * runs + 120
    with secret_scenario() as scenario, log_path.open("wb") as log_file:
        cmd = pinned(
            build_command(
                base_url,
                served_name,
                tokenizer_dir,
                profile,
                report_path,
                request_body,
                slo=slo,
                scenario=scenario,
                prompts_file=prompts_file,
                warm_up=warm_up,
                prompt_seed=prompt_seed,
            ),
            cpus,
        )
        try:
            returncode = run_in_group(cmd, log_file, env, budget)
        except subprocess.TimeoutExpired as exc:
            raise GuideLLMHung(f"GuideLLM ran longer than {budget:.0f}s; see {log_path}") from exc
    if returncode != 0 and NOTHING_MEASURED in log_path.read_text(errors="replace"):
        # GuideLLM 0.8.1 closed a level before any request of it was recorded and then fails
        # compiling that level's metrics (seen at 2 requests a level with two test workers
        # sharing 2 cores): the same as a level closed early, so it is run again.
        log.warning("%s: GuideLLM recorded no request of a level (%s)", served_name, log_path)
        return []
    if returncode != 0 or not report_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
        raise LoadTestError(f"GuideLLM exited with {returncode}; log tail:\n{tail}")
    report = read_report(report_path)
    skip = 1 if warm_up else 0
    levels = parse_report(report, profile.requests_per_level, skip=skip)
    if not levels:
        raise LoadTestError(f"GuideLLM wrote no benchmark into {report_path}")
    if cache is not None:
        cache.take()  # the counters after the last request of the last level
        levels = [
            level.model_copy(
                update={
                    "prefix_cache_hit_rate": prefix_cache.hit_rate(
                        cache.readings,
                        bench.scheduler_metrics.request_start_time,
                        bench.scheduler_metrics.request_end_time,
                    )
                }
            )
            for level, bench in zip(levels, report.benchmarks[skip:], strict=True)
        ]
    return levels


def run_in_group(cmd: list[str], log_file, env: dict, timeout_s: float) -> int:
    """Run ``cmd`` in a session of its own (its output to ``log_file``) and return its exit
    code; past ``timeout_s``, or on any interruption, stop the whole group: GuideLLM runs its
    requests in worker processes, which a kill of its main process alone would leave behind
    (holding CPU and connections while the next run starts)."""
    proc = subprocess.Popen(
        cmd,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.returncode is None:  # timed out or interrupted: the group goes
            for sig, grace_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=grace_s)
                    break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # a worker that outlived its main process


class GuideLLMHung(LoadTestError):
    """GuideLLM ran past its levels' time limits plus two minutes and was stopped."""


def prompt_seed(run_index: int, attempt: int) -> int | None:
    """GuideLLM's seed for a server's ``run_index``-th load test, ``attempt``-th try: None
    (GuideLLM's default) for a server's first run, first try, so the release's load test's
    command is GuideLLM's own; else a seed whose prompts no earlier run of that server sent."""
    step = run_index * 16 + (attempt - 1)  # 16 tries a run: run_load_test makes at most 3
    return None if step == 0 else GUIDELLM_SEED + step * PROMPT_SEED_STRIDE


def run_load_test(
    base_url: str,
    served_name: str,
    tokenizer_dir: Path,
    profile: LoadProfile,
    out_dir: Path,
    max_attempts: int = 3,
    request_body: dict | None = None,
    *,
    slo: Slo | None = None,
    cpus: list[int] | None = None,
    prompts: list[Messages] | None = None,
    warm_up_at: int | None = None,
    run_index: int = 0,
) -> LoadResult:
    """Run the sweep; a level GuideLLM closed early is run again, at most ``max_attempts``
    times in all, and the fullest measurement of each level is kept. A run GuideLLM hung in
    (past its time limits: seen once in many on a loaded 2-core CI machine, a 3-second level
    still running after 123 s) is stopped and its levels run again, once; a second hang fails
    the load test. ``request_body``:
    fields every request carries (``reasoning.request_body``: the thinking switch). With
    ``slo``, GuideLLM also reports each level's SLO attainment and request goodput.
    ``cpus``: the CPUs GuideLLM runs on (``placement.client_cpus``; None: anywhere).
    ``prompts``: the chat messages of the profile's ``prompts_from`` (the caller reads the
    eval set: load and evaluation are independent rooms); required with it.
    With ``profile.warm_up`` the first run starts with an unmeasured level at
    ``warm_up_at`` streams (None: the profile's top concurrency); a run again starts on a
    server already warm. ``run_index``: how many load tests this server has run before (the
    tuner's sweeps run one a level): each run, and each retry of one, draws synthetic
    prompts the server has not seen (``prompt_seed``), and an eval set's prompts go on where
    the server's last run left off (``write_prompts``; a set smaller than a run repeats)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prompts_file = None
    if profile.prompts_from is not None:
        prompts_file = write_prompts(
            prompts or [], profile, out_dir / "prompts.jsonl", run_index=run_index
        )
    measured: dict[int, LoadLevel] = {}
    pending = list(profile.concurrencies)
    attempt = 0
    hung = False
    warm_up = (warm_up_at or max(profile.concurrencies)) if profile.warm_up else None
    # vLLM's prefix-cache counters read while GuideLLM runs: each level's hit rate
    with CacheSampler(base_url) as cache:
        while pending and attempt < max_attempts:
            attempt += 1
            suffix = "" if attempt == 1 else f"-attempt{attempt}"
            sweep = profile.model_copy(update={"concurrencies": pending})
            try:
                found = _run_guidellm(
                    base_url,
                    served_name,
                    tokenizer_dir,
                    sweep,
                    out_dir / f"guidellm{suffix}.json",
                    out_dir / f"guidellm{suffix}.log",
                    request_body=request_body,
                    slo=slo,
                    cpus=cpus,
                    cache=cache,
                    prompts_file=prompts_file,
                    warm_up=warm_up if attempt == 1 else None,
                    prompt_seed=prompt_seed(run_index, attempt),
                )
            except GuideLLMHung as exc:
                if hung or attempt >= max_attempts:
                    raise
                hung = True
                log.warning("%s: %s; running %s again", served_name, exc, pending)
                continue
            for level in found:
                kept = measured.get(level.concurrency)
                if kept is None or level.requests > kept.requests:
                    measured[level.concurrency] = level
            missing = [c for c in pending if c not in measured]
            pending = sorted(
                missing + short_levels([measured[c] for c in pending if c in measured])
            )
            if pending and attempt < max_attempts:
                log.warning(
                    "%s: GuideLLM closed concurrency %s before all %d requests were recorded; "
                    "running %s again",
                    served_name,
                    pending,
                    profile.requests_per_level,
                    "it" if len(pending) == 1 else "them",
                )
    never = [c for c in profile.concurrencies if c not in measured]
    if never:
        raise LoadTestError(
            f"GuideLLM reported no benchmark for concurrency {never} in {attempt} runs; "
            f"see the guidellm*.log files in {out_dir}"
        )
    levels = sorted(measured.values(), key=lambda lv: lv.concurrency)
    notes = [
        f"concurrency {lv.concurrency}: {lv.requests} of {lv.requests_planned} requests "
        + (
            "(stopped by max_seconds_per_level)"
            if lv.time_limited
            else f"(GuideLLM closed the level early in each of {attempt} runs)"
        )
        for lv in levels
        if lv.requests < lv.requests_planned
    ]
    return LoadResult(
        levels=levels,
        report_path=str(out_dir / "guidellm.json"),
        attempts=attempt,
        notes=notes,
        slo=slo,
        warm_up=warm_up,
    )
