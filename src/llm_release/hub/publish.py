"""Publish a released candidate's quantized folder as a new revision of a hub repo.

The folder goes up through the real ``huggingface_hub`` client (``create_repo`` then
``upload_folder``) with a generated model card (``README.md``): the model-index metadata
the hub renders (one eval result per eval set and metric), ``base_model`` (the upstream
repo), the quantization scheme and the lineage (upstream repo and commit, recipe,
calibration set and its SHA-256, every published file's SHA-256). The card holds no clock
time, so publishing the same release twice gives the same content commit.

Another host then serves the winner by repo and commit, through the same download and
SHA-256 check as any model (``acquire``). Before this returns, the hub's own listing of the
new commit is read back and every file's published hash compared with the bytes sent.

Where and with which token:

- ``LLM_RELEASE_PUBLISH_REPO`` (owner/name) turns publishing on;
- ``LLM_RELEASE_PUBLISH_ENDPOINT``, else the download hub (``HF_ENDPOINT``), else
  huggingface.co; it passes the same endpoint policy as every hub request;
- ``LLM_RELEASE_PUBLISH_TOKEN`` is bound to that endpoint and sent nowhere else
  (``credentials.token_for``); without it the environment's token goes only where the
  operator lets it go (``LLM_RELEASE_HF_TOKEN_ENDPOINTS``).

Xet: ``huggingface_hub`` uploads through Xet whenever ``hf_xet`` is installed and
``HF_HUB_DISABLE_XET`` was not set when it was imported (it reads the variable once, into
``huggingface_hub.constants``, and ``is_xet_available()`` reads that constant on each call).
A hub that speaks only Git LFS (the demo hub, plain mirrors) needs Xet off, so the upload
runs with that constant set from ``LLM_RELEASE_PUBLISH_XET`` (default off) and restored
afterwards, under a lock (one publish at a time in a process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from llm_release import paths
from llm_release.config import REPO_ID, SourceConfig
from llm_release.errors import ConfigError, PublishError, ReleaseError
from llm_release.fileio import git_blob_sha1, sha256_file
from llm_release.hub import credentials
from llm_release.hub.acquire import resolve
from llm_release.hub.credentials import HubToken
from llm_release.results import EvalResult
from llm_release.settings import env_name, settings

logger = logging.getLogger(__name__)

CARD = "README.md"
BRANCH = "main"
TASK_TYPE = "text-generation"
_XET_LOCK = threading.Lock()


class Lineage(BaseModel):
    """Where a published folder came from; the card's ``llm_release`` metadata."""

    model_config = ConfigDict(extra="forbid")

    upstream_repo: str
    upstream_commit: str
    release_id: str
    candidate: str
    scheme: str
    run_id: str | None = None
    recipe: dict = Field(default_factory=dict, description="the candidate's quantization recipe")
    calibration_set: str | None = None
    calibration_sha256: str | None = Field(
        None, description="the calibration file's SHA-256 (calibrated schemes only)"
    )
    cache_key: str | None = Field(None, description="the quantization's content hash")
    files: dict[str, str] = Field(
        default_factory=dict, description="every published file (the card aside): SHA-256"
    )


class PublishTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo_id: str
    endpoint: str
    token: HubToken | None = None
    xet: bool = False


class Published(BaseModel):
    model_config = ConfigDict(extra="forbid")

    repo_id: str
    commit: str
    endpoint: str
    files: dict[str, str] = Field(description="path: SHA-256, the card included")


def publish_target() -> PublishTarget | None:
    """The operator's publish target, or None when ``LLM_RELEASE_PUBLISH_REPO`` is unset."""
    current = settings()
    if not current.publish_repo:
        return None
    if not re.fullmatch(REPO_ID, current.publish_repo):
        raise ConfigError(
            f"{env_name('publish_repo')}={current.publish_repo[:100]!r} is not 'owner/name'",
            hint=f"set {env_name('publish_repo')} to the repo id the winner is published to",
        )
    try:
        endpoint = credentials.check_hub_endpoint(credentials.hf_endpoint(current.publish_endpoint))
    except ValueError as exc:
        raise ConfigError(
            f"{env_name('publish_endpoint')}: {str(exc).split(';')[0]}",
            hint="give the publish hub's plain http(s) URL, without credentials",
        ) from None
    token = current.publish_token
    return PublishTarget(
        repo_id=current.publish_repo,
        endpoint=endpoint,
        token=HubToken(endpoint=endpoint, token=token) if token is not None else None,
        xet=current.publish_xet,
    )


