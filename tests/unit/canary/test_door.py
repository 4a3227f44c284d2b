"""The door's operator settings, key files and the map HAProxy reads (no HAProxy here)."""

import hashlib
import os
import stat
from pathlib import Path

import pytest

from llm_release.canary import door
from llm_release.canary.router import SlotTarget, render_config
from llm_release.errors import ConfigError

KEY_A = "k" * 20
KEY_B = "Zm9vYmFyYmF6cXV4LTEyMw=="


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "keys"
    path.write_text(text)
    path.chmod(mode)
    return path


def pem(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "door.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    path.chmod(mode)
    return path


def test_keys_one_a_line_with_comments_and_blank_lines(tmp_path):
    path = key_file(tmp_path, f"# team A\n{KEY_A}\n\n   {KEY_B}  \n# {KEY_A}x\n{KEY_A}\n")
    assert door.read_keys(path) == [KEY_A, KEY_B]


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"])
def test_a_key_file_without_a_key_is_refused(tmp_path, text):
    path = key_file(tmp_path, text)
    with pytest.raises(ConfigError, match="holds no API key") as caught:
        door.read_keys(path)
    assert "secrets.token_urlsafe" in caught.value.one_line()


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o666, 0o640, 0o620, 0o610, 0o660])
def test_a_key_file_its_group_or_others_can_open_is_refused_with_the_fix(tmp_path, mode):
    path = key_file(tmp_path, KEY_A + "\n", mode)
    with pytest.raises(ConfigError) as caught:
        door.read_keys(path)
    line = caught.value.one_line()
    assert "\n" not in line and f"chmod 600 {path}" in line and f"{mode:04o}" in line


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_key_file_only_its_owner_reads_is_accepted(tmp_path, mode):
    assert door.read_keys(key_file(tmp_path, KEY_A + "\n", mode)) == [KEY_A]


def test_a_key_or_tls_file_another_user_owns_is_refused_in_one_line(tmp_path, monkeypatch):
    path = key_file(tmp_path, KEY_A + "\n")
    other = os.geteuid() + 1000
    if os.geteuid() == 0:
        os.chown(path, other, -1)  # a real file of another user
    else:
        monkeypatch.setattr(door.os, "geteuid", lambda: other)  # the file is then not ours
    with pytest.raises(ConfigError) as caught:
        door.read_keys(path)
    line = caught.value.one_line()
    assert "\n" not in line and "owned by uid" in line and f"chmod 600 {path}" in line
    monkeypatch.setenv(door.BIND_ENV, "0.0.0.0:8443")
    (tmp_path / "ours").mkdir()
    monkeypatch.setenv(door.KEYS_FILE_ENV, str(key_file(tmp_path / "ours", KEY_A)))
    certificate = pem(tmp_path)
    if os.geteuid() == 0:
        os.chown(certificate, other, -1)
    monkeypatch.setenv(door.TLS_PEM_ENV, str(certificate))
    with pytest.raises(ConfigError, match=f"{door.TLS_PEM_ENV}: .* owned by uid"):
        door.settings()


def test_a_missing_key_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        door.read_keys(tmp_path / "nope")


@pytest.mark.parametrize("bad", ["short", "has space in it here", "k" * 20 + "#x", "é" * 20])
def test_a_line_that_is_no_key_is_named_but_not_repeated(tmp_path, bad):
    path = key_file(tmp_path, f"{KEY_A}\n{bad}\n")
    with pytest.raises(ConfigError, match="line 2") as caught:
        door.read_keys(path)
    assert bad not in caught.value.one_line()


def test_the_map_holds_hashes_only_in_haproxys_hex(tmp_path):
    text = door.render_key_map([KEY_A, KEY_B], "p" * 43)
    assert KEY_A not in text and KEY_B not in text and "p" * 43 not in text
    entries = [line.split() for line in text.splitlines() if not line.startswith("#")]
    assert entries == [
        [hashlib.sha256(KEY_A.encode()).hexdigest().upper(), "operator"],
        [hashlib.sha256(KEY_B.encode()).hexdigest().upper(), "operator"],
        [hashlib.sha256(b"p" * 43).hexdigest().upper(), "project"],
    ]


