import inspect
import json
import types
import typing
from pathlib import Path

import annotated_types
import pytest
from pydantic import BaseModel, ValidationError

from flows.release import release
from llm_release.config import (
    AnalysisConfig,
    CandidateConfig,
    EvalConfig,
    Gates,
    LoadProfile,
    ReleaseConfig,
    ServingConfig,
)


def test_unknown_keys_are_rejected():
    with pytest.raises(ValidationError, match="max_model_lenn"):
        ServingConfig.model_validate({"max_model_lenn": 1024})


def test_repo_id_must_be_owner_slash_name():
    with pytest.raises(ValidationError, match="owner/name"):
        ReleaseConfig.model_validate({"source": {"repo_id": "just-a-name"}})


def test_candidate_names_unique_and_baseline_reserved():
    with pytest.raises(ValidationError, match="repeated"):
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "a/b"},
                "candidates": [
                    {"name": "x", "scheme": "FP8_DYNAMIC"},
                    {"name": "x", "scheme": "W4A16_AWQ"},
                ],
            }
        )
    with pytest.raises(ValidationError, match="reserved"):
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "a/b"},
                "candidates": [{"name": "baseline", "scheme": "FP8_DYNAMIC"}],
            }
        )


def test_unknown_scheme_lists_valid_ones():
    with pytest.raises(ValidationError) as info:
        CandidateConfig(name="x", scheme="INT3")
    assert "FP8_DYNAMIC" in str(info.value) and "W4A16_AWQ" in str(info.value)


def test_concurrencies_sorted_and_positive():
    assert LoadProfile(concurrencies=[4, 1, 4]).concurrencies == [1, 4]
    with pytest.raises(ValidationError):
        LoadProfile(concurrencies=[0])


def test_defaults_build_two_quantized_candidates():
    config = ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}})
    assert [c.scheme for c in config.candidates] == ["FP8_DYNAMIC", "W4A16_AWQ"]


def test_the_demo_config_is_valid_release_parameters():
    params = json.loads((Path(__file__).parents[2] / "configs" / "demo.json").read_text())
    # The flow takes one typed ReleaseConfig: the demo file is one, less its source.
    assert list(inspect.signature(release.fn).parameters) == ["config"]
    config = ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}, **params})
    assert config.gates.ttft_p95_slo_s == params["gates"]["ttft_p95_slo_s"]


@pytest.mark.parametrize(
    "args",
    [
        ["--host", "0.0.0.0"],
        ["--host=0.0.0.0"],
        ["--port", "80"],
        ["--trust-remote-code"],
        ["--trust_remote_code"],
        ["--trust-remote"],
        ["--model", "/other"],
        ["--seed", "1", "--TOKENIZER", "x"],
    ],
)
def test_serving_args_outside_the_allow_list_are_refused_and_no_parameter_lifts_it(args):
    # The list and its spellings: tests/unit/serving/test_serving_flags.py.
    with pytest.raises(ValidationError, match="not a vLLM flag a release may set") as info:
        ServingConfig(extra_args=args)
    assert len(str(info.value.errors()[0]["msg"]).splitlines()) == 1
    with pytest.raises(ValidationError, match="extra_serving_args"):
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "a/b"},
                "candidates": [{"name": "x", "scheme": "FP8_DYNAMIC", "extra_serving_args": args}],
            }
        )
    # The run form's old way around it is gone: it says where the choice went.
    with pytest.raises(ValidationError, match="LLM_RELEASE_ALLOW_SERVING_FLAGS"):
        ReleaseConfig.model_validate(
            {"source": {"repo_id": "a/b"}, "serving": {"allow_unsafe_serving_args": True}}
        )


def test_ordinary_serving_args_pass():
    args = ["--seed", "7", "--kv-cache-dtype", "fp8", "--max-num-batched-tokens=512"]
    assert ServingConfig(extra_args=args).extra_args == args


@pytest.mark.parametrize(
    ("serving", "variable"),
    [
        ({"backend": "docker", "ipc_host": True}, "LLM_RELEASE_DOCKER_IPC_HOST"),
        ({"backend": "docker", "shm_size_gib": 100000}, "LLM_RELEASE_DOCKER_SHM_GIB"),
        ({"image": "attacker.example/vllm:latest"}, "LLM_RELEASE_DOCKER_IMAGE"),
    ],
)
def test_host_options_in_a_run_form_are_refused_and_name_the_operator_setting(serving, variable):
    with pytest.raises(ValidationError) as info:
        ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}, "serving": serving})
    message = str(info.value.errors()[0]["msg"])
    assert variable in message and "operator" in message and len(message.splitlines()) == 1


