"""The serving-flag allow-list: what a run form may pass to vLLM, in every spelling."""

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from llm_release.config import ReleaseConfig, ServingConfig
from llm_release.errors import ConfigError
from llm_release.serving.serve import build_command
from llm_release.serving.serving_flags import ALLOWED, OPERATOR_FLAGS_ENV, TYPED, parse

# Flags of vLLM 0.32 that run code, read files, listen elsewhere or swap the model (issue
# 24 and the old deny-list), each with a value an attacker would give it.
HOSTILE = [
    ["--scheduler-cls", "evil.module.Scheduler"],
    ["--kv-transfer-config", '{"kv_connector":"X","kv_connector_module_path":"evil.mod"}'],
    ["--kv-events-config", '{"enable_kv_cache_events":true,"endpoint":"tcp://*:5557"}'],
    ["--otlp-traces-endpoint", "http://attacker.example:4317"],
    ["--log-config-file", "/etc/passwd"],
    ["--hf-config-path", "/etc"],
    ["--generation-config", "/tmp/elsewhere"],
    ["--hf-overrides.architectures", '["Evil"]'],
    ["--hf-overrides", '{"x": 1}'],
    ["--speculative-config.model", "/other/model"],
    ["-O", "3"],
    ["-O3"],
    ["-O", '{"pass_config": {"custom": "evil.module.Pass"}}'],
    ["-O.mode=3"],
    ["-tp", "2"],
    ["--host", "0.0.0.0"],
    ["--port", "80"],
    ["--uds", "/tmp/x.sock"],
    ["--trust-remote-code"],
    ["--trust_remote_code"],
    ["--trust-remote"],
    ["--TRUST-REMOTE-CODE"],
    ["--chat-template", "{{ evil }}"],
    ["--allowed-local-media-path", "/"],
    ["--api-key", "x"],
    ["--model", "/other"],
    ["--tokenizer", "/other"],
    ["--served-model-name", "gpt-4"],
    ["--download-dir=/tmp"],
    ["--config", "/tmp/args.yaml"],
    ["--worker-cls", "evil.Worker"],
    ["--logits-processors", "evil.Proc"],
    ["--middleware", "evil.mw"],
    ["--tool-parser-plugin", "/tmp/evil.py"],
    ["--reasoning-parser-plugin", "/tmp/evil.py"],
    ["--load-format", "dummy"],
    ["--enable-lora"],
    ["--seed", "1", "--tokenizer", "x"],  # the second flag is the hostile one
]


@pytest.mark.parametrize("args", HOSTILE, ids=lambda a: " ".join(a)[:40])
def test_flags_outside_the_list_are_refused_in_one_line_naming_the_flag_and_the_list(args):
    with pytest.raises(ValidationError) as info:
        ServingConfig(extra_args=args)
    message = str(info.value.errors()[0]["msg"])
    assert len(message.splitlines()) == 1
    assert "serving.extra_args" in message and "allowed: --attention-backend" in message
    flag = next(a for a in args if a.startswith("-") and a.split("=")[0] not in ALLOWED)
    assert flag.split("=")[0][:40] in message
    with pytest.raises(ValidationError, match=r"candidates\[x\]\.extra_serving_args"):
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "a/b"},
                "candidates": [{"name": "x", "scheme": "FP8_DYNAMIC", "extra_serving_args": args}],
            }
        )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--max_num_batched_tokens=64"], "write --max-num-batched-tokens"),
        (["--Enforce-Eager"], "write --enforce-eager"),
        (["--max-num-seqs", "4"], "set by serving.max_num_seqs"),
        (["--max-model-len=999999"], "set by serving.max_model_len"),
        (["--dtype", "float16"], "set by serving.dtype"),
        (["--gpu-memory-utilization", "0.99"], "set by serving.gpu_memory_utilization"),
        (["--no-enable-prefix-caching"], "set by serving.enable_prefix_caching"),
        (['--speculative-config={"model": "/etc"}'], "set by serving.speculation"),
        (["--speculative-config", '{"method": "ngram"}'], "set by serving.speculation"),
        (["--max-num-batched-tokens"], "needs a value"),
        (["--max-num-batched-tokens", "--trust-remote-code"], "must be an integer"),
        (["--max-num-batched-tokens", "0"], "must be an integer from 1"),
        (["--max-num-batched-tokens", "1e9"], "must be an integer"),
        (["--max-num-batched-tokens", " 64"], "must be an integer"),
        (["--max-num-batched-tokens=99999999999"], "must be an integer"),
        (["--enforce-eager=false"], "takes no value"),
        (["--kv-cache-dtype", "int4"], "one of auto, fp8"),
        (["--block-size", "7"], "one of"),
        (["--seed", "-1"], "must be an integer"),
        (["--cpu-offload-gb", "nan"], "must be a number"),
        (["--cpu-offload-gb", "inf"], "must be a number"),
        (["--cpu-offload-gb", "99999"], "must be a number from 0 to 4096"),
        (["--quantization", "../../evil"], "quantization method name"),
        (["--reasoning-parser", "evil.module"], "reasoning parser name"),
        (["--attention-backend", "evil.Backend"], "backend name"),
        (["--tensor-parallel-size", "65"], "from 1 to 64"),
        (["64"], "a value with no flag"),
        (["@/etc/args"], "a value with no flag"),
        (["--"], "not a vLLM flag"),
        (["-"], "not a vLLM flag"),
        (["--max-num-batched-tokens-x", "5"], "not a vLLM flag"),
    ],
)
def test_spellings_values_and_typed_settings_are_checked(args, says):
    with pytest.raises(ValidationError) as info:
        ServingConfig(extra_args=args)
    message = str(info.value.errors()[0]["msg"])
    assert says in message and len(message.splitlines()) == 1, message


