"""An eval set's items (``data.jsonl``): bounded, each checked for an id, a reference answer
and well-formed tags; and one item's prompt rendered in the template sandbox."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2

from llm_release.evaluation import templates
from llm_release.evaluation.evalsets import EvalSet, load_eval_set
from llm_release.evaluation.set_files import MAX_NESTING, EvalSetError, read_text

# data.jsonl bounds: a business set is thousands of items of a few KB; one item is a prompt's
# passage and its answer.
MAX_DATA_BYTES = 64 * 1024 * 1024
MAX_ITEM_CHARS = 1024 * 1024


def _json_depth(line: str) -> int:
    """The deepest nesting of '[' / '{' in a JSON line, strings skipped (no parser)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in line:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load_items(eval_set: EvalSet) -> list[dict]:
    """The items, each checked for an id, a reference answer and well-formed tags."""
    items, seen = [], {}
    text = read_text(eval_set.data_path, MAX_DATA_BYTES)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > MAX_ITEM_CHARS:
            raise EvalSetError(
                eval_set.data_path,
                lineno,
                None,
                f"an item of {len(line)} characters; at most {MAX_ITEM_CHARS}",
            )
        if _json_depth(line) > MAX_NESTING:
            # json.loads recurses once a level: 50,000 '[' is a RecursionError, which took
            # 'eval-sets list' down for every set
            raise EvalSetError(
                eval_set.data_path, lineno, None, f"nested deeper than {MAX_NESTING} levels"
            )
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(
                eval_set.data_path, lineno, None, f"not valid JSON: {exc.msg}"
            ) from None
        if not isinstance(item, dict):
            raise EvalSetError(eval_set.data_path, lineno, None, "each line must be an object")
        for required in ("id", "answer"):
            if item.get(required) in (None, ""):
                raise EvalSetError(eval_set.data_path, lineno, required, "is missing")
        item_id = str(item["id"])
        if item_id in seen:
            raise EvalSetError(
                eval_set.data_path,
                lineno,
                "id",
                f"duplicate id {item_id!r} (first on line {seen[item_id]})",
            )
        seen[item_id] = lineno
        tags = item.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise EvalSetError(eval_set.data_path, lineno, "tags", "must be a list of strings")
        item["_line"] = lineno
        items.append(item)
    if not items:
        raise EvalSetError(eval_set.data_path, None, None, "has no items")
    return items


def render(template: str, item: dict, eval_set: EvalSet, template_field: str) -> str:
    """Render one item's prompt in the sandbox; the template already passed the check."""
    try:
        return templates.render(template, item)
    except jinja2.UndefinedError as exc:
        missing = re.search(r"'(\w+)' is undefined", str(exc))
        raise EvalSetError(
            eval_set.data_path,
            item.get("_line"),
            missing.group(1) if missing else None,
            f"missing, but {template_field} uses it",
        ) from None
    except jinja2.TemplateError as exc:  # the sandbox's SecurityError is one
        raise EvalSetError(
            eval_set.directory / "task.yaml",
            eval_set.key_lines.get(template_field),
            template_field,
            f"broken template: {exc}",
        ) from None


def chat_messages(eval_set: EvalSet, item: dict) -> list[dict[str, str]]:
    """The chat messages the evaluation sends for ``item``: the set's description (if any)
    as the system message, its ``doc_to_text`` as the user's. The canary's quality probes
    and a load test's ``prompts_from`` send the same."""
    text = render(eval_set.task["doc_to_text"], item, eval_set, "doc_to_text")
    messages = []
    if eval_set.task.get("description"):
        messages.append({"role": "system", "content": str(eval_set.task["description"])})
    return messages + [{"role": "user", "content": text}]


def traffic(name: str, root: Path | None = None) -> list[list[dict[str, str]]]:
    """Every item of eval set ``name`` as the chat messages the evaluation sends, in the
    set's order: a load test's ``prompts_from``."""
    eval_set = load_eval_set(name, root)
    return [chat_messages(eval_set, item) for item in load_items(eval_set)]
