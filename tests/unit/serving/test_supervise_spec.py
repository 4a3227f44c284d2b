"""A supervisor runs only a spec that is its own user's and no one else's to read or write:
the spec names the command it runs (and the server's environment, its key among it), so one
another user could edit would run their command as this one. Real processes: the
supervisor module started as its starter starts it, on specs written here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llm_release.serving.supervise import MODULE, RestartPolicy, SuperviseSpec


def _spec(tmp_path: Path, marker: Path) -> Path:
    spec = SuperviseSpec(
        release_id="r1",
        role="stable",
        service="svc",
        command=[sys.executable, "-c", f"open({str(marker)!r}, 'w').write('ran')"],
        env={},
        log_path=str(tmp_path / "server.log"),
        health_url="http://127.0.0.1:9/health",
        metrics_port=0,
        policy=RestartPolicy(),
    )
    path = tmp_path / "server.supervise.json"
    path.write_text(spec.model_dump_json())
    return path


def _supervise(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", MODULE, str(path)], capture_output=True, text=True, timeout=60
    )


def test_a_spec_open_to_other_users_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    path = _spec(tmp_path, marker)
    os.chmod(path, 0o664)
    result = _supervise(path)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("supervisor: spec: ") and "open to its group or other users" in line
    assert "mode 0664" in line and "chmod 600" in line and line.endswith("; nothing started")
    assert not marker.exists()


def test_a_spec_not_in_the_schema_or_missing_is_refused_in_one_line(tmp_path):
    path = tmp_path / "server.supervise.json"
    path.write_text('{"command": ["sh", "-c", "true"]}')
    os.chmod(path, 0o600)
    result = _supervise(path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith("supervisor: invalid input: ") and "release_id" in line
    result = _supervise(tmp_path / "absent.json")
    assert result.returncode == 2 and "cannot read" in result.stderr
