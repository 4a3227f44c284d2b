import pytest


@pytest.fixture(scope="session")
def prefect_api():
    """A real Prefect API (the test harness's server), one for every end-to-end module: each
    start costs 8-20 s on 2 cores, and the tests look runs up by their own ids."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
