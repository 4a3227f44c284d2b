"""The basic auth that closes the project's Alertmanager and Prometheus to other local users.

Both listen on 127.0.0.1, which every user of the host reaches. Alertmanager open shows in
``/api/v2/status`` the config with the webhook URL (and the token it often carries), and
anyone may silence every alert; Prometheus open gives any local user the servers' traffic
and latencies and its whole query API. So each is started with ``--web.config.file`` (the
Prometheus exporter-toolkit's web config, which both read): ``basic_auth_users`` with one
user, ``llm-release``, and the bcrypt hash of a password the project makes once, at random,
in a 0600 file beside it (``<home>/alertmanager/password``, ``<home>/prometheus/password``).
Without that user and password every path answers 401, ``/-/ready`` and the UI included.

Every caller of the project uses that one file: Prometheus (``alerting.alertmanagers[]
.basic_auth.password_file``, read at each send), amtool (``--http.config.file`` names
``amtool.yml``, an HTTP client config pointing at the same file) and the project's own HTTP
calls (``Credentials.auth``: readiness, reload, the canary analysis' queries). Both re-read
their web config at each request, so a password made anew (the file deleted) is taken at
the next start or ``ensure()`` with no restart.
"""

from __future__ import annotations

import re
from pathlib import Path

import bcrypt
import yaml

from llm_release.fileio import atomic_write_text
from llm_release.secret_files import made_secret

USERNAME = "llm-release"
PASSWORD_FILE = "password"
WEB_CONFIG_FILE = "web.yml"
AMTOOL_CONFIG_FILE = "amtool.yml"
# What secrets.token_urlsafe writes; a file holding anything else was not made here.
PASSWORD_PATTERN = re.compile(r"[A-Za-z0-9_-]{32,}")


class Credentials:
    """The user and password of the server (``what``: Alertmanager, Prometheus) whose files
    live under ``directory``."""

    def __init__(self, directory: Path, what: str = "Alertmanager") -> None:
        self.directory = Path(directory)
        self.what = what
        self.password_path = self.directory / PASSWORD_FILE
        self.web_config_path = self.directory / WEB_CONFIG_FILE
        self.amtool_config_path = self.directory / AMTOOL_CONFIG_FILE

    def password(self) -> str:
        """The password, made (0600, whatever the umask) the first time it is asked for; an
        existing file must be this user's and closed to others (``secret_files.made_secret``)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        password, _ = made_secret(
            self.password_path,
            f"{self.what}'s password file",
            lambda text: bool(PASSWORD_PATTERN.fullmatch(text)),
            f"delete {self.password_path}: the next start makes a new one",
            kind="password",
        )
        return password

    @property
    def auth(self) -> tuple[str, str]:
        """``requests``' ``auth=``: the user and the password."""
        return USERNAME, self.password()

    def ensure(self) -> None:
        """The password, the server's web config holding its bcrypt hash, and amtool's
        HTTP config naming the password file: each written (0600) when missing or stale."""
        password = self.password()
        if not self._web_config_matches(password):
            hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()
            atomic_write_text(self.web_config_path, render_web_config(hashed))  # 0600
        amtool = render_http_config(self.password_path)
        if not self.amtool_config_path.exists() or self.amtool_config_path.read_text() != amtool:
            atomic_write_text(self.amtool_config_path, amtool)

    def _web_config_matches(self, password: str) -> bool:
        try:
            users = yaml.safe_load(self.web_config_path.read_text())["basic_auth_users"]
            hashed = users[USERNAME]
            return set(users) == {USERNAME} and bcrypt.checkpw(password.encode(), hashed.encode())
        except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError):
            return False

    def amtool_args(self, url: str) -> list[str]:
        """amtool's flags for this Alertmanager at ``url``."""
        return [f"--alertmanager.url={url}", f"--http.config.file={self.amtool_config_path}"]


def render_web_config(password_hash: str) -> str:
    """The server's ``--web.config.file``: one user, its bcrypt hash."""
    return yaml.safe_dump({"basic_auth_users": {USERNAME: password_hash}}, sort_keys=False)


def basic_auth(password_path: Path) -> dict[str, str]:
    """An HTTP client config's ``basic_auth`` (Prometheus', amtool's): the user, and the
    password read from ``password_path`` at each request."""
    return {"username": USERNAME, "password_file": str(password_path)}


def render_http_config(password_path: Path) -> str:
    """amtool's ``--http.config.file``."""
    return yaml.safe_dump({"basic_auth": basic_auth(password_path)}, sort_keys=False)


def password_path(directory: Path) -> Path:
    """The password file of the server whose files live under ``directory``."""
    return Path(directory) / PASSWORD_FILE
