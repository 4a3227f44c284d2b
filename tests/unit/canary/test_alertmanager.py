"""The Alertmanager config the project writes, through the real amtool: it passes, it routes
every alert to the webhook receiver grouped by service with the inhibitions that make one
incident page once, and a config amtool refuses is refused in one line and never installed."""

import subprocess

import pytest
import yaml

from llm_release.canary import alertmanager
from llm_release.canary.alertmanager import Alertmanager, Routing, render_config
from llm_release.canary.alerts import STABLE_DOWN, render_rules
from llm_release.errors import AlertmanagerError, ConfigError
from tests.helpers import require_tool

WEBHOOK = "https://hooks.example.com/services/T000/B000/secret-token"


@pytest.fixture(autouse=True)
def _amtool():
    require_tool("amtool")  # a missing amtool fails these tests; 'make setup' installs it


def amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["amtool", *args], capture_output=True, text=True)


@pytest.mark.parametrize("webhook", [WEBHOOK, None])
def test_the_config_passes_amtool(tmp_path, webhook):
    path = tmp_path / "alertmanager.yml"
    path.write_text(render_config(webhook, Routing(group_wait_s=0.5)))
    check = amtool("check-config", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(path.read_text())
    route = config["route"]
    assert route["group_by"] == ["service"]
    assert (route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        "500ms",
        "300s",
        "43200s",
    )
    receivers = config["receivers"]
    assert [r["name"] for r in receivers] == [route["receiver"]]
    if webhook:
        assert receivers[0]["webhook_configs"] == [{"url": WEBHOOK, "send_resolved": True}]
    else:
        assert "webhook_configs" not in receivers[0]  # held, shown, sent to nobody


def test_every_rule_routes_to_the_receiver_and_criticals_inhibit_what_they_cause(tmp_path):
    path = tmp_path / "alertmanager.yml"
    path.write_text(render_config(WEBHOOK))
    rules = yaml.safe_load(
        render_rules(service="svc", release_id="r-1", ttft_p95_slo_s=3, error_share_ceiling=0.01)
    )["groups"][0]["rules"]
    for rule in rules:
        labels = [f"alertname={rule['alert']}"] + [f"{k}={v}" for k, v in rule["labels"].items()]
        routed = amtool("config", "routes", "test", f"--config.file={path}", *labels)
        assert routed.returncode == 0, routed.stderr
        assert routed.stdout.strip() == alertmanager.RECEIVER
    severities = {rule["alert"]: rule["labels"]["severity"] for rule in rules}
    assert severities[STABLE_DOWN] == "critical"
    assert sorted(set(severities.values())) == ["critical", "warning"]
    inhibit = yaml.safe_load(path.read_text())["inhibit_rules"]
    assert inhibit == [
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
    ]


def test_install_refuses_what_amtool_refuses_in_one_line(tmp_path):
    server = Alertmanager(tmp_path / "alertmanager", port=1)  # not running: no reload
    good = server.install_config(render_config(WEBHOOK))
    assert good == server.config_path
    bad = "route:\n  receiver: nobody\nreceivers:\n- name: someone\n"
    with pytest.raises(AlertmanagerError, match="amtool rejected") as caught:
        server.install_config(bad)
    line = caught.value.one_line()
    assert "\n" not in line and 'undefined receiver "nobody" used in route' in line
    # The installed config is still the good one; nothing half-written is left behind.
    assert WEBHOOK in good.read_text()
    assert sorted(p.name for p in server.directory.iterdir()) == ["alertmanager.yml"]
    # It carries the webhook's token: only its owner reads it.
    assert good.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "url", ["ftp://hooks.example.com/x", "hooks.example.com/x", "http:///x", "http://a b/x"]
)
def test_a_webhook_that_is_no_http_url_is_refused_without_repeating_it(tmp_path, url):
    server = Alertmanager(tmp_path, port=1)
    with pytest.raises(ConfigError, match="http:// or https:// URL") as caught:
        server.save_webhook_url(url)
    assert url not in str(caught.value)
    assert server.webhook_url() is None


def test_the_saved_webhook_is_the_receiver_and_can_be_forgotten(tmp_path):
    server = Alertmanager(tmp_path, port=1)
    server.save_webhook_url(WEBHOOK)
    assert server.webhook_url() == WEBHOOK
    assert server.webhook_path.stat().st_mode & 0o077 == 0
    assert WEBHOOK in server.render()
    server.save_webhook_url(None)
    assert server.webhook_url() is None and WEBHOOK not in server.render()


def test_the_port_setting(monkeypatch):
    monkeypatch.delenv(alertmanager.PORT_ENV, raising=False)
    assert alertmanager.default_port() == 9093
    monkeypatch.setenv(alertmanager.PORT_ENV, "auto")
    assert alertmanager.default_port() == 0
    monkeypatch.setenv(alertmanager.PORT_ENV, "9193")
    assert alertmanager.default_port() == 9193


def test_the_credentials_are_made_once_owner_only_and_hashed_for_alertmanager(tmp_path):
    import bcrypt

    from llm_release.canary.basic_auth import USERNAME, Credentials

    creds = Credentials(tmp_path / "alertmanager")
    creds.ensure()
    password = creds.password_path.read_text().strip()
    assert len(password) >= 32 and creds.auth == (USERNAME, password)
    for path in (creds.password_path, creds.web_config_path, creds.amtool_config_path):
        assert path.stat().st_mode & 0o077 == 0, path
    # Alertmanager's web config holds the bcrypt hash, never the password.
    web = creds.web_config_path.read_text()
    assert password not in web
    hashed = yaml.safe_load(web)["basic_auth_users"][USERNAME]
    assert hashed.startswith("$2") and bcrypt.checkpw(password.encode(), hashed.encode())
    # amtool's HTTP config names the password file (never the password).
    assert yaml.safe_load(creds.amtool_config_path.read_text()) == {
        "basic_auth": {"username": USERNAME, "password_file": str(creds.password_path)}
    }
    # Made once: the next start keeps the password and its hash.
    Credentials(creds.directory).ensure()
    assert creds.password() == password and creds.web_config_path.read_text() == web
    # A password made anew (the file deleted) gets a new hash.
    creds.password_path.unlink()
    creds.ensure()
    assert creds.password() != password
    assert bcrypt.checkpw(
        creds.password().encode(),
        yaml.safe_load(creds.web_config_path.read_text())["basic_auth_users"][USERNAME].encode(),
    )


def test_a_password_file_others_can_read_or_an_empty_one_is_refused(tmp_path):
    from llm_release.canary.basic_auth import Credentials

    creds = Credentials(tmp_path)
    creds.password()
    creds.password_path.chmod(0o644)
    with pytest.raises(ConfigError, match="open to its group or other users"):
        creds.password()
    creds.password_path.chmod(0o600)
    creds.password_path.write_text("\n")
    with pytest.raises(ConfigError, match="holds no password") as caught:
        creds.ensure()
    assert "delete" in caught.value.hint


def test_amtool_args_name_the_url_and_the_http_config(tmp_path):
    server = Alertmanager(tmp_path, port=19093)
    assert server.amtool_args() == [
        "--alertmanager.url=http://127.0.0.1:19093",
        f"--http.config.file={tmp_path / 'amtool.yml'}",
    ]
