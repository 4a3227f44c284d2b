"""scripts/host_standins.py: a host's packages stood in (name, version, extras) for the
wheelhouse's resolution against that host (scripts/wheelhouse.sh --host-packages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "host_standins.py"


def test_the_interpreter_sees_each_host_package_with_its_version_and_extras(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("httpx==0.28.1\ntorch==2.11.0\n\n# a comment\n")
    report = tmp_path / "report.json"
    httpx_meta = {
        "name": "httpx",
        "version": "0.28.1",
        "provides_extra": ["http2"],
        "requires_dist": ["anyio", "h2<5,>=3; extra == 'http2'"],
    }
    report.write_text(json.dumps({"install": [{"metadata": httpx_meta}]}))
    out = subprocess.run(
        [str(python), str(SCRIPT), str(freeze), str(tmp_path / "host"), str(report)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "2 host packages stood in" in out.stdout
    seen = subprocess.run(
        [
            str(python),
            "-c",
            "import json; from importlib import metadata as m; print(json.dumps({n: ["
            "m.version(n), m.metadata(n).get_all('Provides-Extra'), m.requires(n)] "
            "for n in ('httpx', 'torch')}))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    got = json.loads(seen.stdout)
    # the extra's requirement is kept, the unconditional one left out (the host is consistent)
    assert got["httpx"] == ["0.28.1", ["http2"], ["h2<5,>=3; extra == 'http2'"]]
    assert got["torch"] == ["2.11.0", None, None]


def test_a_line_that_is_not_name_version_is_refused_naming_it(tmp_path):
    freeze = tmp_path / "freeze.txt"
    freeze.write_text("numpy==2.5.2\n-e git+https://example.invalid/x.git#egg=x\n")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(freeze), str(tmp_path / "host")],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 1
    assert f"{freeze}:2: '-e git+https" in out.stderr
    assert "is not name==version" in out.stderr
