"""secret_files.made_secret: a secret file appears whole, made once, even when several
processes ask for it at the same moment (real processes, one file)."""

from __future__ import annotations

import multiprocessing
import stat
from pathlib import Path

from llm_release.secret_files import home_token, token_valid


def _ask(path: str, barrier, out) -> None:
    barrier.wait()
    try:
        out.put(home_token(Path(path), "the test's token", "delete it"))
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails on it
        out.put(f"ERROR {type(exc).__name__}: {exc}")


def test_processes_asking_at_once_all_read_the_one_secret_made(tmp_path):
    context = multiprocessing.get_context("fork")
    for round_ in range(5):
        path = tmp_path / f"key-{round_}"
        barrier, out = context.Barrier(8), context.Queue()
        workers = [context.Process(target=_ask, args=(str(path), barrier, out)) for _ in range(8)]
        for worker in workers:
            worker.start()
        answers = [out.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        assert len(set(answers)) == 1 and token_valid(answers[0]), answers
        assert path.read_text().strip() == answers[0]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_an_existing_secret_is_read_not_made_again(tmp_path):
    path = tmp_path / "key"
    first = home_token(path, "the test's token", "delete it")
    assert home_token(path, "the test's token", "delete it") == first
