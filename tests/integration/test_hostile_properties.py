"""Property: whatever listing a hub sends and whatever template an eval set holds, nothing is
written outside the model folder, no code runs, and the answer is the project's error or a
verified result."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from llm_release.config import SourceConfig
from llm_release.errors import ReleaseError
from llm_release.hub.acquire import TransferSettings, acquire
from tests.hostile_hub import HostileHub

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=2, stall_timeout_s=1.0, max_attempts=1, backoff_s=0.0)
WORLD = Path(tempfile.mkdtemp(prefix="llmr-world-", dir="/tmp"))
GOOD_COMMIT = "0123456789abcdef0123456789abcdef01234567"

parts = st.sampled_from(["a", "b", "..", ".", "", ".git", "x.part", "c d", "\\", "\x00", "é"])
names = st.one_of(
    st.lists(parts, min_size=1, max_size=4).map("/".join),
    st.sampled_from(["../x", "a/../../x", f"{WORLD}/abs", "/etc/hostname", ".gitattributes"]),
    st.text(alphabet="ab./\\-_\x00\n", min_size=1, max_size=10),
)
listings = st.lists(
    st.tuples(
        names, st.binary(max_size=64), st.booleans(), st.sampled_from(["ok", "nohash", "long"])
    ),
    min_size=1,
    max_size=4,
)
commits = st.one_of(
    st.just(GOOD_COMMIT), st.sampled_from(["..", "a/b", "", "../../x"]), st.text(max_size=41)
)


def world_files() -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in WORLD.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def hub():
    (WORLD / "abs").write_bytes(b"sentinel")
    with HostileHub() as server:
        yield server
    shutil.rmtree(WORLD, ignore_errors=True)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(listing=listings, commit=commits)
def test_any_listing_ends_verified_or_in_our_error_and_writes_only_its_folder(
    hub, monkeypatch, listing, commit
):
    home = Path(tempfile.mkdtemp(prefix="home-", dir=WORLD))
    monkeypatch.setenv("LLM_RELEASE_HOME", str(home))
    hub.plan.files.clear()
    hub.plan.commit = commit
    for name, body, lfs, how in listing:
        hub.plan.add(name, body, lfs=lfs, hashed=how != "nohash", extra=100 if how == "long" else 0)
    before = world_files()
    try:
        acquired = acquire(SourceConfig(repo_id="evil/model", endpoint=hub.url), settings=FAST)
    except ReleaseError as exc:
        event(f"refused: {type(exc).__name__}")
        acquired = None
    else:
        event("verified")
    after = world_files()
    changed = {p for p in before.keys() | after.keys() if before.get(p) != after.get(p)}
    if commit != GOOD_COMMIT:
        assert acquired is None and not changed, changed
    model_dir = home / "models" / "evil--model" / GOOD_COMMIT
    manifest = str(model_dir.with_name(f"{GOOD_COMMIT}.manifest.json"))
    assert all(p == manifest or Path(p).is_relative_to(model_dir) for p in changed), changed
    assert (WORLD / "abs").read_bytes() == b"sentinel"
    if acquired is not None:
        served = hub.plan.files
        assert acquired.model_dir == model_dir
        # An over-long stream never passes; an empty file is not fetched at all (its
        # published size and hash already say what its bytes are).
        assert all(f.extra == 0 or not f.body for f in served.values())
        for name, file in served.items():
            assert (model_dir / name).read_bytes() == file.body
    shutil.rmtree(home, ignore_errors=True)
