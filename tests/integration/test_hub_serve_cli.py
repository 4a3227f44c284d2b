"""'llm-release hub serve' (make hub-up's demo hub) takes writes only with its token: a
token made 0600 in the home at its first start; huggingface_hub without it is refused and
creates nothing, with it the repo is made; reads stay open, as a public hub's are."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError

from llm_release.serving.serve import free_port, stop_process_group

pytestmark = pytest.mark.integration

CLI = Path(sys.executable).parent / "llm-release"


@pytest.fixture()
def hub(tmp_path):
    home = tmp_path / "home"
    port = free_port()
    env = os.environ | {"LLM_RELEASE_HOME": str(home)}
    proc = subprocess.Popen(
        [str(CLI), "hub", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                requests.get(f"{url}/api/models/none/none", timeout=2)
                break
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stdout.read().decode()
                assert time.monotonic() < deadline, "the hub did not answer in 60 s"
                time.sleep(0.2)
        yield url, home
    finally:
        stop_process_group(proc.pid, grace_s=5)


def test_a_write_needs_the_token_made_in_the_home(hub):
    url, home = hub
    token_file = home / "hub.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()

    with pytest.raises(HfHubHTTPError) as refused:
        HfApi(endpoint=url, token=False).create_repo("acme/planted")
    assert refused.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as wrong:
        HfApi(endpoint=url, token="hf_" + "x" * 40).create_repo("acme/planted")
    assert wrong.value.response.status_code == 401
    assert not list((home / "hub").rglob("planted"))

    HfApi(endpoint=url, token=token).create_repo("acme/released")
    assert requests.get(f"{url}/api/models/acme/released", timeout=5).status_code == 200