def test_evaluation_fills_the_candidate_servers_batch_but_not_the_live_stables():
    evaluation = EvalConfig()
    assert evaluation.concurrency(ServingConfig(max_num_seqs=8)) == 8
    assert evaluation.concurrency(ServingConfig(max_num_seqs=256)) == 64  # lm-eval's connections
    assert evaluation.concurrency(None) == 4  # the live stable serves users meanwhile
    assert EvalConfig(num_concurrent=2).concurrency(ServingConfig(max_num_seqs=8)) == 2
    assert EvalConfig(num_concurrent=2).concurrency(None) == 2


def test_evaluation_on_a_gpu_asks_one_item_at_a_time_unless_the_run_says_otherwise():
    # a GPU's greedy answer changes with its batch (bench/batch_invariance.py)
    assert EvalConfig().concurrency(ServingConfig(max_num_seqs=256), gpu=True) == 1
    assert EvalConfig().concurrency(ServingConfig(max_num_seqs=256), gpu=False) == 64
    assert EvalConfig(num_concurrent=16).concurrency(ServingConfig(), gpu=True) == 16
    assert EvalConfig().concurrency(None, gpu=True) == 4  # the live stable serves users


def test_the_canary_is_held_to_the_error_ceiling_its_measurement_passed():
    config = ReleaseConfig.model_validate(
        {"source": {"repo_id": "org/m"}, "gates": {"max_error_rate": 0.002}}
    )
    assert config.rollout.analysis.error_ceiling() == 0.002
    explicit = ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "org/m"},
            "gates": {"max_error_rate": 0.002},
            "rollout": {"analysis": {"error_share_ceiling": 0.05}},
        }
    )
    assert explicit.rollout.analysis.error_ceiling() == 0.05
    assert AnalysisConfig().error_ceiling() == Gates().max_error_rate  # no release config


def test_served_names_follow_one_rule_with_a_bound():
    from llm_release.config import SourceConfig

    for bad in ("--host=0.0.0.0", "-x", "a b", "x" * 129, "a/b"):
        with pytest.raises(ValidationError, match="public_name"):
            ReleaseConfig(source=SourceConfig(repo_id="a/b"), public_name=bad)
    with pytest.raises(ValidationError, match="set public_name"):
        ReleaseConfig(source=SourceConfig(repo_id="a/_b"))
    assert ReleaseConfig(source=SourceConfig(repo_id="a/_b"), public_name="b").served_name() == "b"
    assert ReleaseConfig(source=SourceConfig(repo_id="a/b.c-d_e")).served_name() == "b.c-d_e"
    with pytest.raises(ValidationError, match="at most 64 characters"):
        CandidateConfig(name="c" * 65, scheme="FP8_DYNAMIC")


@pytest.mark.parametrize(
    ("section", "value", "field"),
    [
        ("serving", {"tensor_parallel_size": 10**9}, "tensor_parallel_size"),
        ("serving", {"gpus": 10**9}, "gpus"),
        ("serving", {"gpus": list(range(2000))}, "gpus"),
        ("serving", {"max_model_len": 10**15}, "max_model_len"),
        ("serving", {"startup_timeout_s": 1e300}, "startup_timeout_s"),
        ("evaluation", {"num_concurrent": 10**9}, "num_concurrent"),
        ("evaluation", {"eval_sets": ["s"] * 1000}, "eval_sets"),
        ("load", {"concurrencies": [10**9]}, "concurrencies"),
        ("load", {"concurrencies": list(range(1, 500))}, "concurrencies"),
        ("load", {"requests_per_level": 10**12}, "requests_per_level"),
        ("load", {"prompt_tokens": 10**15}, "prompt_tokens"),
        ("load", {"max_seconds_per_level": 1e15}, "max_seconds_per_level"),
        ("gates", {"ttft_p95_slo_s": 1e15}, "ttft_p95_slo_s"),
        ("review", {"timeout_s": 10**15}, "timeout_s"),
        ("rollout", {"approval_timeout_s": 10**15}, "approval_timeout_s"),
        ("tune", {"max_num_seqs": [10**9]}, "max_num_seqs"),
        ("tune", {"gpu_memory_utilization": [0.5] * 1000}, "gpu_memory_utilization"),
        ("serving", {"extra_args": ["--max-num-batched-tokens", "512"] * 500}, "extra_args"),
        ("serving", {"cpu_kvcache_space_gib": 10**12}, "cpu_kvcache_space_gib"),
        ("gates", {"itl_p95_slo_ms": 1e300}, "itl_p95_slo_ms"),
        ("rollout", {"steps": [10**12, 100]}, "steps"),
        ("rollout", {"analysis": {"queue_ceiling": 1e300}}, "queue_ceiling"),
        ("source", {"repo_id": "a/b", "revision": "r" * 100_000}, "revision"),
    ],
)
def test_run_form_numbers_and_lists_have_upper_bounds(section, value, field):
    """A run parameter past a bound is refused before any work (issue 36, low)."""
    data = {"source": {"repo_id": "acme/model"}, section: value}
    with pytest.raises(ValidationError) as caught:
        ReleaseConfig.model_validate(data)
    assert any(field in map(str, error["loc"]) for error in caught.value.errors())


