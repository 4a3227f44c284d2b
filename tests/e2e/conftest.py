import pytest


@pytest.fixture(scope="module")
def prefect_api():
    """A real Prefect API (the test harness's server) for the flows of one test module. Not
    session-scoped: the harness points this process's Prefect settings at its server for as
    long as it lives, and the integration tests that start their own server (the control
    room's webhook events) would then talk to this one."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
