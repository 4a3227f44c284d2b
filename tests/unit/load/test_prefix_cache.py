"""vLLM's prefix-cache hit rate per load level (load/prefix_cache.py) from its counters as
vLLM's /metrics writes them, and GuideLLM's data argument for traffic sharing a prefix."""

import json

import pytest

from llm_release.config import LoadProfile, SharedPrefix
from llm_release.load import loadtest
from llm_release.load.prefix_cache import Reading, hit_rate, parse_counters

# As vLLM 0.32 writes them (prometheus_client counters, one series per engine).
PAGE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} 300.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 768.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny"} 0.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
"""


def test_the_counters_are_summed_over_engines():
    assert parse_counters(PAGE) == (1500.0, 768.0)
    assert parse_counters("# TYPE x counter\nx_total 3\n") is None  # not vLLM: no rate


def test_a_levels_rate_is_the_counters_growth_around_its_requests():
    readings = [
        Reading(0.0, 0.1, 0, 0),
        Reading(1.0, 1.1, 100, 0),  # level 1 starts at 1.2: its base is this reading
        Reading(2.0, 2.1, 600, 300),
        Reading(3.0, 3.1, 1100, 700),  # level 1 ends at 2.9: this closes it
        Reading(4.0, 4.1, 1100, 700),
    ]
    assert hit_rate(readings, 1.2, 2.9) == pytest.approx(700 / 1000)
    assert hit_rate(readings, 3.5, 3.9) is None  # nothing looked up: no rate, not 0
    assert hit_rate(readings, 3.5, 9.0) is None  # no reading after the window
    assert hit_rate(readings, -1.0, 2.0) is None  # none before it


def test_a_slow_answer_closes_no_level_that_ended_after_it_was_asked_for():
    # On a loaded machine a page asked for at 2.0 came at 3.0: its counters are of some
    # moment in between, before the level's last requests (it ends at 2.9) were counted.
    # Taken for the level's close it gave 0.47 where the level's own rate was 0.79.
    readings = [
        Reading(0.5, 0.6, 0, 0),
        Reading(2.0, 3.0, 1084, 512),
        Reading(3.2, 3.3, 3252, 2560),
    ]
    assert hit_rate(readings, 1.0, 2.9) == pytest.approx(2560 / 3252)
    # nor opens one that began before its answer came: the reading answered at 0.6 does
    assert hit_rate(readings, 2.5, 3.1) == pytest.approx(2560 / 3252)


def test_prompts_sharing_nothing_keep_guidellms_plain_synthetic_data():
    profile = LoadProfile(prompt_tokens=64, output_tokens=8)
    assert loadtest.data_arg(profile) == "kind=synthetic_text,prompt_tokens=64,output_tokens=8"


def test_a_shared_prefix_becomes_guidellms_prefix_buckets():
    shared = LoadProfile(
        prompt_tokens=64,
        output_tokens=8,
        shared_prefix=SharedPrefix(tokens=512, share=0.8, distinct=3),
    )
    data = json.loads(loadtest.data_arg(shared))
    assert data["kind"] == "synthetic_text" and data["prompt_tokens"] == 64
    assert data["prefix_buckets"] == [
        {"bucket_weight": 80, "prefix_count": 3, "prefix_tokens": 512},
        {"bucket_weight": 20, "prefix_count": 1, "prefix_tokens": 0},
    ]
    everyone = shared.model_copy(update={"shared_prefix": SharedPrefix(tokens=100)})
    assert json.loads(loadtest.data_arg(everyone))["prefix_buckets"] == [
        {"bucket_weight": 100, "prefix_count": 1, "prefix_tokens": 100}
    ]
    # GuideLLM's own model takes it (its --data parser reads JSON)
    from guidellm.schemas.data.deserializers.synthetic import SyntheticTextDataArgs

    parsed = SyntheticTextDataArgs.model_validate({k: v for k, v in data.items() if k != "kind"})
    assert [b.prefix_tokens for b in parsed.prefix_buckets] == [512, 0]


def test_conversations_become_guidellms_turns_beside_a_shared_prefix():
    from guidellm.schemas.data.deserializers.synthetic import SyntheticTextDataArgs

    chat = LoadProfile(prompt_tokens=64, output_tokens=8, turns=3)
    data = json.loads(loadtest.data_arg(chat))
    assert data == {"kind": "synthetic_text", "prompt_tokens": 64, "output_tokens": 8, "turns": 3}
    both = chat.model_copy(update={"shared_prefix": SharedPrefix(tokens=100)})
    data = json.loads(loadtest.data_arg(both))
    assert data["turns"] == 3 and data["prefix_buckets"][0]["prefix_tokens"] == 100
    parsed = SyntheticTextDataArgs.model_validate({k: v for k, v in data.items() if k != "kind"})
    assert parsed.turns == 3
    with pytest.raises(ValueError):
        LoadProfile(turns=0)
    with pytest.raises(ValueError):
        LoadProfile(turns=17)


def test_a_shared_prefix_is_bounded_on_the_run_form():
    with pytest.raises(ValueError):
        SharedPrefix(tokens=0)
    with pytest.raises(ValueError):
        SharedPrefix(tokens=10, share=1.5)
    with pytest.raises(ValueError):
        SharedPrefix(tokens=10, distinct=10_000)
