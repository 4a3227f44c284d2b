"""Measure one candidate: serve it, evaluate it, load-test it, tear it down."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.evaluation.evaluate import run_evaluation
from llm_release.evaluation.items import traffic as eval_set_traffic
from llm_release.fileio import atomic_write_text
from llm_release.hardware import detect
from llm_release.load.loadtest import run_load_test
from llm_release.quantization.quantize import dir_size
from llm_release.results import CANDIDATE_RESULT, CandidateResult, Slo
from llm_release.serving import gpus, placement, reasoning
from llm_release.serving.capacity import kv_check
from llm_release.serving.factory import make_server
from llm_release.serving.serve import Owner, Server
from llm_release.sizing import corrections

log = logging.getLogger(__name__)


def measure(
    *,
    name: str,
    scheme: str,
    model_dir: Path,
    tokenizer_dir: Path,
    serving: ServingConfig,
    evaluation: EvalConfig,
    load: LoadProfile,
    out_dir: Path,
    public_name: str,
    run_id: str | None = None,
    slo: Slo | None = None,
) -> CandidateResult:
    """Never raises for a candidate's own failure: it is recorded, and the others go on.
    ``slo`` (the gates'): GuideLLM reports each load level's attainment of it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    result = CandidateResult(
        name=name,
        scheme=scheme,
        model_dir=str(model_dir),
        size_bytes=dir_size(model_dir),
        status="failed",
    )
    started = time.monotonic()
    # A reasoning model's thinking switch, turned off unless serving.thinking: the same in
    # every request of the evaluation and the load test.
    request_body = reasoning.request_body(model_dir, serving.thinking)
    server = make_server(
        model_dir,
        [name, public_name],
        serving,
        out_dir / "vllm.log",
        owner=Owner(role="candidate", run_id=run_id, candidate=name),
    )
    try:
        with server:
            seconds["serve_start"] = time.monotonic() - started
            result.gpus = list(server.gpus)
            log.info("%s: healthy at %s after %.0fs", name, server.base_url, seconds["serve_start"])
            result.kv_check = kv_check(model_dir, server.serving, detect(), server.log_text())
            if result.kv_check:
                corrections.record(result.kv_check, name)
                log.info(
                    "%s: KV-cache tokens planner %d, vLLM %d (%+.2f%%)",
                    name,
                    result.kv_check.planner_kv_cache_tokens,
                    result.kv_check.vllm_kv_cache_tokens,
                    100 * result.kv_check.tokens_error,
                )
            with _server_watch(server, "evaluation"):
                mark = time.monotonic()
                result.evals = run_evaluation(
                    server.base_url,
                    name,
                    evaluation.eval_sets,
                    out_dir / "eval",
                    num_concurrent=evaluation.concurrency(server.serving, gpu=bool(server.gpus)),
                    limit=evaluation.limit,
                    request_body=request_body,
                )
                seconds["evaluate"] = time.monotonic() - mark
            log.info("%s: evaluated in %.0fs", name, seconds["evaluate"])
            with _server_watch(server, "the load test"):
                mark = time.monotonic()
                result.load = run_load_test(
                    server.base_url,
                    name,
                    tokenizer_dir,
                    load,
                    out_dir / "load",
                    request_body=request_body,
                    slo=slo,
                    cpus=placement.client_cpus(
                        server.gpus, gpus.host_gpus(), sorted(os.sched_getaffinity(0))
                    ),
                    prompts=eval_set_traffic(load.prompts_from) if load.prompts_from else None,
                )
                seconds["loadtest"] = time.monotonic() - mark
            log.info("%s: load-tested in %.0fs", name, seconds["loadtest"])
            mark = time.monotonic()
        seconds["teardown"] = time.monotonic() - mark
        result.status = "measured"
    except Exception as exc:  # noqa: BLE001 - one candidate's failure must not stop the others
        log.error("%s failed: %s", name, exc)
        result.error = f"{type(exc).__name__}: {exc}"
    result.stage_seconds = {k: round(v, 2) for k, v in seconds.items()}
    # The measurement beside its samples: what publishing the winner reads for its card.
    atomic_write_text(out_dir / CANDIDATE_RESULT, result.model_dump_json(indent=2) + "\n")
    return result


@contextmanager
def _server_watch(server: Server, stage: str) -> Iterator[None]:
    """A client error while the server is dead becomes the server's own cause and log tail:
    the client saw only a refused connection."""
    try:
        yield
    except Exception as exc:
        if server.alive():
            raise
        first = (str(exc).splitlines() or [""])[0]
        raise server.died_error(stage, f"{type(exc).__name__}: {first}") from exc
