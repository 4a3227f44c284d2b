"""Reasoning models: the chat template's thinking switch and vLLM's reasoning parser.

Qwen3 and Qwen3.5 think by default: their chat template opens a ``<think>`` block unless
the request's chat-template kwargs say ``enable_thinking: false``, in which case it writes an
empty ``<think>\\n\\n</think>`` into the prompt and the model answers at once. A request
that does not say so spends its token budget (48 tokens for an eval answer) inside
``<think>``. So the pipeline reads the switch from the model's own chat template and sends
it with every request it makes (evaluation, load test, demo traffic), turned off unless
``serving.thinking`` asks for thinking, and serves the model with vLLM's reasoning parser
for its family, which moves any reasoning out of the answer's ``content``.

Detection reads files only (the chat template is hub metadata: parsed, never rendered).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import jinja2
from jinja2 import meta

from llm_release import paths

log = logging.getLogger(__name__)

# Template variables that switch a model's thinking on or off, in the order looked for:
# Qwen3 / Qwen3.5 / GLM-4.5 / SmolLM3 read ``enable_thinking``; DeepSeek-V3.1 and Granite
# 3.2 read ``thinking``. (gpt-oss's ``reasoning_effort`` has no "off" and is not one.)
SWITCHES = ("enable_thinking", "thinking")

# vLLM's reasoning parser (``--reasoning-parser``) by the model's ``model_type``; the names
# are those registered in vllm/reasoning/__init__.py of the serving runtime (0.32).
PARSERS = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "qwen3_next": "qwen3",
    "qwen3_5": "qwen3",
    "qwen3_5_moe": "qwen3",
    "qwen3_5_text": "qwen3",
    "qwen3_5_moe_text": "qwen3",
    "glm4_moe": "glm45",
    "deepseek_v3": "deepseek_v3",
    "granite": "granite",
}

MAX_METADATA_BYTES = 16 * 1024 * 1024  # tokenizer_config.json with every added token fits


@dataclass(frozen=True)
class Reasoning:
    """What a model folder says about thinking."""

    switch: str | None = None  # the template variable, e.g. "enable_thinking"
    parser: str | None = None  # vLLM's --reasoning-parser for the model's family
    model_type: str | None = None

    def chat_template_kwargs(self, thinking: bool) -> dict[str, bool]:
        """The kwargs for the chat template: the switch set as ``thinking`` says."""
        return {self.switch: thinking} if self.switch else {}

    def request_body(self, thinking: bool) -> dict:
        """Fields to add to every chat-completions request (vLLM's ``chat_template_kwargs``)."""
        kwargs = self.chat_template_kwargs(thinking)
        return {"chat_template_kwargs": kwargs} if kwargs else {}


def _read_json(path: Path) -> dict | None:
    try:
        if path.stat().st_size > MAX_METADATA_BYTES:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def chat_template(model_dir: Path) -> str | None:
    """The model's default chat template, from where transformers saves it
    (``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template``: a string,
    or a list of named templates whose ``default`` one is used)."""
    model_dir = Path(model_dir)
    jinja = model_dir / "chat_template.jinja"
    try:
        if jinja.is_file() and jinja.stat().st_size <= MAX_METADATA_BYTES:
            return jinja.read_text(encoding="utf-8", errors="replace")
    except OSError:
        pass
    config = _read_json(model_dir / "tokenizer_config.json") or {}
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {
            t.get("name"): t.get("template")
            for t in template
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def thinking_switch(template: str | None) -> str | None:
    """The variable in ``template`` that switches thinking, if it reads one of ``SWITCHES``."""
    if not template:
        return None
    env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols", "jinja2.ext.do"])
    try:
        names = meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        # A tag of transformers' own ({% generation %}) or a broken template: the names
        # are looked for as words (vLLM would refuse a really broken one on its own).
        names = set(re.findall(r"[A-Za-z_]\w*", template))
    return next((s for s in SWITCHES if s in names), None)


def model_type(model_dir: Path) -> str | None:
    config = _read_json(Path(model_dir) / "config.json") or {}
    kind = config.get("model_type")
    return kind if isinstance(kind, str) else None


def detect(model_dir: Path) -> Reasoning:
    """The thinking switch and reasoning parser of the model in ``model_dir``.

    A parser is chosen only for a model that can think: its template has a switch or writes
    ``<think>`` (Qwen3-Instruct-2507 shares ``qwen3_moe`` with the thinking models but never
    thinks, and a parser there would read its whole answer as reasoning)."""
    template = chat_template(model_dir)
    switch = thinking_switch(template)
    kind = model_type(model_dir)
    thinks = switch is not None or (template is not None and "<think>" in template)
    parser = PARSERS.get(kind or "") if thinks else None
    return Reasoning(switch=switch, parser=parser, model_type=kind)


def request_body(model_dir: Path, thinking: bool) -> dict:
    """The fields every chat request to a server of ``model_dir`` carries: its thinking
    switch set to ``thinking`` (``serving.thinking``); nothing for a model without one."""
    return detect(Path(model_dir)).request_body(thinking)


def parser_args(model_dir: Path, extra_args: list[str] = ()) -> list[str]:
    """``--reasoning-parser NAME`` for the model's family; nothing when the operator's
    ``extra_args`` name a parser already (one source per flag: vLLM keeps the last)."""
    if any(a.split("=", 1)[0] == "--reasoning-parser" for a in extra_args):
        return []
    parser = detect(model_dir).parser
    return ["--reasoning-parser", parser] if parser else []


def releases_request_body(releases: list) -> dict:
    """The request fields for a load balancer in front of ``releases`` (registry records:
    the stable and the canary, either may be None; the same requests reach both): every
    switch either reads, each set by its release's ``serving.thinking``; where both read
    one switch and disagree, the last one's (the canary's: the config being released) is
    sent. vLLM hands a template only the kwargs it reads, so a switch one model lacks
    changes nothing there."""
    kwargs: dict[str, bool] = {}
    for release in releases:
        # The record's folder is read only when it is one of the project's model folders.
        folder = paths.own_model_folder(release.model_dir) if release is not None else None
        if folder is not None:
            found = detect(folder)
            kwargs |= found.chat_template_kwargs(release.serving.thinking)
    return {"chat_template_kwargs": kwargs} if kwargs else {}
