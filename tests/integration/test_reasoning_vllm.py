"""A reasoning model on a real vLLM server: the tiny Qwen3 is served with the qwen3
reasoning parser, the prompt vLLM builds from the pipeline's request has the no-think
form, and the answer comes back as content; without the switch the same server reads the
answer as reasoning (what a Qwen3 eval scored before: nothing)."""

from __future__ import annotations

import pytest
import requests

from llm_release import server_key
from llm_release.config import ServingConfig
from llm_release.serving import reasoning
from llm_release.serving.serve import VllmServer
from tests.tiny_qwen3 import NO_THINK_SUFFIX, build_tiny_qwen3

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_qwen3_is_served_with_its_parser_and_answers_with_thinking_off(tmp_path, tokenizer_dir):
    model = build_tiny_qwen3(tmp_path / "tiny-qwen3", tokenizer_dir)
    serving = ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=2)
    body = reasoning.request_body(model, serving.thinking)
    assert body == {"chat_template_kwargs": {"enable_thinking": False}}
    messages = [{"role": "user", "content": "What is the torque limit of press PL-3?"}]
    log = tmp_path / "vllm.log"
    with VllmServer(model, ["tiny-qwen3"], serving, log) as server:
        url = server.base_url
        tokens = requests.post(
            f"{url}/tokenize",
            json={"model": "tiny-qwen3", "messages": messages, "add_generation_prompt": True}
            | body,
            headers=server_key.headers(),
            timeout=60,
        ).json()["tokens"]
        prompt = requests.post(
            f"{url}/detokenize",
            json={"model": "tiny-qwen3", "tokens": tokens},
            headers=server_key.headers(),
            timeout=60,
        ).json()["prompt"]

        def ask(extra: dict) -> dict:
            answer = requests.post(
                f"{url}/v1/chat/completions",
                json={
                    "model": "tiny-qwen3",
                    "messages": messages,
                    "max_tokens": 6,
                    "temperature": 0,
                    "ignore_eos": True,  # random weights may end at once
                }
                | extra,
                headers=server_key.headers(),
                timeout=120,
            )
            assert answer.status_code == 200, answer.text
            return answer.json()["choices"][0]["message"]

        off = ask(body)
        default = ask({})
    command = log.read_text().splitlines()[0]
    assert "--reasoning-parser qwen3" in command
    assert prompt.endswith(NO_THINK_SUFFIX)
    assert off["content"] and not off.get("reasoning")
    # without the switch the model is thinking: its output (no </think>) is all reasoning
    assert default["reasoning"] and not default.get("content")
