"""The project's Alertmanager, the real binary, asks every caller for its credentials: without
them (or with a wrong password) its status, its alerts, a new silence and even /-/ready get
401, so no other local user reads the webhook URL or silences the alerts; the project's own
calls (readiness, reload), amtool with the project's HTTP config, and Prometheus (it pages
through it in test_alert_delivery.py) get in. One started open by an older version is
restarted locked by the next deploy's ensure_running, its silences kept."""

import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import pytest
import requests

from llm_release.canary.alertmanager import Alertmanager
from llm_release.canary.basic_auth import USERNAME
from llm_release.serving import processes
from llm_release.serving.serve import free_port
from tests.helpers import require_tool

WEBHOOK = "https://hooks.example.com/services/T000/B000/secret-token"


@pytest.fixture(autouse=True)
def _tools():
    # A missing Alertmanager fails these tests, never skips them: 'make setup' installs it.
    if not any(map(shutil.which, processes.ALERTMANAGER_BINARIES)):
        pytest.fail("alertmanager is not installed: 'make setup' installs it", pytrace=False)
    require_tool("amtool")


@pytest.fixture()
def server(tmp_path):
    server = Alertmanager(tmp_path / "alertmanager", port=free_port())
    server.save_webhook_url(WEBHOOK)
    yield server
    server.stop()


def silence() -> dict:
    now = datetime.now(UTC)
    return {
        "matchers": [{"name": "alertname", "value": ".+", "isRegex": True}],
        "startsAt": now.isoformat(),
        "endsAt": (now + timedelta(days=30)).isoformat(),
        "createdBy": "someone else",
        "comment": "silence everything",
    }


def amtool(server: Alertmanager, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True, timeout=30)


def test_a_request_without_the_credentials_gets_401(server):
    server.start()  # ready: its readiness check sent the credentials
    url = server.url
    wrong = (USERNAME, "not-the-password")
    for auth in (None, wrong, ("someone", server.credentials.password())):
        for method, path, body in (
            ("GET", "/api/v2/status", None),
            ("GET", "/api/v2/alerts", None),
            ("GET", "/api/v2/silences", None),
            ("POST", "/api/v2/silences", silence()),
            ("GET", "/-/ready", None),
            ("GET", "/", None),
        ):
            reply = requests.request(method, f"{url}{path}", json=body, auth=auth, timeout=10)
            assert reply.status_code == 401, (method, path, auth and auth[0], reply.status_code)
            assert WEBHOOK not in reply.text and "secret-token" not in reply.text

    # The project's own calls get in: the status (with the webhook, for the owner only) and
    # a reload; no silence was made by the refused POSTs.
    status = requests.get(f"{url}/api/v2/status", auth=server.http_auth(), timeout=10)
    assert status.status_code == 200 and WEBHOOK in status.json()["config"]["original"]
    server.reload()
    listed = requests.get(f"{url}/api/v2/silences", auth=server.http_auth(), timeout=10)
    assert listed.status_code == 200 and listed.json() == []

    # amtool: refused without the project's HTTP config, let in with it.
    refused = amtool(server, f"--alertmanager.url={url}", "silence", "query")
    assert refused.returncode != 0 and "401" in refused.stdout + refused.stderr
    made = amtool(
        server, *server.amtool_args(), "silence", "add", "alertname=X", "--comment=ok", "-d", "1m"
    )
    assert made.returncode == 0, made.stdout + made.stderr
    queried = amtool(server, *server.amtool_args(), "silence", "query", "-q")
    assert queried.returncode == 0 and queried.stdout.split() == made.stdout.split()


def test_one_started_open_by_an_older_version_is_restarted_locked(server):
    # What an older version ran: the same command line less --web.config.file.
    binary = next(filter(None, map(shutil.which, processes.ALERTMANAGER_BINARIES)))
    server.data_dir.mkdir(parents=True, exist_ok=True)
    server.install_config(server.render())
    server.spawn(
        [
            binary,
            f"--config.file={server.config_path}",
            f"--storage.path={server.data_dir}",
            f"--web.listen-address={server.address}",
            f"--web.external-url={server.url}",
            "--cluster.listen-address=",
        ],
        timeout_s=30,
    )
    open_pid = server.pid()
    assert open_pid and not server.locked()
    made = requests.post(f"{server.url}/api/v2/silences", json=silence(), timeout=10)
    assert made.status_code == 200  # open: anyone could

    server.ensure_running()
    assert server.locked() and server.pid() != open_pid
    assert not processes.is_alive(open_pid)
    assert requests.get(f"{server.url}/api/v2/status", timeout=10).status_code == 401
    # Its data dir stays: the silence made while it ran open is still there, to be seen
    # (and expired) by its owner.
    listed = requests.get(f"{server.url}/api/v2/silences", auth=server.http_auth(), timeout=10)
    assert [s["id"] for s in listed.json()] == [made.json()["silenceID"]]


def test_a_password_made_anew_is_taken_without_a_restart(server):
    server.start()
    pid, old = server.pid(), server.http_auth()
    server.credentials.password_path.unlink()
    server.ensure_running()  # what the next deploy, 'up' or rollback does
    new = server.http_auth()
    assert new != old and server.pid() == pid
    status = f"{server.url}/api/v2/status"
    assert requests.get(status, auth=old, timeout=10).status_code == 401
    assert requests.get(status, auth=new, timeout=10).status_code == 200
