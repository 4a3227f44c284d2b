"""The record's router_port is input: the project's key goes to the load balancer's port
only while this home's HAProxy holds it, or nothing does (issue 36, found by a review)."""

from __future__ import annotations

import socket

import pytest

from llm_release import paths
from llm_release.canary.router import Router
from llm_release.errors import RouterError
from llm_release.serving.serve import free_port


def test_a_port_another_process_listens_on_gets_no_key(home):
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    try:
        router = Router(paths.router_dir(), stranger.getsockname()[1])
        with pytest.raises(RouterError, match="is held by pid .*not by this home's HAProxy"):
            router.api_key  # noqa: B018 - the property is what a caller reads
        with pytest.raises(RouterError):
            router.auth_headers  # noqa: B018
        assert not router.api_key_path.exists()  # refused before the key was even made
    finally:
        stranger.close()


def test_a_free_port_gets_the_key_as_before(home):
    router = Router(paths.router_dir(), free_port())
    key = router.api_key
    assert key and router.api_key == key and router.api_key_path.exists()
