"""The template language of eval sets: data fields and a few text filters, nothing else.

Prompts in ``task.yaml`` (``doc_to_text``, ``doc_to_target``, ``description``) are Jinja
templates written by many people and rendered by this package and by lm-evaluation-harness,
whose own renderer is not sandboxed. Jinja can reach Python internals through attribute
access, item access, calls and globals, so a template is parsed and allowed only when every
node is literal text, a data field (``{{ field }}``) or an allow-listed filter without
arguments applied to one (``{{ field | trim }}``). Only templates that passed this check
reach lm-eval; this package renders them in an immutable sandbox as a second wall.
"""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

TEMPLATE_FIELDS = ("doc_to_text", "doc_to_target", "description")
ALLOWED_FILTERS = frozenset({"trim", "upper", "lower"})

ENV = ImmutableSandboxedEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
# The globals Jinja offers every template (range, lipsum, cycler, joiner, namespace, dict)
# and the names Jinja binds itself are not data: a name that resolves to one is refused.
NOT_DATA = frozenset(ENV.globals) | {"self", "loop", "super", "caller", "varargs", "kwargs"}


@dataclass(frozen=True)
class TemplateProblem:
    line: int  # 1-based line inside the template
    message: str


def check(text: str) -> TemplateProblem | None:
    """The first construct in ``text`` that is not plain text, a field or an allowed filter."""
    try:
        tree = ENV.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return TemplateProblem(exc.lineno or 1, f"broken template: {exc.message}")
    for output in tree.body:
        if not isinstance(output, nodes.Output):
            return _refuse(output, "statements ({% ... %}) are not allowed")
        for node in output.nodes:
            if isinstance(node, nodes.TemplateData):
                continue
            problem = _expression(node)
            if problem:
                return problem
    return None


def _expression(node: nodes.Node) -> TemplateProblem | None:
    if isinstance(node, nodes.Name):
        if node.ctx != "load" or node.name.startswith("_") or node.name in NOT_DATA:
            return _refuse(node, f"{node.name!r} is not a data field")
        return None
    if isinstance(node, nodes.Filter):
        if node.name not in ALLOWED_FILTERS:
            return _refuse(
                node,
                f"filter {node.name!r} is not allowed (allowed: {', '.join(sorted(ALLOWED_FILTERS))})",
            )
        if node.args or node.kwargs or node.dyn_args or node.dyn_kwargs or node.node is None:
            return _refuse(node, f"filter {node.name!r} takes no arguments here")
        return _expression(node.node)
    kind = {
        nodes.Getattr: "attribute access (x.y)",
        nodes.Getitem: "item access (x[y])",
        nodes.Call: "calls",
    }.get(type(node), f"{type(node).__name__} expressions")
    return _refuse(node, f"{kind} are not allowed; use {{{{ field }}}}")


def _refuse(node: nodes.Node, message: str) -> TemplateProblem:
    return TemplateProblem(getattr(node, "lineno", 1) or 1, message)


def render(text: str, fields: dict) -> str:
    """Render a template that passed :func:`check`; still sandboxed and immutable."""
    return ENV.from_string(text).render(fields)
