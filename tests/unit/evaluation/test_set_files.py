"""An eval set's files are read as hostile data: what is not a plain file, or is larger than
its bound, is refused before a byte is read, and one such set hides no other in ``list``."""

import hashlib
import os
import shutil
import threading

import pytest

from llm_release import paths
from llm_release.evaluation import items
from llm_release.evaluation.authoring import describe, scaffold
from llm_release.evaluation.set_files import EvalSetError, read_text, recording_reads


@pytest.fixture()
def root(tmp_path):
    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    scaffold("kb2", root, min_score=0.0)
    return root


def listed_within(root, seconds: float) -> dict[str, dict]:
    """``describe(root)`` by name, failing the test if it has not answered in ``seconds``
    (a reader stuck on a FIFO would otherwise hang the suite)."""
    found: list = []
    worker = threading.Thread(target=lambda: found.append(describe(root)), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"eval-sets list hung for {seconds} s"
    (rows,) = found
    return {row["name"]: row for row in rows}


def test_a_fifo_for_items_is_refused_at_once_and_hides_no_other_set(root):
    data = root / "kb2" / "data.jsonl"
    data.unlink()
    os.mkfifo(data)
    rows = listed_within(root, 20)
    assert "data.jsonl" in rows["kb2"]["error"] and "not a regular file" in rows["kb2"]["error"]
    assert rows["manufacturing_kb"]["items"] == 80


def test_a_folder_in_place_of_the_items_is_that_sets_error_only(root):
    data = root / "kb2" / "data.jsonl"
    data.unlink()
    data.mkdir()
    rows = listed_within(root, 20)
    assert "not a regular file" in rows["kb2"]["error"]
    assert rows["refusal_kb"]["items"] > 0


def test_a_file_past_its_bound_is_refused_by_its_size_before_it_is_read(tmp_path):
    """A sparse file of 64 GiB: read first and measured after, it would take the machine's
    memory; its size is the answer."""
    huge = tmp_path / "data.jsonl"
    with open(huge, "wb") as handle:
        handle.truncate(64 << 30)
    with pytest.raises(EvalSetError, match=f"is {64 << 30} bytes; at most {items.MAX_DATA_BYTES}"):
        read_text(huge, items.MAX_DATA_BYTES)


def test_a_missing_file_is_a_one_line_error_naming_it(tmp_path):
    with pytest.raises(EvalSetError, match="gone.yaml: cannot be read: No such file"):
        read_text(tmp_path / "gone.yaml", 100)


def test_reads_are_recorded_with_their_digest_only_inside_the_block(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("task: a\n")
    read_text(path)
    with recording_reads() as reads:
        assert read_text(path, 100) == "task: a\n"
    read_text(path)
    assert list(reads) == [str(path.absolute())]
    assert reads[str(path.absolute())] == hashlib.sha256(b"task: a\n").hexdigest()