def test_the_project_key_is_made_once_private(tmp_path):
    path = tmp_path / "client.key"
    key = door.project_key(path)
    assert len(key) >= 40 and door.KEY_PATTERN.fullmatch(key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert door.project_key(path) == key
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        door.project_key(path)


def test_loopback_needs_nothing(monkeypatch):
    for name in (door.BIND_ENV, door.KEYS_FILE_ENV, door.TLS_PEM_ENV):
        monkeypatch.delenv(name, raising=False)
    settings = door.settings()
    assert settings.bind is None and not settings.public
    monkeypatch.setenv(door.BIND_ENV, "127.0.0.1:8443")
    assert not door.settings().public


@pytest.mark.parametrize("bind", ["0.0.0.0:8443", "10.1.2.3:443", "[::]:8443"])
def test_a_public_bind_without_tls_or_keys_is_refused_in_one_line(tmp_path, monkeypatch, bind):
    monkeypatch.setenv(door.BIND_ENV, bind)
    monkeypatch.delenv(door.TLS_PEM_ENV, raising=False)
    monkeypatch.setenv(door.KEYS_FILE_ENV, str(key_file(tmp_path, KEY_A)))
    with pytest.raises(ConfigError) as caught:
        door.settings()
    line = caught.value.one_line()
    assert "not loopback" in line and door.TLS_PEM_ENV in line and "\n" not in line
    assert door.KEYS_FILE_ENV not in line.split("how to fix")[1]
    # TLS alone is not enough either: the public door needs the operator's keys.
    monkeypatch.setenv(door.TLS_PEM_ENV, str(pem(tmp_path)))
    monkeypatch.delenv(door.KEYS_FILE_ENV)
    with pytest.raises(ConfigError, match=door.KEYS_FILE_ENV):
        door.settings()
    monkeypatch.setenv(door.KEYS_FILE_ENV, str(key_file(tmp_path, KEY_A)))
    assert door.settings().public


def test_a_world_readable_certificate_key_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(door.BIND_ENV, "0.0.0.0:8443")
    monkeypatch.setenv(door.KEYS_FILE_ENV, str(key_file(tmp_path, KEY_A)))
    monkeypatch.setenv(door.TLS_PEM_ENV, str(pem(tmp_path, 0o644)))
    with pytest.raises(ConfigError, match="chmod 600"):
        door.settings()


@pytest.mark.parametrize("bind", ["example.com:443", "0.0.0.0", "1.2.3.4:99999", "::1:80"])
def test_a_bind_that_is_not_address_and_port_is_refused(monkeypatch, bind):
    monkeypatch.setenv(door.BIND_ENV, bind)
    with pytest.raises(ConfigError, match="LLM_RELEASE_DOOR_"):
        door.settings()


def test_tls_without_a_public_listener_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv(door.BIND_ENV, raising=False)
    monkeypatch.setenv(door.TLS_PEM_ENV, str(pem(tmp_path)))
    with pytest.raises(ConfigError, match="BIND is not"):
        door.settings()


def test_a_run_form_has_no_door_field():
    from llm_release.config import ReleaseConfig

    fields = set(ReleaseConfig.model_fields)
    assert not fields & {"door", "bind", "keys_file", "tls_pem", "api_keys"}


def render(**door_args) -> str:
    return render_config(
        listen_port=8080,
        socket_path=Path("/s"),
        pid_path=Path("/p"),
        stable=SlotTarget("127.0.0.1", 9001, 100),
        canary=None,
        key_map=Path("/r/keys.map"),
        **door_args,
    )


def test_the_frontend_denies_without_a_key_from_the_map():
    text = render()
    assert "bind 127.0.0.1:8080 name loopback" in text
    assert "http_auth_bearer,sha2(256),hex,map_str(/r/keys.map)" in text
    deny = next(line for line in text.splitlines() if "http-request deny status 401" in line)
    assert "WWW-Authenticate 'Bearer" in deny
    assert deny.rstrip().endswith("unless operator_key || project_key on_loopback")
    # The check is in the frontend, so it runs before any server is picked.
    assert text.index("http-request deny status 401") < text.index("backend releases")
    assert "ssl" not in text


def test_a_public_listener_binds_tls_with_the_operators_pem():
    text = render(public_bind="0.0.0.0:8443", tls_pem=Path("/etc/door.pem"))
    assert "bind 0.0.0.0:8443 name public ssl crt /etc/door.pem ssl-min-ver TLSv1.2" in text
    assert "bind ipv6@:::8443 name public" in render(public_bind="[::]:8443", tls_pem=Path("/x"))
