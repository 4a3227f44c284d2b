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
