"""Prometheus, started by the project: it scrapes every vLLM server behind the router and
HAProxy's own exporter, each series labelled with the service, the release and its role,
and sends the alerts that fire to the project's Alertmanager (``alertmanager.py``).

Scrape targets come from ``file_sd`` files written atomically from the release registry:
Prometheus re-reads them when they change, so a deploy, promotion or rollback never
restarts it. Its TSDB lives under the project home and outlives 'make down', so the next
'make demo' adds to the same history. It listens on 127.0.0.1 only, with neither the
lifecycle nor the admin API enabled (reload is SIGHUP, from the user that started it).

``PrometheusClient`` speaks the HTTP query API of any Prometheus, so the canary analysis
can run against a team's own server as well as this one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import time
from collections.abc import Collection
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families
from requests.adapters import HTTPAdapter

from llm_release import paths, server_key
from llm_release.canary import basic_auth
from llm_release.canary.daemon import Daemon
from llm_release.canary.router import BACKEND
from llm_release.errors import MetricsError
from llm_release.fileio import atomic_write_text
from llm_release.registry import RegistryState
from llm_release.serving import processes
from llm_release.settings import settings

PORT_ENV = "LLM_RELEASE_PROMETHEUS_PORT"
# 5 s: a 60-s analysis window then holds 12 samples of every series (rate() needs 2, and
# Prometheus' rule of thumb is a range of at least 4 scrape intervals, so windows down to
# 20 s still work), and a short queue or KV-cache spike is seen by max_over_time. Cost,
# measured on a 2-core host at load average ~9: a vLLM CPU 0.32 scrape is 420 samples,
# 50 KB, 25-55 ms (HAProxy's: 353 samples, 4 ms), i.e. about 1% of the interval per server.
# 1 s would cost 5x that on the CPU the servers share; 15 s would leave a 60-s window 4.
SCRAPE_INTERVAL_S = 5.0
# History kept for comparing releases over days; the cap protects a small disk.
RETENTION = ("30d", "2GB")
VLLM_JOB = "vllm"
ALERTMANAGER_FILE = "alertmanager.json"
HAPROXY_JOB = "haproxy"
# The supervisors of the process backend's serving releases (restarts, crash loop).
SUPERVISOR_JOB = "supervisor"


def default_port() -> int:
    """``LLM_RELEASE_PROMETHEUS_PORT`` (9090). ``auto``: 0, a free port picked when Prometheus
    starts and recorded beside it (tests: a port picked minutes before the start can be taken
    by then by another server of the same run)."""
    port = settings().prometheus_port
    return 0 if port == "auto" else port


def _duration(seconds: float) -> str:
    """A Prometheus duration (milliseconds are exact for any interval we allow)."""
    return f"{round(seconds * 1000)}ms"


def render_config(
    directory: Path,
    scrape_interval_s: float = SCRAPE_INTERVAL_S,
    alertmanager_dir: Path | None = None,
    server_key_file: Path | None = None,
) -> str:
    """Prometheus' config; its alerts go to the Alertmanager whose files live under
    ``alertmanager_dir`` (the project's own by default) with that one's credentials. The
    vLLM servers and HAProxy's exporter are scraped with the servers' key
    (``server_key_file``, default the home's: ``llm_release.server_key``)."""
    directory = Path(directory)
    alertmanager_dir = alertmanager_dir or paths.alertmanager_dir()
    # Read by Prometheus at each scrape, like the Alertmanager password; it must exist
    # when the config is loaded (made now if no server made it yet).
    if server_key_file is None:
        server_key.key()
        server_key_file = server_key.key_path()
    server_auth = {"type": "Bearer", "credentials_file": str(server_key_file)}
    interval = _duration(scrape_interval_s)
    config = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(directory / "rules" / "*.yml")],
        # Firing alerts go to the project's Alertmanager; its address is a file_sd file, so
        # an Alertmanager started on another port is followed without a reload. It asks for
        # basic auth: the password is read from its file at each send.
        "alerting": {
            "alertmanagers": [
                {
                    "basic_auth": basic_auth.basic_auth(basic_auth.password_path(alertmanager_dir)),
                    "file_sd_configs": [
                        {"files": [str(directory / "targets" / ALERTMANAGER_FILE)]}
                    ],
                }
            ]
        },
        "scrape_configs": [
            {
                "job_name": VLLM_JOB,
                "authorization": server_auth,
                "file_sd_configs": [{"files": [str(directory / "targets" / "vllm.json")]}],
            },
            {
                "job_name": HAPROXY_JOB,
                "authorization": server_auth,
                "file_sd_configs": [{"files": [str(directory / "targets" / "haproxy.json")]}],
                # HAProxy names the slot in its 'server' label; copying it to 'role' lets
                # one selector ({service=..., role=...}) pick both sources of a role.
                "metric_relabel_configs": [
                    {
                        "source_labels": ["proxy", "server"],
                        "regex": f"{BACKEND};(stable|canary)",
                        "target_label": "role",
                        "replacement": "$1",
                    }
                ],
            },
            {
                "job_name": SUPERVISOR_JOB,
                "authorization": server_auth,
                "file_sd_configs": [{"files": [str(directory / "targets" / "supervisor.json")]}],
            },
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def service_name(state: RegistryState) -> str | None:
    """The name clients call the service by (the stable release's, else the canary's)."""
    release = state.stable or state.canary
    return release.public_name if release else None


def render_targets(
    state: RegistryState, haproxy_metrics_port: int | None
) -> tuple[list[dict], list[dict]]:
    """file_sd entries for the registry's vLLM servers and for HAProxy's exporter."""
    service = service_name(state)
    vllm = [
        {
            "targets": [f"127.0.0.1:{int(release.port)}"],
            "labels": {"service": service, "release": release.release_id, "role": role},
        }
        for role, release in (("stable", state.stable), ("canary", state.canary))
        if release is not None
    ]
    haproxy = []
    if haproxy_metrics_port is not None and service is not None:
        haproxy.append(
            {"targets": [f"127.0.0.1:{int(haproxy_metrics_port)}"], "labels": {"service": service}}
        )
    return vllm, haproxy


def render_supervisor_targets(state: RegistryState) -> list[dict]:
    """file_sd entries for the supervisors of the registry's releases (process backend)."""
    service = service_name(state)
    return [
        {
            "targets": [f"127.0.0.1:{int(release.supervisor_port)}"],
            "labels": {"service": service, "release": release.release_id, "role": role},
        }
        for role, release in (("stable", state.stable), ("canary", state.canary))
        if release is not None and release.supervisor_port is not None
    ]


def scraped_values(text: str, names: Collection[str]) -> list[float]:
    """The values of the samples named in ``names`` on a ``/metrics`` page (the Prometheus
    text exposition format, read by prometheus_client's parser), one per series; ValueError
    when the page does not parse."""
    return [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in names
    ]


# The errorType values of Prometheus' HTTP API: the only words of a reply an error repeats.
ERROR_TYPES = frozenset(
    {"timeout", "canceled", "execution", "bad_data", "internal", "unavailable", "not_found"}
)


@dataclass(frozen=True)
class Sample:
    """One series of an instant query's answer; ``value`` may be NaN (e.g. a quantile of
    a histogram that saw nothing in the window)."""

    labels: dict[str, str] = field(default_factory=dict)
    value: float = math.nan


def _samples(data: object) -> list[Sample]:
    """An instant query's ``data``: a vector's series or a scalar; MetricsError for any other
    result type, which is named only when it is one of the API's."""
    kind, result = data.get("resultType"), data.get("result")  # type: ignore[union-attr]
    if kind == "vector":
        return [Sample(dict(r.get("metric", {})), float(r["value"][1])) for r in result]
    if kind == "scalar":
        return [Sample({}, float(result[1]))]
    shown = kind if kind in ("matrix", "string") else "result of another type"
    raise MetricsError(f"the query returned a {shown}, not an instant vector or a scalar")


class _PinnedTLS(HTTPAdapter):
    """TLS to an address with the URL's name for SNI and the certificate check."""

    def __init__(self, hostname: str) -> None:
        self.hostname = hostname
        super().__init__()

    def init_poolmanager(self, *args, **kwargs) -> None:
        kwargs["server_hostname"] = self.hostname
        kwargs["assert_hostname"] = self.hostname
        super().init_poolmanager(*args, **kwargs)


@contextmanager
def _session(url: str, pinned: str | None):
    """A session for ``url``, the base it sends to and its headers: with ``pinned``, the
    base names the address (the name goes in Host, and for https in SNI)."""
    with requests.Session() as session:
        if pinned is None:
            yield session, url, {}
            return
        parts = urlsplit(url)
        address = f"[{pinned}]" if ":" in pinned else pinned
        netloc = f"{address}:{parts.port}" if parts.port else address
        if parts.scheme == "https":
            session.mount("https://", _PinnedTLS(parts.hostname or ""))
        base = urlunsplit((parts.scheme, netloc, parts.path, "", ""))
        yield session, base, {"Host": parts.netloc.rpartition("@")[2]}


class PrometheusClient:
    """The instant-query API of any Prometheus (the project's own or a team's)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        auth: tuple[str, str] | None = None,
        pinned: str | None = None,
    ) -> None:
        """``auth``: the project's own Prometheus' user and password (never sent to a
        Prometheus a run named). ``pinned``: the address ``url``'s name was checked at
        (``credentials.pinned_prometheus_url``); every connection goes there, with the
        name in the Host header and, over TLS, in SNI and the certificate check."""
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.auth = auth
        self.pinned = pinned

    def _post(self, path: str, **params: str) -> requests.Response:
        try:
            # No redirects: a Prometheus named by a run must not send the query on to an
            # address its URL was checked against (a metadata service, our own servers).
            with _session(self.url, self.pinned) as (session, base, headers):
                reply = session.post(
                    f"{base}{path}",
                    data=params,
                    headers=headers,
                    auth=self.auth,
                    timeout=self.timeout_s,
                    allow_redirects=False,
                )
        except requests.RequestException as exc:
            raise MetricsError(
                f"Prometheus at {self.url} did not answer: {type(exc).__name__}",
                hint="is it running? the project's own starts with a release "
                "('llm-release down' stops it); check analysis.prometheus_url",
            ) from None
        return reply

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` at ``at`` (Unix seconds; now if None).

        The answer may come from a team's server a run named: a refusal or a malformed
        answer is a MetricsError with the status code and Prometheus' error type (one of
        its own few words), never the text of the reply."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        reply = self._post("/api/v1/query", **params)
        try:
            body = reply.json()
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else {}
        if reply.status_code != 200 or body.get("status") != "success":
            kind = body.get("errorType")
            detail = f"HTTP {reply.status_code}"
            if kind in ERROR_TYPES:
                detail += f", {kind}"
            raise MetricsError(
                f"Prometheus at {self.url} refused a query ({detail})",
                hint="the queries are in src/llm_release/canary/canary_queries.yaml; try one in "
                "the Prometheus UI",
            )
        try:
            return _samples(body.get("data"))
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise MetricsError(
                f"Prometheus at {self.url} sent a malformed answer ({type(exc).__name__})",
                hint="check analysis.prometheus_url names a Prometheus",
            ) from None

    def value(self, promql: str, at: float | None = None) -> float | None:
        """The one number ``promql`` yields; None when it yields nothing or NaN (no data)."""
        samples = self.query(promql, at)
        if len(samples) > 1:
            raise MetricsError(
                f"the query returned {len(samples)} series where one was expected",
                hint="aggregate it (sum, max) so it yields one number",
            )
        if not samples or math.isnan(samples[0].value):
            return None
        return samples[0].value


class Prometheus(Daemon):
    """The Prometheus process whose files live under ``directory``.

    ``port`` None: the port the running instance was started on, else
    ``LLM_RELEASE_PROMETHEUS_PORT`` (9090).
    """

    name = "Prometheus"
    error = MetricsError
    port_env = PORT_ENV
    stop_grace_s = 15.0  # its head block; a TSDB killed hard replays its WAL next time

    def __init__(
        self,
        directory: Path,
        port: int | None = None,
        *,
        scrape_interval_s: float = SCRAPE_INTERVAL_S,
    ) -> None:
        self.directory = Path(directory)
        self.config_path = self.directory / "prometheus.yml"
        self.pid_path = self.directory / "prometheus.pid"
        self.port_path = self.directory / "port"
        # Its API asks for basic auth (basic_auth.py): no other local user reads the
        # servers' traffic or queries it.
        self.credentials = basic_auth.Credentials(self.directory, what="Prometheus")
        self.log_path = self.directory / "prometheus.log"
        self.data_dir = self.directory / "data"
        self.rules_dir = self.directory / "rules"
        self.targets_dir = self.directory / "targets"
        self.scrape_interval_s = scrape_interval_s
        if port is None:
            port = self.recorded_port()
        self.port = port or default_port()

    @property
    def client(self) -> PrometheusClient:
        return PrometheusClient(self.url, auth=self.http_auth())

    def http_auth(self) -> tuple[str, str]:
        return self.credentials.auth

    def locked(self) -> bool:
        """It runs with the project's web config (one started by an older version runs
        open: ``ensure_running`` restarts it)."""
        pid = self.pid()
        return pid is not None and processes.is_same(
            pid, None, cmdline_has=f"--web.config.file={self.credentials.web_config_path}"
        )

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        return self.client.query(promql, at)

    # -- process -------------------------------------------------------------------------
    def _start(self, timeout_s: float) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise MetricsError(
                "prometheus is not installed",
                hint="run 'make setup' (it runs apt-get install -y prometheus) and try again",
            )
        for directory in (self.data_dir, self.rules_dir, self.targets_dir):
            directory.mkdir(parents=True, exist_ok=True)
        for name in ("vllm.json", "haproxy.json", ALERTMANAGER_FILE):
            if not (self.targets_dir / name).exists():
                atomic_write_text(self.targets_dir / name, "[]\n")
        atomic_write_text(self.config_path, self.render())
        self.credentials.ensure()
        command = [
            binary,
            f"--config.file={self.config_path}",
            f"--web.config.file={self.credentials.web_config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={RETENTION[0]}",
            f"--storage.tsdb.retention.size={RETENTION[1]}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        self.spawn(command, timeout_s)

    def _failure_hint(self, tail: str) -> str | None:
        if "lock DB directory" in tail:
            return f"another Prometheus uses {self.data_dir}; stop it ('llm-release down')"
        return None

    def render(self) -> str:
        return render_config(self.directory, self.scrape_interval_s)

    def ensure_running(self) -> Prometheus:
        """Start it, or give the running one the config of this version (one started by
        an older version sent alerts to Alertmanager without its credentials); one running
        open (started by an older version) is restarted locked, its TSDB kept."""
        if self.running() and not self.locked():
            self.stop()
        if not self.running():
            self.start()
        elif self.config_path.read_text() != self.render():
            atomic_write_text(self.config_path, self.render())
            self.reload()
        return self

    def _reload_state(self) -> tuple[float, float]:
        text = requests.get(f"{self.url}/metrics", auth=self.http_auth(), timeout=5).text

        def value(name: str, missing: float) -> float:
            try:
                values = scraped_values(text, {name})
            except ValueError:  # a page that does not parse says nothing: not reloaded yet
                return missing
            return values[0] if values else missing

        return (
            value("prometheus_config_last_reload_successful", math.nan),
            value("prometheus_config_last_reload_success_timestamp_seconds", 0.0),
        )

    def reload(self, timeout_s: float = 15.0) -> None:
        """Re-read the config and the rule files (SIGHUP); MetricsError if it refused them."""
        pid = self.pid()
        if pid is None:
            raise MetricsError("Prometheus is not running", hint="start it with a release")
        _, before = self._reload_state()
        os.kill(pid, signal.SIGHUP)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ok, at = self._reload_state()
            if ok == 0:
                raise MetricsError(
                    f"Prometheus refused its new config or rules:\n{self.log_tail()}",
                    hint=f"check {self.config_path} and {self.rules_dir} with promtool",
                )
            if at > before:
                return
            time.sleep(0.1)
        raise MetricsError(f"Prometheus did not reload within {timeout_s:.0f} s")

    # -- targets -------------------------------------------------------------------------
    def write_targets(self, state: RegistryState, haproxy_metrics_port: int | None) -> None:
        vllm, haproxy = render_targets(state, haproxy_metrics_port)
        # Atomic: Prometheus never reads half a file (it would drop every target of it).
        atomic_write_text(self.targets_dir / "vllm.json", json.dumps(vllm, indent=2) + "\n")
        atomic_write_text(self.targets_dir / "haproxy.json", json.dumps(haproxy, indent=2) + "\n")
        supervisors = render_supervisor_targets(state)
        atomic_write_text(
            self.targets_dir / "supervisor.json", json.dumps(supervisors, indent=2) + "\n"
        )

    def write_alertmanagers(self, addresses: list[str]) -> None:
        """The Alertmanagers (host:port) that firing alerts are sent to."""
        entries = [{"targets": list(addresses)}] if addresses else []
        atomic_write_text(self.targets_dir / ALERTMANAGER_FILE, json.dumps(entries) + "\n")


def for_home() -> Prometheus:
    """The project's own Prometheus (under the project home)."""
    return Prometheus(paths.prometheus_dir())


def sync_targets(
    state: RegistryState,
    haproxy_metrics_port: int | None = None,
    alertmanager_address: str | None = None,
) -> Prometheus:
    """Point the project's Prometheus at the registry's releases (and HAProxy's exporter)
    and its alerts at ``alertmanager_address`` (host:port); start it if it is not running."""
    prometheus = for_home()
    prometheus.write_targets(state, haproxy_metrics_port)
    if alertmanager_address is not None:
        prometheus.write_alertmanagers([alertmanager_address])
    return prometheus.ensure_running()
