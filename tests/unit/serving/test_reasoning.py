"""Reasoning models: the thinking switch read from the chat template, sent turned off in
every request the pipeline makes (evaluation, load test, demo traffic) unless
``serving.thinking``, and the family's reasoning parser on vLLM's command line.

The requests go to a recording OpenAI server on 127.0.0.1 through the real clients
(lm-evaluation-harness, GuideLLM, the openai client); the prompt they ask for is rendered
with the tiny Qwen3's own tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_release import registry
from llm_release.config import LoadProfile, ServingConfig
from llm_release.evaluation.evaluate import run_evaluation
from llm_release.load.loadtest import backend_arg, run_load_test
from llm_release.load.traffic import Traffic
from llm_release.serving import reasoning
from llm_release.serving.serve import vllm_args
from tests.recording_openai import RecordingOpenAI
from tests.tiny_qwen3 import NO_THINK_SUFFIX, THINK_SUFFIX, build_tiny_qwen3

ROOT = Path(__file__).resolve().parents[3]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return build_tiny_qwen3(tmp_path_factory.mktemp("models") / "tiny-qwen3", tokenizer_dir)


@pytest.fixture()
def eval_sets(tmp_path, monkeypatch) -> str:
    """A copy of the shipped manufacturing_kb, not critical (what is asked here is what the
    requests carry, not whether the random model would pass its floors)."""
    import shutil

    from llm_release import paths

    sets = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), sets)
    task = sets / "manufacturing_kb" / "task.yaml"
    text = task.read_text()
    assert "critical: true" in text
    task.write_text(text.replace("critical: true", "critical: false"))
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(sets))
    return "manufacturing_kb"


def rendered(model_dir: Path, messages: list[dict], kwargs: dict) -> str:
    """The prompt the server builds: the model's tokenizer applies its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )


def folder(tmp_path: Path, model_type: str, template: str | None, as_list=False) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    if template is not None:
        value = [{"name": "default", "template": template}] if as_list else template
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": value}))
    return tmp_path


# -- detection -----------------------------------------------------------------------------


def test_the_tiny_qwen3_has_the_switch_and_the_qwen3_parser(qwen3_dir):
    found = reasoning.detect(qwen3_dir)
    assert (found.switch, found.parser, found.model_type) == ("enable_thinking", "qwen3", "qwen3")
    assert found.request_body(False) == OFF
    assert found.request_body(True) == {"chat_template_kwargs": {"enable_thinking": True}}
    # transformers 5 saves the template beside the tokenizer, where vLLM reads it too
    assert (qwen3_dir / "chat_template.jinja").exists()


def test_a_model_without_a_switch_gets_no_kwargs_and_no_parser(tiny_model_dir, tmp_path):
    found = reasoning.detect(tiny_model_dir)  # SmolLM2's ChatML template
    assert found == reasoning.Reasoning(model_type="llama")
    assert reasoning.request_body(tiny_model_dir, False) == {}
    # Qwen3-Instruct-2507 shares qwen3_moe with the thinking models but never thinks: a
    # parser there would read its answers as reasoning.
    chatml = (tiny_model_dir / "chat_template.jinja").read_text()
    assert reasoning.detect(folder(tmp_path / "m", "qwen3_moe", chatml)).parser is None
    assert reasoning.detect(folder(tmp_path / "none", "qwen3", None)) == reasoning.Reasoning(
        model_type="qwen3"
    )


def test_other_switches_and_template_places(tmp_path):
    # DeepSeek-V3.1 style: a named template in tokenizer_config.json reading ``thinking``
    deepseek = "{% if thinking %}<think>{% else %}</think>{% endif %}{{ messages[0].content }}"
    found = reasoning.detect(folder(tmp_path / "d", "deepseek_v3", deepseek, as_list=True))
    assert (found.switch, found.parser) == ("thinking", "deepseek_v3")
    # Qwen3.5: the same switch, the qwen3 parser
    qwen35 = "{%- if enable_thinking is defined and enable_thinking is false %}x{% endif %}"
    assert reasoning.detect(folder(tmp_path / "q", "qwen3_5_moe", qwen35)).parser == "qwen3"
    # a template with transformers' own {% generation %} tag still shows its switch
    tagged = "{% generation %}{{ m }}{% endgeneration %}{% if enable_thinking %}{% endif %}"
    assert reasoning.thinking_switch(tagged) == "enable_thinking"
    # a name only assigned inside the template is not a switch the request can set
    assert reasoning.thinking_switch("{% set thinking = true %}{{ thinking }}") is None
    assert reasoning.thinking_switch("{{ messages }} no switch") is None


