"""CLI errors caused by input: one line on stderr (what is wrong, how to fix), non-zero exit,
no traceback unless --debug."""

import pytest

from llm_release.cli import main as cli
from llm_release.errors import ReleaseError


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["download", "not-a-repo"], "owner/name"),
        (["download", "a/b", "--endpoint", "https://user:pw-hunter2@hub.example"], "credentials"),
        (["download", "a/b", "--endpoint", "ftp://hub.example"], "http"),
        (["verify", "/nonexistent/model"], "no manifest"),
        (["canary", "rollback"], "no canary"),
        (["eval-sets", "validate", "../../etc"], "not allowed"),
        (["eval-sets", "new", "Bad Name"], "eval set name"),
    ],
)
def test_input_errors_are_one_line_with_a_non_zero_exit(home, capsys, argv, expected):
    code = cli(argv)
    captured = capsys.readouterr()
    text = captured.err or captured.out
    assert code != 0
    assert expected in text and "Traceback" not in text
    assert len(captured.err.strip().splitlines()) <= 1
    assert "hunter2" not in captured.err + captured.out


def test_debug_shows_the_exception(home):
    with pytest.raises(ReleaseError):
        cli(["--debug", "canary", "rollback"])


LONG = "a" * 5000


@pytest.mark.parametrize(
    "argv, bound",
    [
        (["plan", f"acme/{LONG}"], "at most 4096"),
        (["plan", LONG], "at most 4096"),
        (["plan", f"/{'d' * 300}/model"], "255 a part"),
        (["plan", "acme/" + "b" * 120, "--endpoint", "http://127.0.0.1:9"], "at most 96"),
        (["plan", "acme/x\x1b[2J", "--endpoint", "http://127.0.0.1:9"], "control character"),
        (["plan", "acme/x..y|z"], "at most 96"),
        (["plan", "~no-such-user-here/x"], "cannot be read"),
        (["plan", "acme/x", "--revision", LONG], "1 to 256"),
        (["plan", "acme/x", "--revision", "main\x1b[2J"], "1 to 256"),
        (["eval-sets", "new", LONG, "--min-score", "0.5"], "at most 64 characters"),
        (["eval-sets", "new", "x" * 65, "--min-score", "0.5"], "at most 64 characters"),
        (["eval-sets", "new", "a\x1b]0;owned\x07", "--min-score", "0.5"], "at most 64 characters"),
    ],
)
def test_hostile_or_overlong_names_are_one_line_naming_the_bound(
    home, tmp_path, capsys, argv, bound
):
    """Before the disk, a hub or the template is touched: no 'unexpected OSError: File name
    too long', the name shown escaped and cut, nothing created."""
    root = tmp_path / "sets"
    root.mkdir()
    if argv[0] == "eval-sets":
        argv = [*argv, "--root", str(root)]
    code = cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and bound in lines[0], err
    assert "unexpected" not in err and "\x1b" not in err and "\x07" not in err
    assert len(err) < 700 and list(root.iterdir()) == []


def test_status_prints_the_records_texts_inert(monkeypatch, capsys, home):
    """A rollout reason, a release id or a supervisor's reason read from the record reach
    the terminal escaped (issue 36, found by a review): no escape sequence runs."""
    from llm_release.canary import promote

    evil = "x\x1b]0;owned\x07\x1b[2J\u202e"
    info = {
        "lb_url": "http://127.0.0.1:8080",
        "router_running": True,
        "api_key_file": "/h/key",
        "alertmanager": {
            "url": "u",
            "running": True,
            "notifies": None,
            "user": "u",
            "password_file": "p",
            "amtool": ["amtool"],
        },
        "releases": [
            {
                "role": "stable",
                "release_id": evil,
                "weight": 100,
                "requests": 0,
                "health": "ok",
                "process_alive": True,
                "server": {"state": "running", "restarts": 0, "reason": evil},
            }
        ],
        "rollout": {
            "release_id": evil,
            "state": "walking",
            "weight": 25,
            "steps": [25, 100],
            "last_window": {"weight": 25, "index": 1, "verdict": "pass", "reason": evil},
            "reason": evil,
        },
    }
    monkeypatch.setattr(promote, "status", lambda: info)
    assert cli(["canary", "status"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert out.count("x\\x1b]0;owned\\x07\\x1b[2J\\u202e") == 5, out
