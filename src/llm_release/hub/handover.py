"""A candidate handed from host to host through the hub (the fleet: docs/fleet.md).

A candidate quantized on one host is measured on another. Nothing is copied by hand: the
quantizing host publishes the candidate's folder once, as one commit of a repo of its own on
the fleet's hub (``hand_over``: ``hub.publish.publish``, whose listing of that commit is read
back against the bytes sent), and the measuring host downloads that commit as it downloads
any model (``receive``: ``hub.acquire``, every file proven against the hub's listing), then
checks the folder against the hashes the hand-over carried in the run's parameters, so a
hub whose files changed between the two (or a forged listing) fails before anything is
served. The caller leaves the quantization record home (``exclude``: it names the
quantizing host's paths).

A ``Handover`` arrives as a flow run's parameter, so it is input: its repo id, commit, paths
and hashes are held to patterns before any request.

The fleet's hub is the operator's (``fleet_hub``: ``LLM_RELEASE_FLEET_HUB_ENDPOINT``,
``_ORG`` and ``_CREDENTIALS``, the name of a saved HubCredentials block whose write token
goes to that endpoint only), never a run's parameter.

The baseline (the release's unquantized model, acquired from the release's source at a
commit with every file proven) is not handed over when that source is a hub and the
operator leaves ``LLM_RELEASE_FLEET_BASELINE`` at ``upstream`` (``from_upstream``): its
``Handover`` names the release's source at that commit (``upstream_handover``: the endpoint
the release host acquired from, the hashes of its acquire manifest, and in ``Upstream`` the
hub's kind, the file selection and the name, never the token, of the source's credentials
block), and the measuring host downloads it from there as the release host did, then holds
it to those hashes. Nothing is uploaded for it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from llm_release.config import MAX_LIST, MAX_REVISION, REPO_ID, SourceConfig
from llm_release.errors import AcquireError, ConfigError
from llm_release.hub import credentials
from llm_release.hub.acquire import (
    Acquired,
    TransferSettings,
    acquire,
    proven_hashes,
    selected,
)
from llm_release.hub.credentials import HubToken
from llm_release.hub.publish import Lineage, PublishTarget, publish
from llm_release.settings import FleetBaseline, env_name, settings

MAX_FILES = 10_000
# a file of a model folder as the hub lists it: relative, no '..', no control characters
FILE_PATH = re.compile(r"(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_.][A-Za-z0-9_./-]{0,499}")
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_REPO_NAME = 96
# a branch or tag (ModelScope's revision): no '..', no leading '-' or '/', no control chars
REVISION = re.compile(r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_./-]*")
# a Prefect block document's name (Prefect's own rule: lower-case letters, digits, '-')
BLOCK_NAME = r"[a-z0-9-]{1,100}"
# an allow_patterns entry: an fnmatch pattern of a file path, printable
FILE_PATTERN = r"[ -~]{1,200}"


class Upstream(BaseModel):
    """The release's own source, whence a measuring host fetches the baseline itself (no
    hand-over repo): what its ``acquire`` needs besides the repo, commit and endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hub: Literal["huggingface", "modelscope"]
    revision: str | None = Field(
        None,
        max_length=MAX_REVISION,
        description="ModelScope's revision as the release named it (its commit is the content "
        "address of the listing, not a revision to ask for); None: the commit",
    )
    allow_patterns: list[Annotated[str, Field(pattern=f"^{FILE_PATTERN}$")]] | None = Field(
        None, max_length=MAX_LIST, description="the source's file selection, as acquired"
    )
    credentials_block: str | None = Field(
        None,
        pattern=f"^{BLOCK_NAME}$",
        description="the name of the source's HubCredentials block, loaded by the measuring "
        "host itself; never a token",
    )

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        if value is not None and not REVISION.fullmatch(value):
            raise ValueError(f"revision {ascii(value[:80])} is not a branch or tag name")
        return value


