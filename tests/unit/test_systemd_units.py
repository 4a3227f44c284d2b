"""'llm-release systemd': the units that run 'llm-release up' at boot and every 30 s pass
``systemd-analyze verify`` for real (system and user units; the tool missing fails under
CI, skips elsewhere), name the absolute paths of the home given, escape a hostile path by
systemd's rules (spaces, '%', '$') and refuse one systemd cannot take (a newline) in one
line. systemctl is never run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llm_release import systemd_units
from llm_release.cli import main
from llm_release.errors import ConfigError

SCRIPT = Path(sys.executable).parent / "llm-release"


def _analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("systemd-analyze is missing: CI must verify the generated units")
        pytest.skip("systemd-analyze is not installed here")
    return found


def _verify(files: list[Path], *, user: bool, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if user:  # a user manager wants a runtime folder (none without a login session)
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    command = [_analyze(), *(["--user"] if user else []), "verify", *map(str, files)]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def _hostile_project(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A project folder whose path holds a space, a '%' specifier and a '$' variable, with
    an executable llm-release in it (verify checks ExecStart's program exists)."""
    project = tmp_path / "my project %h $HOME"
    (project / ".venv" / "bin").mkdir(parents=True)
    script = project / ".venv" / "bin" / "llm-release"
    shutil.copy(SCRIPT, script)
    script.chmod(0o755)
    return project, project / ".llm-release", script


def _setting(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{key}="))[len(key) + 1 :]


def _unescape(value: str) -> str:
    return value.replace("%%", "%")


@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_the_units_pass_systemd_analyze_verify_and_name_the_home(tmp_path, user):
    project, home, script = _hostile_project(tmp_path)
    units = systemd_units.render(project, home, user=user, executable=script)
    written = systemd_units.write(units, tmp_path / "units")
    result = _verify(written, user=user, tmp_path=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    service = units.files[units.service]
    assert _unescape(_setting(service, "WorkingDirectory")) == str(project)
    assert _unescape(_setting(service, "Environment")) == f'"LLM_RELEASE_HOME={home}"'
    assert _unescape(_setting(service, "ExecStart")) == f'"{script}" up --unattended'
    assert _unescape(_setting(service, "EnvironmentFile")) == f"-{home}/systemd.env"
    assert _setting(service, "Type") == "oneshot" and _setting(service, "KillMode") == "process"
    assert ("User=" in service) is (not user)
    if not user:  # the servers run as the owner of the project's files
        assert _setting(service, "User") == project.owner()
    assert ("After=network-online.target" in service) is (not user)
    timer = units.files[units.timer]
    assert _setting(timer, "OnUnitInactiveSec") == "30s" and _setting(timer, "Unit") == (
        units.service
    )


def test_verify_catches_a_wrong_escape(tmp_path):
    # The check is real: a '$' doubled in ExecStart's program is no such file to systemd.
    project, home, script = _hostile_project(tmp_path)
    units = systemd_units.render(project, home, user=False, executable=script)
    written = systemd_units.write(units, tmp_path / "units")
    service = written[0]
    service.write_text(service.read_text().replace("$HOME/.venv", "$$HOME/.venv"))
    assert _verify(written, user=False, tmp_path=tmp_path).returncode != 0


@pytest.mark.parametrize("bad", ["new\nline", 'quo"te', "back\\slash", "tab\there"])
def test_a_path_systemd_cannot_take_is_refused_in_one_line(tmp_path, bad):
    with pytest.raises(ConfigError) as caught:
        systemd_units.render(tmp_path, tmp_path / bad, user=True, executable=SCRIPT)
    assert "\n" not in caught.value.one_line() and "LLM_RELEASE_HOME" in str(caught.value)


def test_a_unit_name_that_is_not_plain_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        systemd_units.render(tmp_path, tmp_path, user=True, name="../x", executable=SCRIPT)


def test_the_command_writes_the_units_and_prints_what_to_run(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home with space"
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    out = tmp_path / "my units"
    assert main(["systemd", "--user", "--output", str(out), "--name", "llmr"]) == 0
    printed = capsys.readouterr().out
    service, timer = out / "llmr-up.service", out / "llmr-up.timer"
    assert f"wrote {service}" in printed and f"wrote {timer}" in printed
    assert "systemctl --user enable --now llmr-up.timer" in printed
    assert "systemctl --user enable llmr-up.service" in printed
    # A folder with a space is quoted for the shell in the copy line.
    assert f"cp '{service}' '{timer}' " in printed
    assert f'"LLM_RELEASE_HOME={home}"' in service.read_text()
    assert f'ExecStart="{SCRIPT.absolute()}" up --unattended' in service.read_text()


def test_a_newline_in_the_home_is_one_error_line_from_the_command(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "a\nb"))
    assert main(["systemd", "--user", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_folder_it_cannot_write_is_one_error_line(tmp_path, capsys):
    # /proc takes no new folder, root or not (as /etc/systemd/system refuses a plain user).
    assert main(["systemd", "--output", "/proc/llm-release-units"]) == 2
    err = capsys.readouterr().err
    assert "cannot write the units to /proc/llm-release-units" in err and err.count("\n") == 1


def test_the_settings_in_force_go_to_an_environment_file_only_its_owner_reads(
    tmp_path, monkeypatch, capsys
):
    home = tmp_path / "home"
    secret = "postgresql://u:p$w d@db/x"
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", secret)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    out = tmp_path / "units"
    assert main(["systemd", "--user", "--output", str(out)]) == 0
    env_file = home / "systemd.env"
    assert f"wrote {env_file}" in capsys.readouterr().out
    assert env_file.stat().st_mode & 0o777 == 0o600
    lines = env_file.read_text().splitlines()
    assert f"LLM_RELEASE_DATABASE_URL='{secret}'" in lines
    assert "PREFECT_API_URL='http://127.0.0.1:4200/api'" in lines
    assert any(line.startswith("PATH='") for line in lines)
    assert not any(line.startswith("LLM_RELEASE_HOME=") for line in lines)
    service = (out / "llm-release-up.service").read_text()
    assert f"EnvironmentFile=-{env_file}" in service and secret not in service


def test_a_setting_the_environment_file_cannot_take_is_refused_without_its_value(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", "postgresql://u:it's@db/x")
    assert main(["systemd", "--user", "--output", str(tmp_path / "units")]) == 2
    err = capsys.readouterr().err
    assert "LLM_RELEASE_DATABASE_URL" in err and "it's" not in err
    assert not (tmp_path / "units").exists()


def test_a_system_unit_runs_the_servers_as_the_owner_of_the_home_not_root(tmp_path):
    # 'sudo llm-release systemd': the user running it is root; the home is someone else's
    # (as root here, given to nobody; as a plain user, the home is that user's).
    home = tmp_path / "home"
    home.mkdir()
    if os.geteuid() == 0:
        os.chown(home, 65534, 65534)
        assert home.owner() != "root"
    units = systemd_units.render(tmp_path, home, user=False, executable=SCRIPT)
    assert _setting(units.files[units.service], "User") == home.owner()
