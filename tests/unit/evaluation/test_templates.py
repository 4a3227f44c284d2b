"""The eval-set template language: fields and a few filters; nothing reaches Python."""

import atexit
import shutil
import tempfile
from pathlib import Path

import jinja2
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from llm_release.evaluation import templates

MARKER_DIR = Path(tempfile.mkdtemp(prefix="llmr-tpl-"))
atexit.register(shutil.rmtree, MARKER_DIR, True)

PAYLOADS = {
    "mro": "{{ ''.__class__.__mro__ }}",
    "globals": "{{ cycler.__init__.__globals__.os.system('touch {marker}') }}",
    "for": "{% for x in range(3) %}{{ x }}{% endfor %}",
    "set": "{% set x = 1 %}{{ question }}",
    "attr_filter": "{{ question | attr('__class__') }}",
    "format_filter": "{{ question | format('x') }}",
    "filter_args": "{{ question | upper('x') }}",
    "global_name": "{{ lipsum }}",
    "self": "{{ self }}",
    "dunder": "{{ __builtins__ }}",
    "call": "{{ question() }}",
    "item": "{{ question['x'] }}",
    "math": "{{ 1 + 1 }}",
    "literal": "{{ 'text' }}",
    "second_line": "Passage: {{ passage }}\n{{ passage.upper() }}",
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_anything_but_fields_and_allowed_filters_is_refused(name, tmp_path):
    marker = tmp_path / "pwned"
    problem = templates.check(PAYLOADS[name].replace("{marker}", str(marker)))
    assert problem is not None and problem.message
    assert not marker.exists()
    if name == "second_line":
        assert problem.line == 2


@pytest.mark.parametrize(
    "text",
    [
        "plain text",
        "{{ question }}",
        "[{{passage_id}}]: {{ passage | trim | upper }}\n{{ x|lower }}",
    ],
)
def test_fields_and_allowed_filters_pass_and_render(text):
    assert templates.check(text) is None
    out = templates.render(text, {"question": "Q", "passage_id": "K", "passage": " p ", "x": "X"})
    assert "{{" not in out


def test_the_renderer_is_sandboxed_even_for_unchecked_text(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(jinja2.TemplateError):
        templates.render(PAYLOADS["globals"].replace("{marker}", str(marker)), {"question": ""})
    assert not marker.exists()


def test_unknown_field_is_an_undefined_error_not_empty_text():
    with pytest.raises(jinja2.UndefinedError):
        templates.render("{{ nope }}", {})


TOKENS = [
    "{{",
    "}}",
    "{%",
    "%}",
    " ",
    "question",
    "passage",
    "x",
    ".",
    "__class__",
    "__globals__",
    "cycler",
    "lipsum",
    "self",
    "(",
    ")",
    "[",
    "]",
    "'",
    "|",
    "upper",
    "trim",
    "attr",
    "format",
    "os",
    "system",
    "'touch MARKER'",
    "for",
    "in",
    "endfor",
    "set",
    "=",
    "\n",
    "text",
    "+",
    "1",
]


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=14))
def test_any_template_is_refused_or_renders_the_same_in_lm_evals_renderer(tokens):
    """An accepted template is safe even in lm-eval's unsandboxed Jinja: it renders the
    same text there as in our sandbox, and nothing ran."""
    marker = MARKER_DIR / "pwned"
    text = "".join(tokens).replace("MARKER", str(marker))
    problem = templates.check(text)
    fields = {"question": "Q?", "passage": " P ", "x": "X"}
    if problem is None:
        plain = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text)
        try:
            ours = templates.render(text, fields)
        except jinja2.UndefinedError:
            # A field the item lacks: validate reports it at the data line.
            event("accepted, field missing")
            with pytest.raises(jinja2.UndefinedError):
                plain.render(fields)
        else:
            event("accepted")
            assert plain.render(fields) == ours
    else:
        event("refused")
        assert problem.line >= 1 and problem.message
    assert not marker.exists()
