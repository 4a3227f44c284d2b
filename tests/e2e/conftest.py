import pytest


@pytest.fixture(scope="module")
def prefect_api():
    """A real Prefect API (the test harness's server) for the flows of one test module."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
