"""Local model folders: only under the operator's roots, and no link leads out of them."""

import json
import os
import time

import pytest

from llm_release.config import ReleaseConfig, SourceConfig
from llm_release.errors import AcquireError, ConfigError, IntegrityError, ReleaseError
from llm_release.hub import local_source
from llm_release.hub.acquire import acquire, resolve
from llm_release.hub.local_source import ROOTS_ENV


@pytest.fixture()
def store(tmp_path, monkeypatch):
    """An operator's model store with one model folder, a secret next to (not in) it, and
    LLM_RELEASE_HOME / LLM_RELEASE_LOCAL_ROOTS set."""
    root = tmp_path / "store"
    model = root / "acme" / "tiny"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "weights.bin").write_bytes(os.urandom(4096))
    secret = tmp_path / "outside" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv(ROOTS_ENV, str(root))
    return model


def local(path) -> SourceConfig:
    return SourceConfig(hub="local", repo_id="acme/tiny", local_path=str(path))


def copied(tmp_path) -> list[str]:
    models = tmp_path / "home" / "models"
    return [p.name for p in models.rglob("*") if p.is_file()] if models.exists() else []


def test_a_folder_under_a_root_is_copied_and_verified(store, tmp_path):
    acquired = acquire(local(store))
    assert (acquired.model_dir / "weights.bin").read_bytes() == (store / "weights.bin").read_bytes()
    assert acquire(local(store)).reused


def test_without_configured_roots_every_local_source_is_refused(store, tmp_path, monkeypatch):
    monkeypatch.delenv(ROOTS_ENV)
    with pytest.raises(ConfigError) as caught:
        acquire(local(store))
    assert ROOTS_ENV in caught.value.one_line() and "\n" not in caught.value.one_line()
    assert copied(tmp_path) == []


@pytest.mark.parametrize("path", ["/etc/ssh", "/", "/proc/self", "OUTSIDE"])
def test_a_path_outside_the_roots_is_refused_before_any_file_is_read(store, tmp_path, path):
    path = str(tmp_path / "outside") if path == "OUTSIDE" else path
    started = time.monotonic()
    with pytest.raises(ConfigError, match="outside the folders local models may come from"):
        resolve(local(path))
    assert time.monotonic() - started < 1, "the filesystem was walked"
    with pytest.raises(ConfigError):
        acquire(local(path))
    assert copied(tmp_path) == []


def test_a_relative_or_climbing_path_is_refused(store):
    with pytest.raises(ValueError, match="absolute path"):
        local("acme/tiny")
    with pytest.raises(ConfigError, match="outside"):
        resolve(local(f"{store}/../../../outside"))


def test_a_link_to_a_file_outside_the_root_is_refused_file_by_file(store, tmp_path):
    (store / "tokenizer.json").symlink_to(tmp_path / "outside" / "id_ed25519")
    with pytest.raises(ConfigError, match="'tokenizer.json' is a link that leads outside"):
        acquire(local(store))
    assert copied(tmp_path) == []
    (store / "tokenizer.json").unlink()
    (store / "passwd").symlink_to("/etc/passwd")
    with pytest.raises(ConfigError, match="'passwd' is a link"):
        resolve(local(store))


def test_a_linked_folder_leading_out_is_refused(store, tmp_path):
    (store / "extra").symlink_to("/etc")
    with pytest.raises(ConfigError, match="'extra' is a link that leads outside"):
        resolve(local(store))
    # The model folder itself a link out of the root: refused as outside.
    (store.parent / "alias").symlink_to(tmp_path / "outside")
    with pytest.raises(ConfigError, match="outside the folders"):
        resolve(local(store.parent / "alias"))


def test_links_that_stay_inside_the_root_are_followed(store):
    # The Hugging Face cache layout: snapshot files link to blobs elsewhere in the store.
    blobs = store.parent.parent / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_text("{}")
    (store / "generation_config.json").symlink_to(blobs / "abc")
    (store / "loop").symlink_to(store)  # a link loop ends
    _, files = resolve(local(store))
    assert {f.path for f in files} == {"config.json", "generation_config.json", "weights.bin"}