def test_the_tuning_flags_a_release_sets_pass_and_the_planner_reads_them():
    from llm_release.sizing import request_for_serving

    args = [
        "--max-num-batched-tokens=1024",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--tensor-parallel-size",
        "2",
        "--block-size",
        "32",
        "--enable-chunked-prefill",
        "--enforce-eager",
        "--seed",
        "7",
        "--cpu-offload-gb",
        "2.5",
        "--quantization",
        "compressed-tensors",
        "--gdn-prefill-backend",
        "triton",
        "--language-model-only",
        "--attention-backend",
        "FLASH_ATTN",
        "--reasoning-parser",
        "qwen3",
        "--pipeline-parallel-size=1",
        "--data-parallel-size",
        "1",
        "--enable-expert-parallel",
        "--kv-cache-memory-bytes",
        "4294967296",
    ]
    serving = ServingConfig(extra_args=args, dtype="bfloat16")
    assert serving.extra_args == args
    request = request_for_serving(serving, device="gpu")
    assert (request.max_num_batched_tokens, request.kv_cache_dtype) == (1024, "fp8")
    assert request.gpu_counts == [2]
    # A candidate's own flags join the release's, under the same list.
    ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "a/b"},
            "serving": {"extra_args": ["--max-num-batched-tokens", "512"]},
            "candidates": [
                {"name": "x", "scheme": "FP8_DYNAMIC", "extra_serving_args": ["--block-size=64"]}
            ],
        }
    )


def test_a_candidates_flag_may_not_contradict_a_typed_serving_field():
    with pytest.raises(ValidationError, match="serving.tensor_parallel_size sets it too"):
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "a/b"},
                "serving": {"tensor_parallel_size": 2, "gpus": 2},
                "candidates": [
                    {
                        "name": "x",
                        "scheme": "FP8_DYNAMIC",
                        "extra_serving_args": ["--tensor-parallel-size", "4"],
                    }
                ],
            }
        )


def test_the_command_both_backends_build_checks_the_list_again():
    """A setting changed after validation (model_copy skips validators) is still refused
    where vLLM's command is built, for the process and the docker backend alike."""
    from llm_release.serving.backends.docker import HostSettings, container_spec
    from llm_release.serving.serve import Owner

    bad = ServingConfig().model_copy(update={"extra_args": ["--scheduler-cls", "evil.S"]})
    with pytest.raises(ConfigError, match="--scheduler-cls"):
        build_command(Path("/py"), Path("/m"), 9000, ["m"], bad, cuda=False)
    with pytest.raises(ConfigError, match="--scheduler-cls"):
        container_spec(
            image="img:x",
            model_dir=Path("/m"),
            served_names=["m"],
            serving=bad.model_copy(update={"backend": "docker"}),
            port=40000,
            owner=Owner(),
            gpu_ids=None,
            gpu_host=False,
            home=Path("/tmp"),
            host=HostSettings(),
        )