def test_a_broken_or_huge_metadata_file_is_no_switch(tmp_path, monkeypatch):
    broken = folder(tmp_path / "b", "qwen3", None)
    (broken / "tokenizer_config.json").write_text("{not json")
    assert reasoning.detect(broken).switch is None
    big = folder(tmp_path / "big", "qwen3", "{% if enable_thinking %}{% endif %}")
    monkeypatch.setattr(reasoning, "MAX_METADATA_BYTES", 10)
    assert reasoning.detect(big).switch is None


def test_the_rendered_prompt_has_the_no_think_form(qwen3_dir):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    off = rendered(qwen3_dir, messages, reasoning.detect(qwen3_dir).chat_template_kwargs(False))
    on = rendered(qwen3_dir, messages, reasoning.detect(qwen3_dir).chat_template_kwargs(True))
    default = rendered(qwen3_dir, messages, {})
    assert off.endswith(NO_THINK_SUFFIX)
    assert on.endswith(THINK_SUFFIX) and "</think>" not in on
    assert default == on  # Qwen3 thinks unless told not to


# -- serving: the reasoning parser --------------------------------------------------------


def test_vllm_gets_the_familys_reasoning_parser(qwen3_dir, tiny_model_dir):
    serving = ServingConfig(max_num_seqs=4)
    args = vllm_args(qwen3_dir, "127.0.0.1", 8000, ["tiny"], serving, cuda=False)
    assert args[args.index("--reasoning-parser") + 1] == "qwen3"
    assert args.count("--reasoning-parser") == 1
    plain = vllm_args(tiny_model_dir, "127.0.0.1", 8000, ["tiny"], serving, cuda=False)
    assert "--reasoning-parser" not in plain
    # the operator's own parser (allow-listed extra_args) is the only one on the line
    own = serving.model_copy(update={"extra_args": ["--reasoning-parser", "deepseek_r1"]})
    args = vllm_args(qwen3_dir, "127.0.0.1", 8000, ["tiny"], own, cuda=False)
    assert args.count("--reasoning-parser") == 1
    assert args[args.index("--reasoning-parser") + 1] == "deepseek_r1"


def test_every_parser_name_is_one_the_serving_vllm_registers():
    """The names in PARSERS against vLLM's own registry, read from the serving runtime's
    source (vllm/reasoning/__init__.py names each parser it registers)."""
    import glob

    found = glob.glob(str(ROOT / ".venv-vllm/lib/python3*/site-packages/vllm/reasoning"))
    assert found, "the serving virtualenv .venv-vllm has no vllm/reasoning (run make setup)"
    source = (Path(found[0]) / "__init__.py").read_text()
    for name in set(reasoning.PARSERS.values()):
        assert f'"{name}"' in source, f"vLLM registers no reasoning parser {name!r}"


def test_the_thinking_setting_is_off_by_default_and_typed():
    assert ServingConfig().thinking is False
    assert ServingConfig(thinking=True).thinking is True
    with pytest.raises(ValueError):
        ServingConfig(thinking="sometimes")


# -- requests: evaluation, load test, demo traffic ----------------------------------------


def test_the_evaluation_sends_the_switch_turned_off(qwen3_dir, tmp_path, eval_sets):
    body = reasoning.request_body(qwen3_dir, ServingConfig().thinking)
    with RecordingOpenAI() as server:
        results = run_evaluation(
            server.base_url,
            "tiny-qwen3",
            [eval_sets],
            tmp_path / "eval",
            num_concurrent=1,
            limit=2,
            bootstrap_iters=10,
            request_body=body,
        )
        bodies = server.bodies()
    assert len(bodies) == 2
    for sent in bodies:
        assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        assert sent["max_tokens"] == results[0].decoding["max_gen_toks"]  # decoding intact
        assert rendered(qwen3_dir, sent["messages"], sent["chat_template_kwargs"]).endswith(
            NO_THINK_SUFFIX
        )
    assert results[0].decoding["chat_template_kwargs"] == {"enable_thinking": False}


def test_the_eval_tasks_generation_kwargs_carry_the_body_and_keep_the_decoding(eval_sets):
    from llm_release.evaluation.evalsets import load_eval_set
    from llm_release.evaluation.evaluate import load_decoding, task_config

    eval_set, decoding = load_eval_set(eval_sets), load_decoding()
    plain = task_config(eval_set, decoding)["generation_kwargs"]
    assert "chat_template_kwargs" not in plain
    assert task_config(eval_set, decoding, {})["generation_kwargs"] == plain
    hostile = OFF | {"max_gen_toks": 4096, "temperature": 1.5}
    sent = task_config(eval_set, decoding, hostile)["generation_kwargs"]
    assert sent == plain | OFF  # the fixed decoding wins over the body


