"""Alertmanager, started by the project beside Prometheus: the alerts of the installed rules
(``canary/alerts.py``) go from Prometheus to it, and from it to the operator's webhook.

The config is rendered here and checked by ``amtool check-config`` before it is installed,
as the rules are by ``promtool``. One incident pages once: a service's alerts are one group
(its first notification waits ``group_wait`` for the alerts that start with it), a critical
alert of a service inhibits its warnings, the stable server being down inhibits the other
critical alerts it causes, and a group that keeps firing notifies again only after
``repeat_interval``. Its notification log lives under the project home and outlives
'llm-release down', so a restarted Alertmanager does not page again for what it sent.

The webhook URL is an operator setting, never a run's input: ``python -m flows.control
--webhook-url URL`` (``make prefect-up NOTIFY_WEBHOOK=URL``) saves it under the project home,
the same URL the Prefect automations post failed runs and rollbacks to. Without one,
Alertmanager holds the alerts (its UI and ``amtool alert`` show them) and notifies nobody.
The files holding the URL are written 0600 (it often carries the chat tool's token).

It listens on 127.0.0.1 only, with clustering off (Alertmanager's default gossips on
0.0.0.0:9094), and never uses Debian's system service or its files ('make setup' disables
that service). Loopback is open to every local user, so its API asks for basic auth
(``basic_auth.py``): the user ``llm-release`` and a password made once in
``<home>/alertmanager/password`` (0600), which Prometheus, amtool (``amtool.yml`` beside it)
and this module send; anyone else gets 401.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import requests
import yaml
from pydantic import BaseModel, ConfigDict, Field

from llm_release import paths
from llm_release.canary.alerts import STABLE_DOWN
from llm_release.canary.basic_auth import Credentials
from llm_release.canary.daemon import Daemon
from llm_release.errors import AlertmanagerError, ConfigError
from llm_release.fileio import atomic_write_text
from llm_release.serving import processes
from llm_release.settings import settings

PORT_ENV = "LLM_RELEASE_ALERTMANAGER_PORT"
RECEIVER = "llm-release-notify"
WEBHOOK_FILE = "webhook-url"


class Routing(BaseModel):
    """How alerts become notifications. A new group's first notification waits
    ``group_wait_s`` (alerts that start together go out together); alerts that join a
    group already notified go out ``group_interval_s`` later; a group that still fires is
    notified again after ``repeat_interval_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    group_wait_s: float = Field(30.0, gt=0)
    group_interval_s: float = Field(300.0, gt=0)
    repeat_interval_s: float = Field(12 * 3600.0, gt=0)


def default_port() -> int:
    """``LLM_RELEASE_ALERTMANAGER_PORT`` (9093). ``auto``: 0, a free port picked when
    Alertmanager starts and recorded beside it (as Prometheus's)."""
    port = settings().alertmanager_port
    return 0 if port == "auto" else port


