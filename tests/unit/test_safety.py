"""Names from outside: the grammar and the confinement every caller relies on."""

import os

import pytest
from pydantic import ValidationError

from llm_release import safety
from llm_release.config import CandidateConfig, EvalConfig, SourceConfig
from llm_release.errors import ReleaseError
from llm_release.safety import UnsafeNameError


@pytest.mark.parametrize(
    "name",
    ["config.json", "onnx/model_q4.onnx", ".gitattributes", "a/b/c-1_2.safetensors", "x" * 255],
)
def test_plain_hub_names_pass(name):
    assert safety.relative_path(name, "file name") == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../../x",
        "a/./b",
        "a//b",
        "a\\b",
        "x\x00",
        "x\ny",
        "\x7f",
        ".env",
        "a/.git/config",
        "x.part",
        "my file",
        "caf\u00e9",
        "x" * 256,
        7,
        None,
    ],
)
def test_unsafe_names_are_refused_with_the_project_error(name):
    with pytest.raises(UnsafeNameError) as info:
        safety.relative_path(name, "file name")
    assert isinstance(info.value, ReleaseError) and "\n" not in info.value.message


def test_inside_follows_symlinks_out_of_the_folder(tmp_path):
    root = tmp_path / "model"
    root.mkdir()
    os.symlink(tmp_path, root / "link")
    assert safety.inside(root, "a/b") == (root / "a/b").resolve()
    with pytest.raises(UnsafeNameError, match="outside"):
        safety.inside(root, "link/x")


def test_listing_refuses_repeats_and_file_folder_clashes():
    assert safety.listing(["a/b", "a/c", "d"], "file name") == ["a/b", "a/c", "d"]
    with pytest.raises(UnsafeNameError, match="twice"):
        safety.listing(["a", "a"], "file name")
    with pytest.raises(UnsafeNameError, match="both a file and a folder"):
        safety.listing(["a/b/c", "a/b"], "file name")


@pytest.mark.parametrize("commit", ["..", "a/b", "", "G" * 40, "0" * 41, None, 1])
def test_commit_ids_are_forty_hex_digits(commit):
    with pytest.raises(UnsafeNameError, match="40 hex"):
        safety.commit_id(commit, "hub")
    assert safety.commit_id("0" * 40, "hub") == "0" * 40


@pytest.mark.parametrize("name", ["../calibration", "a/b", "/abs", "Upper", "_template", ""])
def test_set_names_in_the_config_are_names_not_paths(name):
    with pytest.raises(ValidationError, match="lower-case"):
        CandidateConfig(name="x", scheme="W4A16_AWQ", calibration_set=name)
    with pytest.raises(ValidationError, match="lower-case"):
        EvalConfig(eval_sets=[name])


@pytest.mark.parametrize("repo_id", ["a/..", "../b", "a/.hidden", "a/b/c", "a b/c"])
def test_repo_ids_name_no_path(repo_id):
    with pytest.raises(ValidationError, match="owner/name"):
        SourceConfig(repo_id=repo_id)
