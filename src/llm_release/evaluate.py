"""Evaluate: lm-evaluation-harness against a candidate's OpenAI-compatible endpoint."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from . import metrics, paths
from .errors import EvalError
from .fileio import atomic_write_text
from .results import EvalResult, MetricScore

log = logging.getLogger(__name__)

# Keys of an lm-eval task YAML that an eval set may use. Anything else is refused, and
# with it every way of importing code (process_results, !function, custom filters).
ALLOWED_TASK_KEYS = {
    "task",
    "tag",
    "dataset_path",
    "dataset_kwargs",
    "test_split",
    "output_type",
    "doc_to_text",
    "doc_to_target",
    "metric_list",
    "metadata",
    "description",
}


@dataclass
class EvalSet:
    name: str
    directory: Path
    task: dict
    data_path: Path
    metric_names: list[str]


def load_decoding(path: Path | None = None) -> dict:
    path = path or paths.eval_sets_dir() / "decoding.yaml"
    try:
        decoding = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise EvalError(f"decoding parameters {path} are missing") from exc
    required = {"version", "temperature", "max_gen_toks", "until"}
    missing = required - set(decoding)
    if missing:
        raise EvalError(f"{path}: missing keys {sorted(missing)}")
    return decoding


def load_eval_set(name: str, root: Path | None = None) -> EvalSet:
    root = root or paths.eval_sets_dir()
    directory = root / name
    task_path = directory / "task.yaml"
    if not task_path.exists():
        available = (
            sorted(
                p.name
                for p in root.iterdir()
                if (p / "task.yaml").exists() and not p.name.startswith("_")
            )
            if root.exists()
            else []
        )
        raise EvalError(
            f"eval set {name!r} not found ({task_path} does not exist)",
            hint=f"available eval sets: {', '.join(available) or 'none'}",
        )
    try:
        task = yaml.safe_load(task_path.read_text())
    except yaml.YAMLError as exc:
        raise EvalError(
            f"{task_path}: not valid YAML (code tags such as !function are not allowed): {exc}"
        ) from exc
    if not isinstance(task, dict):
        raise EvalError(f"{task_path}: expected a mapping at the top level")
    unknown = set(task) - ALLOWED_TASK_KEYS
    if unknown:
        raise EvalError(
            f"{task_path}: keys not allowed in an eval set: {sorted(unknown)}",
            hint=f"allowed keys: {', '.join(sorted(ALLOWED_TASK_KEYS))}",
        )
    if task.get("task") != name:
        raise EvalError(f"{task_path}: 'task' must equal the folder name {name!r}")
    data_files = (task.get("dataset_kwargs") or {}).get("data_files") or {}
    split = task.get("test_split", "test")
    relative = data_files.get(split)
    if not relative:
        raise EvalError(f"{task_path}: dataset_kwargs.data_files.{split} is required")
    data_path = (directory / relative).resolve()
    if directory.resolve() not in data_path.parents or not data_path.exists():
        raise EvalError(f"{task_path}: data file {relative!r} must exist inside {directory}")
    metric_names = [m.get("metric") for m in task.get("metric_list") or []]
    if not metric_names:
        raise EvalError(f"{task_path}: metric_list is empty")
    for metric_name in metric_names:
        try:
            metrics.get(metric_name)
        except KeyError as exc:
            raise EvalError(f"{task_path}: {exc.args[0]}") from None
    return EvalSet(name, directory, task, data_path, metric_names)


def task_config(eval_set: EvalSet, decoding: dict) -> dict:
    """The lm-eval task dict: absolute data path, fixed decoding, our metric functions."""
    config = json.loads(json.dumps(eval_set.task))
    config["dataset_kwargs"]["data_files"] = {
        config.get("test_split", "test"): str(eval_set.data_path)
    }
    config["generation_kwargs"] = {
        "until": list(decoding["until"]),
        "max_gen_toks": int(decoding["max_gen_toks"]),
        "temperature": float(decoding["temperature"]),
        "top_p": float(decoding.get("top_p", 1.0)),
        "do_sample": False,
    }
    scorers = [metrics.get(n) for n in eval_set.metric_names]

    def process_results(doc: dict, results: list[str]) -> dict[str, float]:
        answer = results[0] if results else ""
        reference = str(doc.get("answer", ""))
        return {m.name: m.score(reference, answer) for m in scorers}

    config["process_results"] = process_results
    config["metric_list"] = [
        {"metric": m.name, "aggregation": "mean", "higher_is_better": m.higher_is_better}
        for m in scorers
    ]
    return config


def run_evaluation(
    base_url: str,
    served_name: str,
    eval_set_names: list[str],
    out_dir: Path,
    *,
    num_concurrent: int = 4,
    limit: int | None = None,
) -> list[EvalResult]:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from lm_eval import simple_evaluate

    decoding = load_decoding()
    sets = [load_eval_set(n) for n in eval_set_names]
    tasks = [task_config(s, decoding) for s in sets]
    try:
        output = simple_evaluate(
            model="local-chat-completions",
            model_args={
                "model": served_name,
                "base_url": f"{base_url}/v1/chat/completions",
                "num_concurrent": num_concurrent,
                "tokenizer_backend": "none",
                "max_retries": 3,
                "timeout": 300,
            },
            tasks=tasks,
            apply_chat_template=True,
            limit=limit,
            log_samples=True,
            bootstrap_iters=1000,
        )
    except Exception as exc:
        raise EvalError(
            f"lm-evaluation-harness failed against {base_url}: {type(exc).__name__}: {exc}",
            hint="check that the endpoint answers /v1/chat/completions and the eval set loads",
        ) from exc
    results = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for eval_set in sets:
        scores = output["results"][eval_set.name]
        samples = output.get("samples", {}).get(eval_set.name, [])
        samples_path = out_dir / f"{eval_set.name}.samples.jsonl"
        atomic_write_text(
            samples_path,
            "".join(
                json.dumps(
                    {
                        "id": s["doc"].get("id"),
                        "prompt": s["arguments"][0][0] if s.get("arguments") else None,
                        "reference": s["doc"].get("answer"),
                        "answer": (s.get("filtered_resps") or [""])[0],
                        **{m: s.get(m) for m in eval_set.metric_names},
                    },
                    ensure_ascii=False,
                    default=str,
                )
                + "\n"
                for s in samples
            ),
        )
        metric_scores = {}
        for name in eval_set.metric_names:
            value = scores.get(f"{name},none")
            stderr = scores.get(f"{name}_stderr,none")
            metric_scores[name] = MetricScore(
                value=float(value),
                stderr=float(stderr) if isinstance(stderr, (int, float)) else None,
                higher_is_better=metrics.get(name).higher_is_better,
            )
        results.append(
            EvalResult(
                eval_set=eval_set.name,
                num_items=len(samples),
                metrics=metric_scores,
                decoding=decoding,
                samples_path=str(samples_path),
            )
        )
    return results