def _unwrapped(annotation: object) -> tuple[object, list]:
    """The type under Annotated[...] and Optional[...], with the constraints found on the way."""
    meta: list = []
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *more = typing.get_args(annotation)
            meta += more
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) == 1:
                annotation = args[0]
                continue
        return annotation, meta


def _bounded(meta: list, kinds: tuple[type, ...]) -> bool:
    found = [*meta, *(inner for m in meta for inner in getattr(m, "metadata", []))]
    return any(isinstance(m, kinds) for m in found)


def _unbounded_fields(model: type[BaseModel], path: str, seen: set) -> list[str]:
    missing = []
    for name, field in model.model_fields.items():
        annotation, meta = _unwrapped(field.annotation)
        meta += field.metadata
        where = f"{path}.{name}"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.add(annotation)
                missing += _unbounded_fields(annotation, where, seen)
        elif annotation in (int, float):
            if not _bounded(meta, (annotated_types.Le, annotated_types.Lt)):
                missing.append(where)
        elif typing.get_origin(annotation) in (list, tuple, set, dict):
            if not _bounded(meta, (annotated_types.MaxLen,)):
                missing.append(f"{where}[]")
            for item in typing.get_args(annotation):
                item, item_meta = _unwrapped(item)
                if isinstance(item, type) and issubclass(item, BaseModel):
                    if item not in seen:
                        seen.add(item)
                        missing += _unbounded_fields(item, f"{where}[*]", seen)
                elif item in (int, float) and not _bounded(
                    item_meta, (annotated_types.Le, annotated_types.Lt)
                ):
                    missing.append(f"{where}[*]")
    return missing


def test_every_number_and_list_of_the_run_form_has_an_upper_bound():
    """docs/security.md says so of the run form: a field added without one fails here."""
    assert _unbounded_fields(ReleaseConfig, "", set()) == []


def test_three_thousand_candidates_are_refused():
    many = [{"name": f"c{i}", "scheme": "FP8_DYNAMIC"} for i in range(3000)]
    with pytest.raises(ValidationError, match="candidates"):
        ReleaseConfig.model_validate({"source": {"repo_id": "acme/model"}, "candidates": many})


def test_large_but_real_settings_still_pass():
    ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "acme/model", "revision": "f" * 40},
            "serving": {"tensor_parallel_size": 8, "gpus": [0, 1, 2, 3, 4, 5, 6, 7]},
            "load": {"concurrencies": [10, 50, 100, 1000], "prompt_tokens": 262_144},
            "evaluation": {"num_concurrent": 256},
            "review": {"timeout_s": 3 * 86_400},
        }
    )


def test_prompts_from_names_an_eval_set_and_shapes_no_synthetic_prompt():
    from llm_release.config import LoadProfile, SharedPrefix

    assert LoadProfile(prompts_from="manufacturing_kb").prompts_from == "manufacturing_kb"
    for bad in ("../etc", "Bad", "a" * 65, "-x"):
        with pytest.raises(ValidationError, match="prompts_from"):
            LoadProfile(prompts_from=bad)
    with pytest.raises(ValidationError, match="neither shared_prefix nor turns"):
        LoadProfile(prompts_from="kb", shared_prefix=SharedPrefix(tokens=64))
    with pytest.raises(ValidationError, match="neither shared_prefix nor turns"):
        LoadProfile(prompts_from="kb", turns=2)


def test_a_gpu_servers_typical_request_counts_a_shared_prefix_only_without_prefix_caching():
    load = {
        "prompt_tokens": 512,
        "output_tokens": 256,
        "shared_prefix": {"tokens": 1024, "share": 0.9, "distinct": 4},
    }
    shared = ReleaseConfig.model_validate({"source": {"repo_id": "a/b"}, "load": load})
    assert shared.serving.request_tokens == 768  # the prefix's blocks are held once
    copies = ReleaseConfig.model_validate(
        {"source": {"repo_id": "a/b"}, "load": load, "serving": {"enable_prefix_caching": False}}
    )
    assert copies.serving.request_tokens == 768 + 1024