def test_a_fifo_is_refused_without_blocking(store):
    os.mkfifo(store / "pipe")
    with pytest.raises(ConfigError, match="'pipe' is not a regular file"):
        resolve(local(store))


def test_a_link_swapped_in_after_the_check_reads_nothing(store, tmp_path):
    where = local_source.folder(str(store))
    checked = local_source.checked_file(where, "weights.bin")
    (store / "weights.bin").unlink()
    (store / "weights.bin").symlink_to(tmp_path / "outside" / "id_ed25519")
    with pytest.raises(AcquireError, match="cannot be opened"):
        local_source.open_file(where, checked)
    # A folder on the way swapped for a link: the opened file is checked through /proc.
    (store / "sub").mkdir()
    (store / "sub" / "w").write_text("x")
    checked = local_source.checked_file(where, "sub/w")
    (store / "sub" / "w").unlink()
    (store / "sub").rmdir()
    (tmp_path / "outside" / "w").write_text("secret")
    (store / "sub").symlink_to(tmp_path / "outside")
    with pytest.raises(ConfigError, match="changed into a link outside"):
        local_source.open_file(where, checked)


def test_a_swap_between_listing_and_copy_fails_the_download(store, tmp_path, monkeypatch):
    real_files, real_sha256 = local_source.files, local_source.sha256
    digests = {}

    def listed_then_swapped(where):
        found = real_files(where)
        digests.update({f.relative: real_sha256(where, f) for f in found})
        (store / "weights.bin").unlink()
        (store / "weights.bin").symlink_to(tmp_path / "outside" / "id_ed25519")
        return found

    monkeypatch.setattr(local_source, "files", listed_then_swapped)
    monkeypatch.setattr(local_source, "sha256", lambda where, f: digests[f.relative])
    with pytest.raises(IntegrityError, match="link that leads outside"):
        acquire(local(store))
    assert "id_ed25519" not in copied(tmp_path)


def test_roots_must_be_absolute_and_not_the_filesystem_root(store, monkeypatch):
    monkeypatch.setenv(ROOTS_ENV, "models")
    with pytest.raises(ConfigError, match="not an absolute path"):
        resolve(local(store))
    monkeypatch.setenv(ROOTS_ENV, "/")
    with pytest.raises(ConfigError, match="filesystem root"):
        resolve(local(store))
    # Several roots, os.pathsep-separated: any of them allows the folder.
    monkeypatch.setenv(ROOTS_ENV, os.pathsep.join(["/nonexistent", str(store.parent.parent)]))
    assert resolve(local(store))[1]


def test_a_folder_of_too_many_files_is_refused_before_hashing(store, monkeypatch):
    monkeypatch.setattr(local_source, "MAX_FILES", 2)
    (store / "more").write_text("x")
    with pytest.raises(ConfigError, match="more than 2 files"):
        resolve(local(store))


def test_the_plan_reads_no_file_outside_the_roots(store, tmp_path, monkeypatch):
    from llm_release.serving.capacity import read_release_model

    (store / "config.json").unlink()
    (store / "config.json").symlink_to(tmp_path / "outside" / "id_ed25519")
    config = ReleaseConfig.model_validate(
        {"source": {"hub": "local", "repo_id": "acme/tiny", "local_path": str(store)}}
    )
    with pytest.raises(ConfigError, match="'config.json' is a link that leads outside"):
        read_release_model(config)
    outside = ReleaseConfig.model_validate(
        {"source": {"hub": "local", "repo_id": "acme/tiny", "local_path": "/etc/ssh"}}
    )
    with pytest.raises(ReleaseError, match="outside the folders"):
        read_release_model(outside)


def test_preflight_refuses_a_local_path_outside_the_roots(store):
    from llm_release.preflight import check

    config = ReleaseConfig.model_validate(
        {"source": {"hub": "local", "repo_id": "acme/tiny", "local_path": "/etc/ssh"}}
    )
    with pytest.raises(ConfigError, match="outside the folders"):
        check(config)
