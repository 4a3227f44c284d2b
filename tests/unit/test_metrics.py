import pytest

from llm_release import metrics


@pytest.mark.parametrize(
    ("reference", "answer", "expected"),
    [
        ("85 N·m", "Tighten to 85 N·m.", 1.0),
        ("85 N·m", "Tighten to 58 N·m.", 0.0),
        ("2.5 bar", "Set it to 2,5 bar", 1.0),
        ("3250 hours", "every 3250 hours of operation", 1.0),
        ("12 mm", "", 0.0),
        ("no number", "anything 5", 0.0),
    ],
)
def test_numeric_match(reference, answer, expected):
    assert metrics.numeric_match(reference, answer) == expected


def test_unknown_metric_names_the_registered_ones():
    with pytest.raises(KeyError, match="numeric_match"):
        metrics.get("bleu")
