"""Evaluate: lm-evaluation-harness against a candidate's OpenAI-compatible endpoint."""

from __future__ import annotations

import ast
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths, server_key
from llm_release.errors import EvalError, one_line
from llm_release.evaluation import metrics
from llm_release.evaluation.evalsets import (
    EvalSet,
    check_templates,
    defaults,
    fingerprint,
    load_eval_set,
)
from llm_release.evaluation.items import load_items
from llm_release.evaluation.set_files import check_nesting
from llm_release.evaluation.stats import bootstrap_mean_ci
from llm_release.fileio import atomic_write_text
from llm_release.results import EvalResult, ItemResult, MetricScore

log = logging.getLogger(__name__)

# One lm-eval run at a time in a process: simple_evaluate seeds process-wide RNGs and
# ``_offline`` sets process-wide variables, so candidates measured side by side (threads of
# one flow) take turns here; their servers, and their load tests, still run at once.
_HARNESS = threading.Lock()


@contextmanager
def _offline() -> Iterator[None]:
    """lm-eval and datasets offline for the evaluation only: the local JSON data needs no
    hub, and the setting must not leak into the rest of the process or its children (a
    later `llm-release plan` of a hub repo would be refused as offline)."""
    keys = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    for key in keys:
        os.environ.setdefault(key, "1")
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class Decoding(BaseModel):
    """``decoding.yaml``'s values, bounded (a file of the eval-set repository, edited by
    people who do not change code: a 10⁹ ``max_gen_toks`` or a thousand stop strings is a
    one-line error, not a stuck evaluation)."""

    model_config = ConfigDict(extra="forbid", strict=False)

    version: int = Field(ge=1, le=1_000_000)
    temperature: float = Field(ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_gen_toks: int = Field(ge=1, le=131_072)
    until: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(max_length=16)


MAX_DECODING_BYTES = 16 * 1024


def load_decoding(path: Path | None = None) -> dict:
    """The fixed decoding parameters, as written (their dict is part of judgement and
    measurement keys), after the checks of ``Decoding``."""
    path = path or paths.eval_sets_dir() / "decoding.yaml"
    try:
        size = path.stat().st_size
        if size > MAX_DECODING_BYTES:
            raise EvalError(
                f"decoding parameters {path} are {size} bytes; at most {MAX_DECODING_BYTES}",
                hint="decoding.yaml holds five keys: version, temperature, top_p, "
                "max_gen_toks, until",
            )
        text = path.read_text("utf-8")
    except FileNotFoundError as exc:
        raise EvalError(f"decoding parameters {path} are missing") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalError(f"decoding parameters {path} cannot be read: {exc}") from None
    check_nesting(path, text)
    try:
        decoding = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise EvalError(f"{path}: not valid YAML ({one_line(str(exc))[:200]})") from None
    if not isinstance(decoding, dict):
        raise EvalError(f"{path}: must be a mapping of decoding parameters")
    required = {"version", "temperature", "max_gen_toks", "until"}
    missing = required - set(decoding)
    if missing:
        raise EvalError(f"{path}: missing keys {sorted(missing)}")
    try:
        Decoding.model_validate(decoding)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise EvalError(
            f"{path}: {where}: {first['msg']}",
            hint="bump 'version' after fixing it: results of different versions are not compared",
        ) from None
    return decoding


def task_config(eval_set: EvalSet, decoding: dict, request_body: dict | None = None) -> dict:
    """The lm-eval task dict: absolute data path, fixed decoding, our metric functions.

    ``request_body`` joins every request as it is (lm-eval's local-chat-completions puts
    the task's generation kwargs into the request body): the thinking switch of a reasoning
    model, ``{"chat_template_kwargs": {"enable_thinking": False}}`` (see reasoning.py). The
    fixed decoding wins over it."""
    # lm-eval renders these with an unsandboxed Jinja: only checked templates go in.
    check_templates(eval_set.task, eval_set.directory / "task.yaml")
    config = {
        k: v
        for k, v in json.loads(json.dumps(eval_set.task)).items()
        if k not in ("gates", "include")
    }
    config["dataset_kwargs"]["data_files"] = {
        config.get("test_split", "test"): str(eval_set.data_path)
    }
    config["generation_kwargs"] = json.loads(json.dumps(request_body or {})) | {
        "until": list(decoding["until"]),
        "max_gen_toks": int(decoding["max_gen_toks"]),
        "temperature": float(decoding["temperature"]),
        "top_p": float(decoding.get("top_p", 1.0)),
        "do_sample": False,
    }
    scorers = [metrics.get(n) for n in eval_set.metric_names]

    def process_results(doc: dict, results: list[str]) -> dict[str, float]:
        answer = results[0] if results else ""
        return {m.name: m.score(doc, answer) for m in scorers}

    config["process_results"] = process_results
    config["metric_list"] = [
        {"metric": m.name, "aggregation": "mean", "higher_is_better": m.higher_is_better}
        for m in scorers
    ]
    return config


def _prompt_text(sample: dict) -> str:
    """The chat prompt as plain text. lm-eval keeps a request's args as a tuple whose
    first element holds the JSON list of chat messages (a ``JsonChatStr`` for API models,
    or its repr once logged)."""
    raw: object = sample.get("arguments") or ""
    while isinstance(raw, (list, tuple)) and not isinstance(raw, str) and raw:
        raw = raw[0]
    raw = getattr(raw, "prompt", raw)
    if isinstance(raw, str) and raw.startswith("("):
        try:
            raw = ast.literal_eval(raw)[0]
        except (ValueError, SyntaxError, IndexError, TypeError):
            pass
    try:
        messages = json.loads(raw)
        return "\n".join(m.get("content", "") for m in messages)
    except (TypeError, ValueError, AttributeError):
        return str(raw)


def run_evaluation(
    base_url: str,
    served_name: str,
    eval_set_names: list[str],
    out_dir: Path,
    *,
    num_concurrent: int = 4,
    limit: int | None = None,
    bootstrap_iters: int = 2000,
    request_body: dict | None = None,
) -> list[EvalResult]:
    """``request_body``: fields every request carries (``reasoning.request_body``: the
    thinking switch); recorded with the decoding parameters."""
    decoding = load_decoding()
    bootstrap_iters = bootstrap_iters or defaults().bootstrap_iters
    sets = [load_eval_set(n) for n in eval_set_names]
    for eval_set in sets:
        load_items(eval_set)
    tasks = [task_config(s, decoding, request_body) for s in sets]
    if not _HARNESS.acquire(blocking=False):
        log.info("%s: waiting for another candidate's evaluation to finish", served_name)
        _HARNESS.acquire()
    try:
        with _offline():
            from lm_eval import simple_evaluate
            from lm_eval.models.openai_completions import LocalChatCompletion

            # Built here rather than from model_args, which lm-eval logs and keeps in its
            # output: the header carries the server's key (llm_release.server_key).
            model = LocalChatCompletion(
                model=served_name,
                base_url=f"{base_url}/v1/chat/completions",
                num_concurrent=num_concurrent,
                tokenizer_backend="none",
                max_retries=3,
                timeout=300,
                header=server_key.headers(),
            )
            output = simple_evaluate(
                model=model,
                tasks=tasks,
                apply_chat_template=True,
                limit=limit,
                log_samples=True,
                bootstrap_iters=0,
            )
    except Exception as exc:
        raise EvalError(
            f"lm-evaluation-harness failed against {base_url}: {type(exc).__name__}: {exc}",
            hint="check that the endpoint answers /v1/chat/completions and the eval set loads",
        ) from exc
    finally:
        _HARNESS.release()
    results = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for eval_set in sets:
        samples = sorted(
            output.get("samples", {}).get(eval_set.name, []), key=lambda s: s.get("doc_id", 0)
        )
        items = [
            ItemResult(
                id=str(s["doc"].get("id")),
                tags=list(s["doc"].get("tags") or []),
                scores={m: float(s.get(m, 0.0)) for m in eval_set.metric_names},
                prompt=_prompt_text(s),
                reference=str(s["doc"].get("answer", "")),
                answer=str((s.get("filtered_resps") or [""])[0]),
            )
            for s in samples
        ]
        samples_path = out_dir / f"{eval_set.name}.samples.jsonl"
        atomic_write_text(samples_path, "".join(item.model_dump_json() + "\n" for item in items))
        metric_scores = {}
        for name in eval_set.metric_names:
            values = [item.scores[name] for item in items]
            mean, low, high, stderr = bootstrap_mean_ci(
                values, confidence=eval_set.gates.confidence, iters=bootstrap_iters
            )
            metric_scores[name] = MetricScore(
                value=mean,
                stderr=stderr,
                ci_low=low,
                ci_high=high,
                higher_is_better=metrics.get(name).higher_is_better,
            )
        results.append(
            EvalResult(
                eval_set=eval_set.name,
                version=eval_set.task["metadata"]["version"],
                sha256=fingerprint(eval_set),
                num_items=len(items),
                metrics=metric_scores,
                decoding=decoding | (request_body or {}),
                gates=eval_set.gates,
                items=items,
                samples_path=str(samples_path),
            )
        )
    return results