def test_the_operator_may_add_flags_and_a_run_may_not(monkeypatch):
    args = ["--max-num-partial-prefills", "2", "--no-such-vllm-flag"]
    with pytest.raises(ValidationError, match="--max-num-partial-prefills"):
        ServingConfig(extra_args=args)
    monkeypatch.setenv(OPERATOR_FLAGS_ENV, "--max-num-partial-prefills, --no-such-vllm-flag")
    assert ServingConfig(extra_args=args).extra_args == args
    cmd = build_command(
        Path("/py"), Path("/m"), 9000, ["m"], ServingConfig(extra_args=args), cuda=False
    )
    assert cmd[-3:] == args
    # Still only exact names, and still no typed setting twice.
    with pytest.raises(ValidationError, match="not a vLLM flag"):
        ServingConfig(extra_args=["--no_such_vllm_flag"])
    monkeypatch.setenv(OPERATOR_FLAGS_ENV, "--max-model-len")
    with pytest.raises(ValidationError, match="set by serving.max_model_len"):
        ServingConfig(extra_args=["--max-model-len", "8"])
    monkeypatch.setenv(OPERATOR_FLAGS_ENV, "-O")
    with pytest.raises(ValidationError, match="not a long flag name"):
        ServingConfig(extra_args=[])


def test_the_setting_removed_from_the_run_form_says_where_it_went():
    with pytest.raises(ValidationError, match=OPERATOR_FLAGS_ENV):
        ServingConfig.model_validate({"allow_unsafe_serving_args": True})


# ------------------------------------------------------------------ property: spellings

# A value each allowed flag accepts (checked below), so that only the name decides.
SAMPLES = ["16", "1", "0", "fp8", "auto", "triton", "FLASH_ATTN", "qwen3", "2.5"]


def valid_value(name: str) -> str | None:
    flag = ALLOWED[name]
    if flag.check is None:
        return None
    return next(v for v in SAMPLES if flag.check(v))


def test_every_allowed_flag_has_a_sample_value():
    for name in ALLOWED:
        valid_value(name)  # StopIteration if none fits


NAMES = sorted(ALLOWED) + sorted(TYPED) + sorted({a[0].split("=")[0] for a in HOSTILE})


@st.composite
def spellings(draw) -> str:
    """A flag name as an attacker might spell it: mostly near an allowed one."""
    name = draw(st.sampled_from(NAMES))
    how = draw(
        st.sampled_from(
            ["as is", "case", "underscore", "dotted", "prefix", "suffix", "dashes", "space"]
        )
    )
    if how == "case":
        flips = draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name)))
        name = "".join(c.upper() if f else c for c, f in zip(name, flips, strict=True))
    elif how == "underscore":
        body = name.lstrip("-")
        cut = draw(st.integers(0, len(body)))
        name = name[: len(name) - len(body)] + body[:cut] + body[cut:].replace("-", "_")
    elif how == "dotted":
        name += "." + draw(st.from_regex(r"[a-z_]{1,12}", fullmatch=True))
    elif how == "prefix":
        name = name[: draw(st.integers(1, len(name)))]
    elif how == "suffix":
        name += draw(st.sampled_from(["-x", "s", "-cls", "_", "-", "\n", "\x00", " "]))
    elif how == "dashes":
        name = draw(st.sampled_from(["-", "---", ""])) + name.lstrip("-")
    elif how == "space":
        name = draw(st.sampled_from([" ", "\t"])) + name
    return name


@settings(max_examples=400, deadline=None)
@given(name=spellings(), inline=st.booleans())
def test_only_exact_allowed_names_pass_whatever_the_spelling(name, inline):
    exact = name in ALLOWED
    value = valid_value(name) if exact else "16"
    if value is None:
        args = [name]
    else:
        args = [f"{name}={value}"] if inline else [name, value]
    try:
        parse(args, "serving.extra_args")
        accepted = True
    except ValueError as exc:
        accepted = False
        assert len(str(exc).splitlines()) == 1
        assert str(exc).startswith("serving.extra_args: ")
    assert accepted == exact, (name, args)


@settings(max_examples=300, deadline=None)
@given(args=st.lists(st.one_of(st.sampled_from(NAMES), st.text(max_size=20)), max_size=5))
def test_any_argument_list_is_parsed_to_allowed_flags_or_refused_in_one_line(args):
    try:
        pairs = parse(args, "serving.extra_args")
    except ValueError as exc:
        assert len(str(exc).splitlines()) == 1
        return
    # What passed: exact allowed names, each value its flag's, nothing left over.
    assert all(flag in ALLOWED for flag, _ in pairs)
    for flag, value in pairs:
        check = ALLOWED[flag].check
        assert (value is None) == (check is None)
        assert value is None or (check(value) and not value.startswith("-"))


def test_the_list_and_its_messages_name_only_long_flags():
    assert all(re.fullmatch(r"--[a-z0-9][a-z0-9-]*", n) for n in [*ALLOWED, *TYPED])
    assert not set(ALLOWED) & set(TYPED)