class Handover(BaseModel):
    """Where a candidate went and what its files were when its host published them; or,
    with ``upstream``, the release's source at the commit its host acquired, and what its
    files were there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo_id: str = Field(pattern=f"^{REPO_ID}$", max_length=MAX_REPO_NAME)
    commit: str = Field(pattern=r"^[0-9a-f]{40}$")
    endpoint: str = Field(max_length=2000)
    files: dict[str, str] = Field(description="path: SHA-256, as published")
    upstream: Upstream | None = Field(
        None, description="set: fetched from the release's source, not the fleet's hub"
    )

    def source(self) -> SourceConfig:
        """What the measuring host downloads: that commit of that repo at that endpoint."""
        up = self.upstream
        if up is None:
            return SourceConfig(repo_id=self.repo_id, revision=self.commit, endpoint=self.endpoint)
        return SourceConfig(
            hub=up.hub,
            repo_id=self.repo_id,
            revision=up.revision or self.commit,
            endpoint=self.endpoint,
            allow_patterns=up.allow_patterns,
            credentials_block=up.credentials_block,
        )

    @field_validator("files")
    @classmethod
    def _files(cls, value: dict[str, str]) -> dict[str, str]:
        if not value or len(value) > MAX_FILES:
            raise ValueError(f"files: 1 to {MAX_FILES} paths")
        for path, sha in value.items():
            if not FILE_PATH.fullmatch(path) or not SHA256.fullmatch(sha):
                raise ValueError(f"files: {ascii(path[:80])} is not a model file with its SHA-256")
        return value


def from_upstream(role: str, source_hub: str, mode: FleetBaseline) -> bool:
    """Whether a contender measured on another host is fetched there from the release's
    source rather than handed over through the fleet's hub: the baseline alone (the
    unquantized model its host acquired from that source at a commit, every file proven),
    when that source is a hub the measuring host can ask too (not a local folder) and the
    operator did not keep hand-overs (``LLM_RELEASE_FLEET_BASELINE=handover``)."""
    return role == "baseline" and source_hub != "local" and mode == "upstream"


def upstream_handover(source: SourceConfig, acquired: Acquired) -> Handover:
    """The baseline as the measuring host fetches it: the release's source (``source``, its
    hub, revision, file selection and credentials block's name) at the commit ``acquired``
    names, from the endpoint the release host acquired it from, held to the SHA-256 of every
    file the release host proved (its acquire manifest, the source's selection of it)."""
    if source.hub == "local" or acquired.endpoint is None:
        raise AcquireError(
            f"{acquired.repo_id}@{acquired.commit[:12]} was not acquired from a hub: the "
            "measuring host cannot fetch it from its source",
            hint=f"hand it over through the fleet's hub ({env_name('fleet_baseline')}=handover)",
        )
    files = selected(proven_hashes(acquired.manifest_path), source.allow_patterns)
    upstream = Upstream(
        hub=source.hub,
        revision=source.revision if source.hub == "modelscope" else None,
        allow_patterns=source.allow_patterns,
        credentials_block=source.credentials_block,
    )
    return Handover(
        repo_id=acquired.repo_id,
        commit=acquired.commit,
        endpoint=acquired.endpoint,
        files=files,
        upstream=upstream,
    )


def repo_for(org: str, upstream_repo: str, candidate: str, run_id: str) -> str:
    """The hub repo a run's candidate is handed over in: one per candidate and run (a
    publish replaces a repo's files), named so that a person reading the hub knows it."""
    name = f"{upstream_repo.split('/')[-1]}-{candidate}-{run_id}".lower()
    name = re.sub(r"[^a-z0-9_.-]+", "-", name).strip("-.")[: MAX_REPO_NAME - len(org) - 1]
    repo = f"{org}/{name}"
    if not re.fullmatch(REPO_ID, repo):
        raise AcquireError(f"no hand-over repo name can be made of {ascii(repo[:120])}")
    return repo


class FleetHub(BaseModel):
    """The fleet's hub as the operator set it: where candidates are handed over (one repo
    per candidate and run under ``org``), and the write token bound to its endpoint."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoint: str
    org: str
    token: HubToken | None = None

    def target(self, upstream_repo: str, candidate: str, run_id: str) -> PublishTarget:
        return PublishTarget(
            repo_id=repo_for(self.org, upstream_repo, candidate, run_id),
            endpoint=self.endpoint,
            token=self.token,
        )


def fleet_hub(saved_endpoint: str | None = None, saved_token: SecretStr | None = None) -> FleetHub:
    """The fleet's hub from the operator's settings, past the endpoint policy. With
    ``LLM_RELEASE_FLEET_HUB_CREDENTIALS`` set, the caller passes that block's endpoint and
    token (``saved_*``): a block saved for another endpoint, or without a token, is refused
    (its token never goes elsewhere). Unset endpoint or org: a ``ConfigError`` naming them,
    before any request."""
    current = settings()
    url, org = current.fleet_hub_endpoint, current.fleet_hub_org
    if url is None or org is None:
        missing = [
            env_name(f)
            for f, v in (("fleet_hub_endpoint", url), ("fleet_hub_org", org))
            if v is None
        ]
        raise ConfigError(
            f"a contender measured on another host of the fleet is handed over through the "
            f"fleet's hub, and {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
            "unset",
            hint=f"set {env_name('fleet_hub_endpoint')}, {env_name('fleet_hub_org')} and "
            f"{env_name('fleet_hub_credentials')} (a HubCredentials block with a write token "
            "for that hub) in the worker's environment (docs/fleet.md)",
        )
    name = env_name("fleet_hub_endpoint")
    try:
        endpoint = credentials.check_endpoint(url)
    except ValueError as exc:
        raise ConfigError(
            f"{name}: {str(exc).split(';')[0]}",
            hint=f"set {name} to the fleet hub's plain http(s) URL, without credentials",
        ) from None
    endpoint = credentials.check_hub_endpoint(endpoint)
    token = None
    block = current.fleet_hub_credentials
    if block:
        own = credentials.check_endpoint(saved_endpoint or credentials.HF_DEFAULT_ENDPOINT)
        if not credentials.same_endpoint(endpoint, own):
            raise ConfigError(
                f"{env_name('fleet_hub_credentials')}: the credentials block {block!r} was "
                f"saved for {own}, not for the fleet's hub {endpoint}",
                hint="save a HubCredentials block for the fleet hub's endpoint and name it "
                "there; a saved token is sent only to its own endpoint",
            )
        if saved_token is None:
            raise ConfigError(
                f"{env_name('fleet_hub_credentials')}: the credentials block {block!r} holds "
                "no token",
                hint="save the block with a write token for the fleet's hub",
            )
        token = HubToken(endpoint=endpoint, token=saved_token)
    return FleetHub(endpoint=endpoint, org=org, token=token)


def hand_over(
    model_dir: Path,
    target: PublishTarget,
    *,
    run_id: str,
    candidate: str,
    scheme: str,
    upstream_repo: str,
    upstream_commit: str,
    exclude: tuple[str, ...] = (),
) -> Handover:
    """Publish the candidate's folder (``exclude`` aside) as one commit of
    ``target.repo_id``; what a measuring host needs to fetch it and prove it."""
    lineage = Lineage(
        upstream_repo=upstream_repo,
        upstream_commit=upstream_commit,
        release_id=f"{candidate}-{run_id}",
        candidate=candidate,
        scheme=scheme,
        run_id=run_id,
    )
    published = publish(model_dir, lineage, [], target, exclude=exclude)
    return Handover.model_validate(published.model_dump())  # held to a parameter's rules


def receive(
    handover: Handover,
    *,
    token: HubToken | None = None,
    settings: TransferSettings | None = None,
) -> Path:
    """The handed-over candidate's folder on this host: downloaded at its commit (every file
    proven against the hub's listing), then held to the hashes the hand-over carried. A
    baseline fetched from the release's source (``handover.upstream``) is downloaded from
    there, with that source's file selection, and held to the hashes its host proved."""
    up = handover.upstream
    try:
        acquired = acquire(handover.source(), token=token, settings=settings)
    except AcquireError as exc:
        if up is None:
            raise
        # a measuring host that does not reach the source (an air-gapped fleet) is told how
        # to have the baseline handed over instead
        fix = (
            f"set {env_name('fleet_baseline')}=handover on the release host if this host "
            "cannot reach the source's hub"
        )
        raise type(exc)(
            f"the baseline was not fetched from the release's source: {exc.message}",
            hint=f"{exc.hint}; or {fix}" if exc.hint else fix,
        ) from exc
    # acquire hashed every file as it proved it and wrote the hashes in its manifest: read
    # them there rather than hashing the weights a second time
    here = selected(proven_hashes(acquired.manifest_path), up.allow_patterns if up else None)
    missing = sorted(set(handover.files) - set(here))
    extra = sorted(set(here) - set(handover.files))
    changed = sorted(p for p, sha in handover.files.items() if p in here and here[p] != sha)
    if acquired.commit != handover.commit or missing or extra or changed:
        what = (
            ([f"commit {acquired.commit[:12]}"] if acquired.commit != handover.commit else [])
            + [f"missing {p}" for p in missing[:3]]
            + [f"not published {p}" for p in extra[:3]]
            + [f"changed {p}" for p in changed[:3]]
        )
        found = ", ".join(ascii(w)[1:-1] for w in what)
        if up is not None:
            raise AcquireError(
                f"{handover.repo_id}@{handover.commit[:12]} at {handover.endpoint} is not what "
                f"the release host acquired: {found}",
                hint="the source serves other files for that commit than it served the release "
                f"host: check the hub (or its mirror), or set {env_name('fleet_baseline')}="
                "handover on the release host to hand the baseline over instead",
            )
        raise AcquireError(
            f"{handover.repo_id}@{handover.commit[:12]} is not what its host handed over: " + found,
            hint="the hub's files changed after the candidate was published: quantize and "
            "hand it over again (the run's measurement of it is void)",
        )
    return acquired.model_dir
