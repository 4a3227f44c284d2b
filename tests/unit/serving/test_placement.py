"""Side by side on a GPU host: slots per measurement, the host's slots, the client's CPUs."""

import pytest

from llm_release.config import ServingConfig
from llm_release.serving.placement import client_cpus, gpus_needed, host_slots, slots_for

EIGHT = list(range(8))


def test_a_fresh_host_gets_one_slot_per_gpu_and_a_cpu_host_one():
    assert host_slots(EIGHT) == 8
    assert host_slots([0]) == 1
    assert host_slots([]) == 1


@pytest.mark.parametrize(
    ("serving", "needed"),
    [
        (ServingConfig(), 1),
        (ServingConfig(tensor_parallel_size=4), 4),
        (ServingConfig(gpus=2), 2),
        (ServingConfig(gpus=[5, 6, 7]), 3),
        (ServingConfig(gpus="all"), 8),
    ],
)
def test_a_measurement_takes_as_many_slots_as_gpus(serving, needed):
    assert gpus_needed(serving, EIGHT) == needed
    assert slots_for(serving, EIGHT, limit=8) == needed


def test_on_a_cpu_host_every_measurement_takes_the_one_slot():
    assert gpus_needed(ServingConfig(tensor_parallel_size=4), []) == 0
    assert slots_for(ServingConfig(tensor_parallel_size=4), [], limit=1) == 1


def test_never_more_slots_than_the_limit_which_could_never_be_met():
    # The operator lowered the limit to the GPUs serving releases leave free (2 of 8).
    assert slots_for(ServingConfig(tensor_parallel_size=4), EIGHT, limit=2) == 2


def test_the_client_runs_on_the_cpu_share_of_its_servers_gpus():
    cpus = list(range(128))
    assert client_cpus([0], EIGHT, cpus) == list(range(16))
    assert client_cpus([2, 3], EIGHT, cpus) == list(range(32, 64))
    # Two measurements side by side never share a CPU.
    assert not set(client_cpus([0, 1], EIGHT, cpus)) & set(client_cpus([2], EIGHT, cpus))


def test_no_pinning_where_there_is_nothing_to_share():
    assert client_cpus([], EIGHT, list(range(128))) is None  # a CPU server
    assert client_cpus([0], [], list(range(2))) is None  # a CPU host
    assert client_cpus([0], EIGHT, [0, 1]) is None  # fewer CPUs than GPUs
    assert client_cpus([0], [0], [3, 1]) == [1, 3]  # one GPU: every CPU, as allowed
