"""The eval-set template language: fields and a few filters; nothing reaches Python."""

import jinja2
import pytest

from llm_release import templates

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
