"""Canary weight steps: only 1..99 (100 is a promotion, 0 a rollback, both stop a server),
and only while a canary is live; a refused step changes nothing."""

import pytest

from llm_release import registry
from llm_release.canary import promote
from llm_release.errors import ConfigError, StateError


@pytest.mark.parametrize("weight", [0, 100, -5, 101, True, 2.5, "50"])
def test_a_weight_outside_1_to_99_is_refused(home, weight):
    with pytest.raises(ConfigError) as caught:
        promote.set_canary_weight(weight)
    assert "promote" in caught.value.hint and "rollback" in caught.value.hint


def test_a_step_without_a_live_canary_is_refused_and_changes_nothing(home):
    with pytest.raises(StateError, match="no live canary"):
        promote.set_canary_weight(25)
    assert registry.load().history == []
