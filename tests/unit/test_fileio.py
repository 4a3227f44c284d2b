"""The locked JSON record: changes from processes and threads that contend for it take
turns (none is lost), a block that raises leaves the file as it was. The git blob id:
what ``git hash-object`` prints."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import threading
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from llm_release.fileio import git_blob_hasher, git_blob_sha1, locked_json
from tests.helpers import require_tool


class Counter(BaseModel):
    count: int = 0
    writers: list[str] = []


def load_from(path: Path):
    def load() -> Counter:
        return Counter.model_validate_json(path.read_text()) if path.exists() else Counter()

    return load


def add(path: Path, who: str, times: int) -> None:
    for _ in range(times):
        with locked_json(path, load_from(path)) as counter:
            seen = counter.count
            time.sleep(0.002)  # a read-modify-write that another writer would interleave
            counter.count = seen + 1
            counter.writers.append(who)


def test_processes_contending_for_the_record_lose_no_change(tmp_path):
    path = tmp_path / "state" / "counter.json"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=add, args=(path, f"p{i}", 25)) for i in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    counter = Counter.model_validate_json(path.read_text())
    assert counter.count == 75
    assert sorted(set(counter.writers)) == ["p0", "p1", "p2"] and len(counter.writers) == 75
    assert (tmp_path / "state" / "counter.lock").exists()


def test_threads_contending_for_the_record_lose_no_change(tmp_path):
    path = tmp_path / "counter.json"
    threads = [threading.Thread(target=add, args=(path, f"t{i}", 20)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert Counter.model_validate_json(path.read_text()).count == 80


def test_a_block_that_raises_leaves_the_file_as_it_was(tmp_path):
    path = tmp_path / "counter.json"
    add(path, "first", 1)
    before = path.read_text()
    with pytest.raises(RuntimeError), locked_json(path, load_from(path)) as counter:
        counter.count = 99
        raise RuntimeError("half way")
    assert path.read_text() == before
    assert json.loads(before) == {"count": 1, "writers": ["first"]}
    # the lock was let go: the next writer gets it at once
    add(path, "second", 1)
    assert Counter.model_validate_json(path.read_text()).count == 2


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"hello\n",
        b'{"architectures": ["LlamaForCausalLM"]}',
        bytes(range(256)) * 3,  # NUL bytes and every other byte
        b"\x00\xff" * (4 * 1024 * 1024 + 7),  # longer than one read of HASH_CHUNK
    ],
    ids=["empty", "text", "json", "binary", "over-a-chunk"],
)
def test_git_blob_sha1_is_what_git_hash_object_prints(tmp_path, data):
    require_tool("git")
    path = tmp_path / "file"
    path.write_bytes(data)
    expected = subprocess.run(
        ["git", "hash-object", "--no-filters", str(path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert git_blob_sha1(data) == expected
    assert git_blob_sha1(path) == expected
    digest = git_blob_hasher(len(data))  # the download's streaming hash
    digest.update(data)
    assert digest.hexdigest() == expected
