"""The published model card: model-index eval results, base model, scheme and lineage,
parsed back by huggingface_hub; deterministic; and the demo hub's path rule."""

import pytest
from huggingface_hub import ModelCard

from demo.hub_server import repo_path_error
from llm_release.hub.publish import Lineage, build_card
from llm_release.results import EvalResult, MetricScore

LINEAGE = Lineage(
    upstream_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
    upstream_commit="b" * 40,
    release_id="fp8-bbbbbbbb-20261202000000",
    candidate="fp8",
    scheme="FP8_DYNAMIC",
    run_id="20261202T000000Z-abcd",
    recipe={"scheme": "FP8_DYNAMIC", "ignore": ["lm_head"]},
    cache_key="k" * 64,
    files={"model.safetensors": "f" * 64, "config.json": "e" * 64},
)
EVALS = [
    EvalResult(
        eval_set="maintenance_qa",
        version=2,
        num_items=40,
        metrics={
            "exact_match": MetricScore(value=0.8125, ci_low=0.7, ci_high=0.9),
            "citation": MetricScore(value=0.5),
        },
    ),
    EvalResult(eval_set="safety", num_items=10, metrics={"refusal": MetricScore(value=1.0)}),
]


def parsed(card) -> ModelCard:
    return ModelCard(str(card))  # what the hub and a downloader read back


def test_every_eval_set_and_metric_is_a_model_index_result():
    card = parsed(build_card("acme/smol-fp8", LINEAGE, EVALS))
    results = {(r.dataset_name, r.metric_type): r for r in card.data.eval_results}
    assert set(results) == {
        ("maintenance_qa", "exact_match"),
        ("maintenance_qa", "citation"),
        ("safety", "refusal"),
    }
    assert results["maintenance_qa", "exact_match"].metric_value == 0.8125
    assert results["maintenance_qa", "exact_match"].dataset_revision == "2"
    assert results["safety", "refusal"].task_type == "text-generation"
    assert card.data.model_name == "smol-fp8"
    assert "| maintenance_qa | exact_match | 0.8125 | 0.7000 | 0.9000 | 40 |" in card.text


def test_base_model_scheme_and_lineage_are_in_the_metadata():
    data = parsed(build_card("acme/smol-fp8", LINEAGE, EVALS)).data.to_dict()
    assert data["base_model"] == LINEAGE.upstream_repo
    assert data["quantization"] == {"scheme": "FP8_DYNAMIC", "format": "compressed-tensors"}
    assert Lineage.model_validate(data["llm_release"]) == LINEAGE
    assert "fp8_dynamic" in data["tags"]


def test_the_card_is_the_same_for_the_same_release_and_has_no_results_without_evals():
    assert str(build_card("a/b", LINEAGE, EVALS)) == str(build_card("a/b", LINEAGE, EVALS))
    bare = parsed(build_card("a/b", LINEAGE, []))
    assert bare.data.eval_results is None and "model-index" not in str(bare)
    assert "(none recorded)" in bare.text


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../../x", "/abs", "C:/x", "a\\b", "a//b", "./a", "a/", "", ".git/config",
     "a\x00b", "x" * 1025, 7],
)  # fmt: skip
def test_the_hub_refuses_paths_outside_the_repo(path):
    assert repo_path_error(path)


@pytest.mark.parametrize(
    "path", ["README.md", "sub/dir/model.safetensors", "a..b", ".gitattributes"]
)
def test_the_hub_takes_plain_paths(path):
    assert repo_path_error(path) is None
