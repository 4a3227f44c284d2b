"""flows/cli.py: a command-line run's flags, refused in one line before any Prefect call."""

from __future__ import annotations

import sys

import pytest

from flows import cli


def parsed(monkeypatch, *argv: str) -> cli.CliRun:
    monkeypatch.setattr(sys, "argv", ["flows.release", *argv])
    return cli.cli_config("t")


def test_home_pins_a_deployments_run_to_that_hosts_queue(monkeypatch):
    run = parsed(monkeypatch, "--deployment", "release/release", "--home", "gpu_a")
    assert (run.deployment, run.home) == ("release/release", "gpu_a")
    monkeypatch.setattr("tasks.fleet.host_queues", lambda: ["gpu_a", "gpu_b"])
    assert cli.home_queue(run.home) == "host-gpu_a"
    assert cli.home_queue(None) is None  # the pool's default queue


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--home", "gpu_a"], "add --deployment"),
        (["--deployment", "release/release", "--home", "GPU A"], "is not a host name"),
        (["--deployment", "release/release", "--home", "a" * 200], "at most 40"),
    ],
)
def test_a_bad_home_is_one_line(monkeypatch, argv, expected):
    with pytest.raises(SystemExit) as refused:
        parsed(monkeypatch, *argv)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


def test_a_home_that_never_joined_is_refused_naming_the_hosts(monkeypatch):
    monkeypatch.setattr("tasks.fleet.host_queues", lambda: ["gpu_a"])
    with pytest.raises(cli.ReleaseError) as refused:
        cli.home_queue("gpu_z")
    assert "host 'gpu_z' has not joined the fleet (hosts: gpu_a)" in refused.value.one_line()
    assert "make fleet-join HOST=gpu_z" in refused.value.one_line()