# ---------------------------------------------------------------- the model card


def _fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def build_card(repo_id: str, lineage: Lineage, evals: list[EvalResult]):
    """The model card (a ``huggingface_hub.ModelCard``) of a published release."""
    from huggingface_hub import EvalResult as HubEvalResult
    from huggingface_hub import ModelCard, ModelCardData

    results = [
        HubEvalResult(
            task_type=TASK_TYPE,
            dataset_type=f"llm-release/{result.eval_set}",
            dataset_name=result.eval_set,
            dataset_revision=None if result.version is None else str(result.version),
            metric_type=metric,
            metric_name=metric,
            metric_value=round(score.value, 6),
        )
        for result in evals
        for metric, score in sorted(result.metrics.items())
    ]
    data = ModelCardData(
        model_name=repo_id.split("/", 1)[1],
        base_model=lineage.upstream_repo,
        pipeline_tag=TASK_TYPE,
        tags=["llm-release", "compressed-tensors", lineage.scheme.lower()],
        eval_results=results or None,
        quantization={"scheme": lineage.scheme, "format": "compressed-tensors"},
        llm_release=lineage.model_dump(mode="json"),
    )
    rows = [
        f"| {r.eval_set} | {m} | {_fmt(s.value)} | {_fmt(s.ci_low)} | {_fmt(s.ci_high)} "
        f"| {r.num_items} |"
        for r in evals
        for m, s in sorted(r.metrics.items())
    ]
    files = [f"| `{path}` | `{sha}` |" for path, sha in sorted(lineage.files.items())]
    body = "\n".join(
        [
            f"# {repo_id}",
            "",
            f"`{lineage.upstream_repo}` at commit `{lineage.upstream_commit}`, quantized "
            f"{lineage.scheme} (candidate `{lineage.candidate}`) and released by llm-release "
            f"as `{lineage.release_id}` after its canary reached 100%.",
            "",
            "## Evaluation",
            "",
            "| eval set | metric | score | 95% CI low | 95% CI high | items |",
            "|---|---|---|---|---|---|",
            *(rows or ["| (none recorded) | | | | | |"]),
            "",
            "## Lineage",
            "",
            f"- upstream: `{lineage.upstream_repo}` commit `{lineage.upstream_commit}`",
            f"- scheme: {lineage.scheme}; quantization cache key `{lineage.cache_key}`",
            f"- calibration set: {lineage.calibration_set} "
            f"(SHA-256 `{lineage.calibration_sha256}`)",
            f"- release run: {lineage.run_id}",
            "",
            "| file | SHA-256 |",
            "|---|---|",
            *files,
            "",
        ]
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


# ---------------------------------------------------------------- the upload


@contextlib.contextmanager
def _xet(enabled: bool) -> Iterator[None]:
    from huggingface_hub import constants

    with _XET_LOCK:
        before = constants.HF_HUB_DISABLE_XET
        constants.HF_HUB_DISABLE_XET = not enabled
        try:
            yield
        finally:
            constants.HF_HUB_DISABLE_XET = before


def _stage(model_dir: Path, exclude: tuple[str, ...], into: Path) -> dict[str, str]:
    """``model_dir``'s files (``exclude`` aside) linked into ``into``; their SHA-256s."""
    hashes = {}
    for file in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = file.relative_to(model_dir).as_posix()
        if rel in exclude or rel == CARD or file.is_symlink():
            continue
        target = into / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(file, target)
        except OSError:
            shutil.copy2(file, target)
        hashes[rel] = sha256_file(target)
    if not hashes:
        raise PublishError(
            f"nothing to publish: {model_dir} has no files",
            hint="publish a released candidate's quantized folder",
        )
    return hashes


def _hub_error(exc: Exception, target: PublishTarget) -> PublishError:
    text = " ".join(str(exc).split())[:400]
    return PublishError(
        f"publishing to {target.repo_id} on {target.endpoint} failed: {text}",
        hint=f"check that the hub is up and that {env_name('publish_token')} (or the "
        "environment's token, where it may go) may write to the repo; the release itself "
        "is serving and unaffected",
    )


def publish(
    model_dir: Path,
    lineage: Lineage,
    evals: list[EvalResult],
    target: PublishTarget,
    *,
    exclude: tuple[str, ...] = (),
    progress: Callable[[str], None] | None = None,
) -> Published:
    """Publish ``model_dir`` (its files, ``exclude`` aside) with a model card as a new
    commit of ``target.repo_id``'s main branch; the hub's listing of that commit is read
    back and checked against the bytes sent."""
    say = progress or logger.info
    # Only the project's own model folders go up (the upload replaces the repo's files).
    real = paths.own_model_folder(model_dir)
    if real is None:
        raise PublishError(
            f"{str(model_dir)[:300]!r} is not one of the project's model folders "
            f"({' or '.join(str(root) for root in paths.model_roots())})",
            hint="publish a released candidate's folder, as the release record names it",
        )
    model_dir = real
    if not model_dir.is_dir():
        raise PublishError(
            f"{model_dir} is not a folder", hint="the release's model folder was removed"
        )
    endpoint = credentials.check_hub_endpoint(target.endpoint)
    token = credentials.token_for(endpoint, target.token)
    try:
        return _publish(model_dir, lineage, evals, target, endpoint, token, exclude, say)
    except OSError as exc:  # the staging folder: disk full, permissions
        raise PublishError(
            f"publishing {lineage.release_id}: {type(exc).__name__}: {exc}",
            hint=f"free space or fix permissions under {paths.home() / 'publish'}; the "
            "release itself is serving and unaffected",
        ) from None


def _publish(model_dir, lineage, evals, target, endpoint, token, exclude, say) -> Published:
    from huggingface_hub import HfApi

    root = paths.home() / "publish"
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix="stage-") as where:
        stage = Path(where)
        files = _stage(model_dir, exclude, stage)
        lineage = lineage.model_copy(update={"files": files})
        card = build_card(target.repo_id, lineage, evals)
        card.save(stage / CARD)
        files = {**files, CARD: sha256_file(stage / CARD)}
        say(f"publishing {len(files)} files of {lineage.release_id} to {target.repo_id}")
        api = HfApi(endpoint=endpoint, token=token)
        try:
            with _xet(target.xet):
                api.create_repo(target.repo_id, repo_type="model", exist_ok=True)
                info = api.upload_folder(
                    repo_id=target.repo_id,
                    folder_path=stage,
                    revision=BRANCH,
                    # The revision is the release's folder: files of an earlier one go.
                    delete_patterns="*",
                    commit_message=f"Publish {lineage.release_id}",
                    commit_description=f"{lineage.upstream_repo}@{lineage.upstream_commit}, "
                    f"{lineage.scheme}",
                )
        except ReleaseError:
            raise
        except Exception as exc:  # the client's HTTP and validation errors
            raise _hub_error(exc, target) from exc
        commit = info.oid
        _check_listing(target, commit, stage, files)
    say(f"published {lineage.release_id} as {target.repo_id}@{commit}")
    return Published(repo_id=target.repo_id, commit=commit, endpoint=endpoint, files=files)


def _check_listing(target: PublishTarget, commit: str, stage: Path, files: dict) -> None:
    """The hub's published hashes of ``commit`` are the bytes sent, file for file."""
    source = SourceConfig(repo_id=target.repo_id, revision=commit, endpoint=target.endpoint)
    listed_commit, listed = resolve(source, token=target.token)
    remote = {f.path: f for f in listed}
    wrong = []
    for path, sha in files.items():
        entry = remote.get(path)
        if entry is None:
            wrong.append(f"{path} (missing)")
        elif entry.sha256 is not None and entry.sha256 != sha:
            wrong.append(f"{path} (sha256 {entry.sha256})")
        elif entry.sha256 is None and entry.blob_id != git_blob_sha1(stage / path):
            wrong.append(f"{path} (blob {entry.blob_id})")
    extra = sorted(set(remote) - set(files))
    if listed_commit != commit or wrong or extra:
        raise PublishError(
            f"{target.repo_id}@{commit} on {target.endpoint} does not list the bytes sent: "
            f"{', '.join(wrong + [f'{p} (not sent)' for p in extra])[:400] or listed_commit}",
            hint="the repo changed during the upload or the hub stored other bytes; publish "
            "again, and check the hub",
        )