def _duration(seconds: float) -> str:
    """An Alertmanager duration: whole seconds, else milliseconds (tests wait 0.5 s)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def check_webhook_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; ConfigError otherwise (the message never
    repeats the URL, which may carry a token)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise ConfigError(
            "the webhook URL must be an http:// or https:// URL with a host",
            hint="give the URL your chat or paging tool issued for incoming webhooks",
        )
    return url.strip()


def render_config(webhook_url: str | None, routing: Routing | None = None) -> str:
    """Alertmanager's config (YAML): every alert to the webhook receiver (none: to nobody),
    grouped by service, warnings inhibited by a critical alert of the same service, and the
    criticals a down stable server causes inhibited by its 'down' alert."""
    routing = routing or Routing()
    receiver: dict = {"name": RECEIVER}
    if webhook_url:
        receiver["webhook_configs"] = [
            {"url": check_webhook_url(webhook_url), "send_resolved": True}
        ]
    config = {
        "route": {
            "receiver": RECEIVER,
            "group_by": ["service"],
            "group_wait": _duration(routing.group_wait_s),
            "group_interval": _duration(routing.group_interval_s),
            "repeat_interval": _duration(routing.repeat_interval_s),
        },
        "receivers": [receiver],
        "inhibit_rules": [
            {
                "source_matchers": ['severity="critical"'],
                "target_matchers": ['severity="warning"'],
                "equal": ["service"],
            },
            {
                "source_matchers": [f'alertname="{STABLE_DOWN}"'],
                "target_matchers": ['severity="critical"', f'alertname!="{STABLE_DOWN}"'],
                "equal": ["service"],
            },
        ],
    }
    return yaml.safe_dump(config, sort_keys=False, width=1_000_000)


def amtool_check(path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        raise AlertmanagerError(
            "amtool is not installed",
            hint="run 'make setup' (Debian's prometheus-alertmanager package ships amtool)",
        )
    check = subprocess.run(
        [amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60
    )
    if check.returncode != 0:
        output = (check.stdout + check.stderr).strip()
        raise AlertmanagerError(
            f"amtool rejected the Alertmanager config: {output}",
            hint="the config comes from alertmanager.render_config(); fix what amtool names",
        )


class Alertmanager(Daemon):
    """The Alertmanager process whose files live under ``directory``.

    ``port`` None: the port the running instance was started on, else
    ``LLM_RELEASE_ALERTMANAGER_PORT`` (9093).
    """

    name = "Alertmanager"
    error = AlertmanagerError
    port_env = PORT_ENV
    stop_grace_s = 10.0  # its notification log and silences go to the data dir

    def __init__(
        self, directory: Path, port: int | None = None, *, routing: Routing | None = None
    ) -> None:
        self.directory = Path(directory)
        self.config_path = self.directory / "alertmanager.yml"
        self.pid_path = self.directory / "alertmanager.pid"
        self.port_path = self.directory / "port"
        self.log_path = self.directory / "alertmanager.log"
        self.data_dir = self.directory / "data"
        self.webhook_path = self.directory / WEBHOOK_FILE
        self.credentials = Credentials(self.directory)
        self.routing = routing or Routing()
        if port is None:
            port = self.recorded_port()
        self.port = port or default_port()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def http_auth(self) -> tuple[str, str]:
        """What its API asks for: every project call sends it (see basic_auth)."""
        return self.credentials.auth

    def amtool_args(self) -> list[str]:
        """amtool's flags to reach it: its URL and the HTTP config with the credentials."""
        return self.credentials.amtool_args(self.url)

    def locked(self) -> bool:
        """It runs with the project's web config (an instance started by an older version
        runs open: ``ensure_running`` restarts it)."""
        pid = self.pid()
        return pid is not None and processes.is_same(
            pid, None, cmdline_has=f"--web.config.file={self.credentials.web_config_path}"
        )

    # -- the receiver --------------------------------------------------------------------
    def webhook_url(self) -> str | None:
        """The operator's webhook URL saved under the home (None: alerts notify nobody)."""
        try:
            return self.webhook_path.read_text().strip() or None
        except FileNotFoundError:
            return None

    def save_webhook_url(self, url: str | None) -> None:
        """Save (None: forget) the webhook URL; a running Alertmanager is given the new
        config at once."""
        if url is None:
            self.webhook_path.unlink(missing_ok=True)
        else:
            atomic_write_text(self.webhook_path, check_webhook_url(url) + "\n")  # 0600
        if self.running():
            self.install_config(self.render())

    def render(self) -> str:
        return render_config(self.webhook_url(), self.routing)

    # -- config --------------------------------------------------------------------------
    def install_config(self, text: str) -> Path:
        """Check ``text`` with amtool, make it the config (atomically) and, when running,
        reload; a config Alertmanager refuses is taken back out. Returns its path."""
        pending = self.directory / "alertmanager.pending.yml"
        atomic_write_text(pending, text)
        try:
            amtool_check(pending)
        except BaseException:
            pending.unlink(missing_ok=True)
            raise
        previous = self.config_path.read_text() if self.config_path.exists() else None
        os.replace(pending, self.config_path)
        if self.running():
            try:
                self.reload()
            except AlertmanagerError as exc:
                if previous is None:
                    self.config_path.unlink(missing_ok=True)
                else:
                    atomic_write_text(self.config_path, previous)
                    try:
                        self.reload()
                    except AlertmanagerError:
                        pass
                raise AlertmanagerError(
                    f"Alertmanager refused its new config (the previous one is back): "
                    f"{exc.message}",
                    hint=exc.hint or None,
                ) from None
        return self.config_path

    def reload(self) -> None:
        """Re-read the config (POST /-/reload answers once it has, or why it could not)."""
        try:
            reply = requests.post(f"{self.url}/-/reload", auth=self.http_auth(), timeout=15)
        except requests.RequestException as exc:
            raise AlertmanagerError(
                f"Alertmanager at {self.url} did not answer: {type(exc).__name__}"
            ) from None
        if reply.status_code != 200:
            raise AlertmanagerError(
                f"Alertmanager did not reload: {reply.text.strip()}",
                hint=f"check {self.config_path} with 'amtool check-config'",
            )

    # -- process -------------------------------------------------------------------------
    def ensure_running(self) -> Alertmanager:
        """Start it, or give the running one the config of the current settings. One running
        without the project's credentials (started by an older version) is restarted with
        them; its silences and notification log stay in its data dir."""
        if self.running() and not self.locked():
            self.stop()
        if not self.running():
            self.start()
            return self
        self.credentials.ensure()  # a password file deleted meanwhile: made again, its hash taken
        if self.config_path.read_text() != self.render():
            self.install_config(self.render())
        return self

    def _start(self, timeout_s: float) -> None:
        binary = next(filter(None, map(shutil.which, processes.ALERTMANAGER_BINARIES)), None)
        if binary is None:
            raise AlertmanagerError(
                "alertmanager is not installed",
                hint="run 'make setup' (it runs apt-get install -y prometheus-alertmanager)",
            )
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.credentials.ensure()
        self.install_config(self.render())
        command = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.path={self.data_dir}",
            f"--web.listen-address={self.address}",
            f"--web.external-url={self.url}",
            # Basic auth on every path (exporter-toolkit's web config; 401 without it).
            f"--web.config.file={self.credentials.web_config_path}",
            "--cluster.listen-address=",  # no gossip on 0.0.0.0:9094: one instance
        ]
        self.spawn(command, timeout_s)


def for_home(routing: Routing | None = None) -> Alertmanager:
    """The project's own Alertmanager (under the project home)."""
    return Alertmanager(paths.alertmanager_dir(), routing=routing)
