"""The registry on the record (SQLite under the test's home): what is saved loads back
whole, a block that raises in ``locked()`` leaves the record as it was, and a row that no
longer validates is refused in one line naming the record."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from llm_release import registry
from llm_release.config import ServingConfig
from llm_release.errors import StateError
from llm_release.record import store
from llm_release.record.schema import RegistryRow, ReleaseRow
from llm_release.registry import RegistryState, Release


def _release(release_id: str) -> Release:
    return Release(
        release_id=release_id,
        candidate="baseline",
        scheme="unquantized",
        repo_id="a/b",
        commit="a" * 40,
        model_dir="/m",
        public_name="b",
        port=9001,
        log_path="/l",
        serving=ServingConfig(max_model_len=1024),
    )


def test_the_registry_keeps_its_api_on_the_record(home):
    state = RegistryState(router_port=8080, stable=_release("baseline-1"))
    state.log("stable", release="baseline-1")
    registry.save(state)
    assert registry.load() == state
    assert (home / "record.db").is_file() and not registry.registry_path().exists()

    with pytest.raises(RuntimeError), registry.locked() as current:
        current.canary = _release("fp8-2")
        current.canary_weight = 5
        current.log("canary", release="fp8-2", weight=5)
        raise RuntimeError("the canary did not start")
    assert registry.load() == state

    with registry.locked() as current:
        current.canary, current.canary_weight = _release("fp8-2"), 5
        current.log("canary", release="fp8-2", weight=5)
    after = registry.load()
    assert after.canary.release_id == "fp8-2" and [e["event"] for e in after.history] == [
        "stable",
        "canary",
    ]


def test_a_row_that_does_not_validate_is_refused_in_one_line(home):
    registry.save(RegistryState(stable=_release("baseline-1")))
    with store.transaction() as session:
        session.execute(update(ReleaseRow).values(serving={"max_model_len": "many"}))
    with pytest.raises(
        StateError, match="the release registry in the record .* is corrupt"
    ) as caught:
        registry.load()
    assert "\n" not in caught.value.one_line()
    with store.transaction() as session:  # the home fixture's teardown reads the registry
        session.execute(update(ReleaseRow).values(serving={}))


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("public_name", "--host=0.0.0.0"),
        ("public_name", "--trust-remote-code"),
        ("candidate", "-x"),
        ("public_name", "b" * 200),
        ("public_name", "a b"),
    ],
)
def test_a_recorded_name_that_would_reach_vllms_argv_as_a_flag_is_refused_on_load(
    home, capsys, column, value
):
    from llm_release.cli import main

    registry.save(RegistryState(stable=_release("baseline-1")))
    assert registry.load().stable.public_name == "b"  # a valid record loads
    with store.transaction() as session:
        session.execute(update(ReleaseRow).values({column: value}))
    with pytest.raises(StateError, match=rf"stable\.{column} .* is not a served name") as caught:
        registry.load()
    line = caught.value.one_line()
    assert "\n" not in line and "letters, digits" in line, line
    with pytest.raises(StateError, match=rf"release 'baseline-1' .* corrupt \({column} "):
        registry.releases()
    # 'down' still runs: it says what is wrong and stops what the project started
    assert main(["down"]) == 1
    said = capsys.readouterr()
    assert f"stable.{column}" in said.err and "Traceback" not in said.err
    with store.transaction() as session:  # the home fixture's teardown reads the registry
        session.execute(update(ReleaseRow).values({column: "b"}))


def test_a_release_with_a_flag_for_a_name_is_never_made():
    from pydantic import ValidationError

    for field in ("release_id", "public_name", "candidate"):
        with pytest.raises(ValidationError, match="is not a served name"):
            _release("baseline-1").model_validate(
                {**_release("baseline-1").model_dump(), field: "--host=0.0.0.0"}
            )


@pytest.mark.parametrize(
    ("column", "value", "why"),
    [
        ("pid", -1, "greater than or equal to 0"),  # kill(-1) signals every process
        ("pid", 2**31, "less than or equal to"),
        ("port", 22, "greater than or equal to 1024"),  # the key would go to sshd
        ("port", 70000, "less than or equal to 65535"),
        ("supervisor_port", 80, "greater than or equal to 1024"),
        ("container", "--rm", "should match pattern"),
        ("commit", "main", "should match pattern"),
        ("repo_id", "../../etc", "should match pattern"),
        ("pid_started", -5.0, "greater than or equal to 0"),
        # a published card's text: no markdown or newline of the record's own
        ("scheme", "FP8_DYNAMIC\n## Evaluation\n| all | 1.0 |", "should match pattern"),
    ],
)
def test_a_recorded_number_or_id_out_of_its_range_is_refused_on_load(home, column, value, why):
    registry.save(RegistryState(stable=_release("baseline-1")))
    with store.transaction() as session:
        session.execute(update(ReleaseRow).values({column: value}))
    with pytest.raises(StateError, match=rf"stable\.{column}: .*{why}") as caught:
        registry.load()
    assert "\n" not in caught.value.one_line()
    with store.transaction() as session:  # the home fixture's teardown reads the registry
        original = getattr(_release("baseline-1"), column)
        session.execute(update(ReleaseRow).values({column: original}))


@pytest.mark.parametrize(("column", "value"), [("router_port", 443), ("canary_weight", 101)])
def test_the_registrys_own_numbers_out_of_range_are_refused_on_load(home, column, value):
    registry.save(RegistryState(router_port=8080, stable=_release("baseline-1")))
    with store.transaction() as session:
        session.execute(update(RegistryRow).values({column: value}))
    with pytest.raises(StateError, match=rf"\({column}: .*than or equal to"):
        registry.load()
    with store.transaction() as session:
        session.execute(
            update(RegistryRow).values({column: 8080 if column == "router_port" else 0})
        )


@pytest.mark.parametrize(
    "origin",
    [
        {"calibration_set": "maint\n## Evaluation"},
        {"calibration_sha256": "not-a-digest"},
        {"cache_key": "k" * 64},
        {"files": {"../../etc/passwd": "a" * 64}},
        {"files": {"/etc/passwd": "a" * 64}},
        {"files": {"a | b`": "a" * 64}},
        {"files": {"model.safetensors\n## x": "a" * 64}},
        {"files": {"model.safetensors": "z" * 64}},
        {"recipe": {"ignore": ["lm_head"] * 20_000}},  # a card's metadata of 300 KB
    ],
)
def test_a_recorded_origin_holds_only_what_the_pipeline_writes(origin):
    # Each of these is written into a published model card (hub/publish.py model_card).
    from llm_release.registry import Origin

    with pytest.raises(ValueError):
        Origin(**origin)
    Origin(
        calibration_set="manufacturing_maintenance",
        calibration_sha256="c" * 64,
        cache_key="9" * 64,
        files={"model.safetensors": "e" * 64, "sub/dir/tokenizer.json": "f" * 64},
        recipe={"scheme": "W4A16", "group_size": 64, "ignore": ["lm_head"]},
    )
