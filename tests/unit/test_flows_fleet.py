"""A host's card as `python -m flows.fleet join` reads or is told it (the Prefect side:
tests/integration/test_fleet.py)."""

from __future__ import annotations

import pytest

from flows import fleet
from llm_release.errors import ConfigError


def test_a_stated_card_carries_the_gpus_name_for_the_planner():
    card = fleet.read_card("gpu_a", 2, 79.2, "NVIDIA A100-SXM4-80GB")
    assert [(g.index, g.memory_gib, g.name) for g in card.gpus] == [
        (0, 79.2, "NVIDIA A100-SXM4-80GB"),
        (1, 79.2, "NVIDIA A100-SXM4-80GB"),
    ]
    assert card.source == "stated"
    assert [g.name for g in fleet.read_card("gpu_b", 1, 80).gpus] == [""]


@pytest.mark.parametrize("bad", ["A100\n", "x" * 101, "GPU\x1b[31m"])
def test_a_stated_name_that_is_no_gpus_name_is_one_line(bad, capsys):
    with pytest.raises(ConfigError, match="is not a GPU's name"):
        fleet.read_card("gpu_a", 1, 80, bad)
    argv = ["join", "gpu_a", "--gpus", "1", "--gpu-memory-gib", "80", "--gpu-name", bad]
    assert fleet.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --gpu-name ") and err.count("\n") == 1
