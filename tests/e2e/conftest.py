import pytest


@pytest.fixture(scope="module")
def prefect_api():
    """A real Prefect API (the test harness's server) for the flows of one test module. Not
    session-scoped: the harness points this process's Prefect settings at its server for as
    long as it lives, and the integration tests that start their own server (the control
    room's webhook events) would then talk to this one."""
    from prefect.testing.utilities import prefect_test_harness

    from tests.helpers import drain_prefect_slot_services

    with prefect_test_harness(server_startup_timeout=120):
        try:
            yield
        finally:
            drain_prefect_slot_services()


@pytest.fixture()
def sets_reported_only(tmp_path, monkeypatch):
    """The shipped eval sets with their gates reported but not blocking, for the tests that
    release a random-weight model to check the flow's mechanics: such a model scores 0 on
    the domain sets, and their measured floors (min_score) rightly refuse it. What the floors
    do is tested in test_decisions_e2e.py and tests/unit/decision/test_select.py."""
    import shutil

    from llm_release import paths

    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    for task in root.glob("*/task.yaml"):
        text = task.read_text()
        if "  critical: true" in text:
            task.write_text(text.replace("  critical: true", "  critical: false", 1))
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(root))
    return root
