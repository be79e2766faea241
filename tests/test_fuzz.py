"""Property-based fuzzing (hypothesis) of the loader and the template renderer: whatever the input, the result
is a pipeline or an InputError (a message with exit code 2), a string or a RenderError — never another
exception, never a hang (each example has a deadline), never an unbounded output."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.errors import InputError
from runner.load import load_pipeline
from runner.template import MAX_RENDERED, RenderError, render_string
from steps import KINDS

FUZZ = settings(max_examples=150, deadline=3000, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**12), 10**12), st.floats(allow_nan=True), st.text(max_size=30)
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=40,
)
FIELD_NAMES = [
    "command",
    "creates",
    "image",
    "name",
    "ports",
    "url",
    "dest",
    "ref",
    "depth",
    "packages",
    "venv",
    "http",
    "tcp",
    "timeout",
    "status",
    "detach",
    "env",
    "bytes",
    "template",
    "path",
    "kernel",
    "that",
]


@st.composite
def pipelines(draw: Any) -> dict[str, Any]:
    steps = []
    for i in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(sorted(KINDS)))
        body = draw(st.one_of(documents, st.dictionaries(st.sampled_from(FIELD_NAMES), documents, max_size=4)))
        step: dict[str, Any] = {"name": draw(st.sampled_from([f"s{i}", "", "bad name", f"s{i}"])), kind: body}
        if draw(st.booleans()):
            step[draw(st.sampled_from(["needs", "when", "for_each", "timeout", "retries"]))] = draw(documents)
        steps.append(step)
    top: dict[str, Any] = {"steps": steps}
    if draw(st.booleans()):
        top["vars"] = draw(documents)
    return top


def load_text(text: str | bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "pipeline.yaml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass"))
        try:
            load_pipeline(str(path), {})
        except InputError as exc:
            assert str(exc)


@FUZZ
@given(st.text(max_size=400))
def test_any_text_loads_or_is_an_input_error(text: str) -> None:
    load_text(text)


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes_load_or_are_an_input_error(data: bytes) -> None:
    load_text(data)


@FUZZ
@given(pipelines())
def test_any_structure_loads_or_is_an_input_error(document: dict[str, Any]) -> None:
    load_text(yaml.safe_dump(document, allow_unicode=True))


FRAGMENTS = [
    "{{",
    "}}",
    "{%",
    "%}",
    " for x in ",
    " endfor ",
    " if ",
    " endif ",
    "range(",
    ")",
    "(",
    "*",
    "**",
    "%",
    "'a'",
    "10",
    "100000",
    "999999999",
    "vars",
    ".",
    "x",
    "[",
    "]",
    "|",
    "join",
    "center",
    "format",
    "list",
    "length",
    "__class__",
    "_x",
    "lipsum",
    "cycler",
    "namespace",
    "~",
    "+",
    ",",
    " ",
    "'%9999999d'",
    "env",
    "facts",
    "steps",
    "quote",
    "bool",
    "loop",
    "recursive",
    "set y = ",
    "macro m()",
    "endmacro",
    "m()",
]
CONTEXT = {"vars": {"x": "value", "n": 3, "items": [1, 2, 3]}, "env": {"HOME": "/root"}, "facts": {}, "steps": {}}


@FUZZ
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=30).map("".join))
def test_any_template_renders_or_is_a_render_error(source: str) -> None:
    try:
        out = render_string(source, CONTEXT)
    except RenderError as exc:
        assert exc.message
    else:
        assert len(out) <= MAX_RENDERED


@FUZZ
@given(st.text(max_size=200))
def test_any_text_as_a_template(source: str) -> None:
    try:
        render_string("{{ " + source + " }}", CONTEXT)
        render_string(source, CONTEXT)
    except RenderError:
        pass
