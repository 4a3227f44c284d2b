import pytest

from llm_release.evaluation import metrics

DOC = {
    "passage": "Tighten the spindle bolts to 85 N·m. Check every 500 hours.",
    "question": "What is the spindle bolt torque for the lathe L-200?",
    "passage_id": "KB-1003",
    "answer": "85 N·m",
}


@pytest.mark.parametrize(
    ("answer", "numeric", "with_units"),
    [
        ("Tighten to 85 N·m.", 1.0, 1.0),
        ("Tighten to 58 N·m.", 0.0, 0.0),
        ("85", 1.0, 0.0),  # number without its unit
        ("85 N·m, or 90 N·m when hot", 1.0, 0.0),  # 90 is invented
        ("85 N·m; check after 500 hours", 1.0, 1.0),  # 500 is in the passage
        ("200 L-200 85 N·m", 1.0, 1.0),  # the machine name's number is in the question
        ("", 0.0, 0.0),
    ],
)
def test_numbers_and_units(answer, numeric, with_units):
    assert metrics.numeric_match(DOC, answer) == numeric
    assert metrics.numbers_with_units(DOC, answer) == with_units


def test_decimal_comma_and_percent():
    doc = {"passage": "Keep it at 2,5 bar and 9 %.", "answer": "2.5 bar"}
    assert metrics.numbers_with_units(doc, "2,5 bar") == 1.0
    assert metrics.numbers_with_units({"passage": "9 %", "answer": "9 %"}, "It is 9%.") == 1.0


def test_cites_source():
    assert metrics.cites_source(DOC, "85 N·m [KB-1003]") == 1.0
    assert metrics.cites_source(DOC, "85 N·m [KB-1004]") == 0.0


def test_refusal_requires_saying_so_and_inventing_nothing():
    doc = {"passage": "Set the air pressure to 6 bar.", "question": "What is the torque?"}
    assert metrics.refusal(doc, "The passage does not state the torque.") == 1.0
    assert metrics.refusal(doc, "The torque is 40 N·m.") == 0.0
    assert metrics.refusal(doc, "Not stated; maybe 40 N·m.") == 0.0


def test_exact_contains_regex():
    doc = {"answer": "85 N·m", "answer_regex": r"8[05]\s*N"}
    assert metrics.exact_match(doc, " 85 n·m ") == 1.0
    assert metrics.contains(doc, "use 85 N·m here") == 1.0
    assert metrics.regex_match(doc, "80 N·m") == 1.0 and metrics.regex_match(doc, "70 N") == 0.0


def test_every_metric_declares_its_direction():
    assert all(isinstance(m.higher_is_better, bool) for m in metrics.REGISTRY.values())


def test_unknown_metric_names_the_registered_ones():
    with pytest.raises(KeyError, match="numeric_match"):
        metrics.get("bleu")


@pytest.mark.parametrize(
    "answer",
    [
        "The passage does not provide the exact value for the interval.",
        "The passage doesn't specify it.",
        "That value is not listed in the passage.",
    ],
)
def test_refusal_phrasings(answer):
    assert metrics.refusal({"passage": "Set the air pressure to 6 bar."}, answer) == 1.0


def test_a_catastrophic_answer_regex_stops_with_a_one_line_fix():
    import time

    from llm_release.errors import EvalError

    # Alternation under repetition: exponential backtracking in re and in regex alike
    # (regex's own safeguards defuse the textbook "(a+)+$").
    doc = {"id": "torque-7", "answer": "x", "answer_regex": "(a|aa)+$"}
    started = time.monotonic()
    with pytest.raises(EvalError, match=r"torque-7: answer_regex '\(a\|aa\)\+\$' took over 1 s"):
        metrics.regex_match(doc, "a" * 60 + "!")
    assert time.monotonic() - started < 10


def test_an_answer_regex_that_does_not_compile_names_the_item():
    from llm_release.errors import EvalError

    with pytest.raises(EvalError, match="torque-8: answer_regex '\\(' is not a regex"):
        metrics.regex_match({"id": "torque-8", "answer_regex": "("}, "anything")
