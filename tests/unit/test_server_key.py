"""The servers' key file is a secret: made 0600, refused in one line when its group or others
may open it (every server and HAProxy would otherwise hand it to any local user)."""

from __future__ import annotations

import os

import pytest

from llm_release import server_key
from llm_release.errors import ConfigError


def test_the_key_is_made_private_and_read_back(tmp_path):
    made = server_key.key(tmp_path)
    assert server_key.read(server_key.key_path(tmp_path)) == made
    assert oct(server_key.key_path(tmp_path).stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o660])
def test_a_key_its_group_or_others_may_open_is_refused_in_one_line(tmp_path, mode):
    server_key.key(tmp_path)
    path = server_key.key_path(tmp_path)
    os.chmod(path, mode)
    with pytest.raises(ConfigError) as caught:
        server_key.read(path)
    assert str(path) in caught.value.message and "\n" not in caught.value.message
    with pytest.raises(ConfigError):
        server_key.key(tmp_path)


def test_a_key_edited_to_something_else_is_refused(tmp_path):
    path = server_key.key_path(tmp_path)
    server_key.key(tmp_path)
    path.write_text("--host=0.0.0.0\n")
    with pytest.raises(ConfigError, match="holds no key"):
        server_key.read(path)
