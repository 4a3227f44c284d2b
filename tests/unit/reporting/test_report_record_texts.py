"""Names read back from the record reach no report raw (issue 36, found by a review): an
eval result names an eval set and metrics as the evaluation writes them, and a table
header built from them is a cell like any other."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_release.reporting.report import _table
from llm_release.results import EvalResult, MetricScore

SCORE = MetricScore(value=0.9, ci_low=0.8, ci_high=1.0)


@pytest.mark.parametrize(
    "eval_set", ["kb | <script>", "../etc/passwd", "x\x1b[2J", "KB", "", "a" * 101]
)
def test_an_eval_result_names_only_an_eval_set(eval_set):
    with pytest.raises(ValidationError, match="eval_set"):
        EvalResult(eval_set=eval_set, num_items=1, metrics={"numeric_match": SCORE})


@pytest.mark.parametrize("metric", ["acc | x", "x\n## forged", "Numeric", "a-b"])
def test_an_eval_result_names_only_metrics(metric):
    with pytest.raises(ValidationError, match="is not a metric's name"):
        EvalResult(eval_set="manufacturing_kb", num_items=1, metrics={metric: SCORE})


def test_real_names_pass_and_table_headers_are_cells():
    result = EvalResult(
        eval_set="manufacturing_kb", num_items=80, metrics={"numbers_with_units": SCORE}
    )
    assert result.eval_set == "manufacturing_kb"
    lines = _table(["a|b", "c\x1b[2Jd", "e\nf"], [[1, 2, 3]])
    header = lines[0]
    assert "\x1b" not in header and header.count("|") == 4 and "\\x1b" in header