def test_the_load_test_sends_the_switch_turned_off(qwen3_dir, tmp_path):
    body = reasoning.request_body(qwen3_dir, False)
    profile = LoadProfile(
        concurrencies=[1], requests_per_level=2, prompt_tokens=16, output_tokens=4
    )
    with RecordingOpenAI() as server:
        result = run_load_test(
            server.base_url, "tiny-qwen3", qwen3_dir, profile, tmp_path / "load", request_body=body
        )
        bodies = server.bodies()
    assert result.levels[0].requests >= 1
    assert bodies and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)
    assert all(b["stream"] is True for b in bodies)  # GuideLLM's own fields are intact
    assert rendered(qwen3_dir, bodies[0]["messages"], bodies[0]["chat_template_kwargs"]).endswith(
        NO_THINK_SUFFIX
    )


def test_the_backend_argument_is_unchanged_without_a_switch():
    assert (
        backend_arg("http://127.0.0.1:1", "m")
        == "kind=openai_http,target=http://127.0.0.1:1,model=m"
    )
    assert json.loads(backend_arg("http://127.0.0.1:1", "m", OFF))["extras"] == {"body": OFF}


def test_demo_traffic_sends_the_switch_turned_off(qwen3_dir):
    with RecordingOpenAI() as server:
        report = Traffic(
            server.base_url,
            "tiny-qwen3",
            rate_rps=50,
            duration_s=30,
            concurrency=1,
            max_requests=3,
            request_body=reasoning.request_body(qwen3_dir, False),
        ).run()
        bodies = server.bodies()
    assert report.succeeded == 3 and len(bodies) == 3
    for sent in bodies:
        assert sent["chat_template_kwargs"] == {"enable_thinking": False}
        assert rendered(qwen3_dir, sent["messages"], sent["chat_template_kwargs"]).endswith(
            NO_THINK_SUFFIX
        )


def test_traffic_refuses_a_request_body_that_is_not_a_dict():
    from llm_release.errors import TrafficError

    with pytest.raises(TrafficError, match="request_body must be a dict"):
        Traffic("http://127.0.0.1:1", "m", rate_rps=1, duration_s=1, request_body=["x"])


def release(model_dir: Path, thinking: bool) -> registry.Release:
    return registry.Release(
        release_id="r",
        candidate="c",
        scheme="FP8_DYNAMIC",
        repo_id="o/m",
        commit="0" * 40,
        model_dir=str(model_dir),
        public_name="m",
        port=20001,
        log_path="/dev/null",
        serving=ServingConfig(thinking=thinking),
    )


@pytest.fixture()
def own_models(monkeypatch, qwen3_dir, tiny_model_dir):
    """The test models' folders stand for the project's model folders (a record's
    model_dir is read only there)."""
    from llm_release import paths

    monkeypatch.setattr(paths, "model_roots", lambda: (qwen3_dir.parent, tiny_model_dir.parent))


def test_the_routers_traffic_carries_the_switch_of_what_it_serves(
    qwen3_dir, tiny_model_dir, own_models
):
    # a Qwen3 canary beside a stable without a switch: the switch goes out, off
    both = [release(tiny_model_dir, False), release(qwen3_dir, False)]
    assert reasoning.releases_request_body(both) == OFF
    assert reasoning.releases_request_body([None, release(qwen3_dir, True)]) == {
        "chat_template_kwargs": {"enable_thinking": True}
    }
    assert reasoning.releases_request_body([release(tiny_model_dir, False), None]) == {}


def test_a_recorded_folder_outside_the_model_folders_is_not_read(qwen3_dir, monkeypatch, tmp_path):
    from llm_release import paths

    monkeypatch.setattr(paths, "model_roots", lambda: (tmp_path / "models",))
    # the same Qwen3 folder, named by a record but not one of the project's: never read
    assert reasoning.releases_request_body([None, release(qwen3_dir, False)]) == {}


def test_llm_release_traffic_to_the_router_carries_the_switch(
    qwen3_dir, home, capsys, own_models, monkeypatch
):
    from llm_release.canary.router import Router
    from llm_release.cli import main

    # The recording server stands in for HAProxy on the router's port; that only HAProxy
    # gets the key there is tests/unit/canary/test_router_port.py's.
    monkeypatch.setattr(Router, "check_port", lambda self: None)
    with RecordingOpenAI() as server:
        port = int(server.base_url.rsplit(":", 1)[1])
        # the router's port, as the registry records it: the recording server stands in
        registry.save(registry.RegistryState(router_port=port, stable=release(qwen3_dir, False)))
        code = main(["traffic", "--rate", "20", "--duration", "0.5", "--concurrency", "1"])
        bodies = server.bodies()
    assert code == 0, capsys.readouterr()
    assert bodies and all(b["chat_template_kwargs"] == {"enable_thinking": False} for b in bodies)
    assert {b["model"] for b in bodies} == {"m"}  # the stable's public name
