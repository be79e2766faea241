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


# ---- the subset renderer (runner.simple_template) against Jinja -------------------------------------------

KEYS = ["a", "b", "path", "items", "keys", "x_1", "port"]
leaf_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**7), 10**7),
    st.sampled_from(["", "true", "yes", "off", "0", "it's", 'a "q"', "a b", "$(x)", "ünï"]),
    st.text(max_size=8),
)
values = st.recursive(
    leaf_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4),
    max_leaves=12,
)
contexts = st.fixed_dictionaries(
    {
        "vars": st.dictionaries(st.sampled_from(KEYS), values, max_size=5),
        "steps": st.dictionaries(st.sampled_from(KEYS), st.dictionaries(st.sampled_from(KEYS), values, max_size=4)),
        "item": values,
    }
)
space = st.sampled_from(["", " ", "  ", "\n", "\t"])
paths = st.builds(
    lambda root, rest: ".".join([root, *rest]),
    st.sampled_from(["vars", "steps", "item", "env", "facts2"]),
    st.lists(st.sampled_from(KEYS), max_size=3),
)
constants = st.sampled_from(["''", "'--n 8'", '"x y"', "'it'", '"a\'b"'])


def _expressions(depth: int = 2) -> st.SearchStrategy[str]:
    primary = paths | constants
    if depth > 0:
        primary = primary | _expressions(depth - 1).map(lambda e: f"({e})")
    piped = st.builds(
        lambda p, filters, s: p + "".join(f"{s}|{s}{f}" for f in filters),
        primary,
        st.lists(st.sampled_from(["quote", "bool"]), max_size=2),
        space,
    )
    cond = st.builds(lambda a, b, c, s: f"{a}{s} if {b} else{s} {c}", piped, piped, piped, space)
    return piped | cond


expressions = _expressions()
texts = st.text(alphabet="ab \n:/-=$'\"", max_size=6)
templates = st.builds(
    lambda pieces, tail: "".join(pieces) + tail,
    st.lists(st.builds(lambda t, s1, e, s2: f"{t}{{{{{s1}{e}{s2}}}}}", texts, space, expressions, space), max_size=3),
    texts,
)


def _by_jinja(source: str, context: dict[str, Any]) -> tuple[str, list[str]]:
    from runner import jinja_templates
    from runner.template import secret_parts

    seen: list[str] = []
    try:
        with secret_parts(seen.append):
            return jinja_templates.render_string(source, context), seen
    except RenderError as exc:
        return f"error: {exc.message}", seen


@FUZZ
@given(templates, contexts)
def test_the_subset_renders_as_jinja_renders(source: str, context: dict[str, Any]) -> None:
    """Each template of the subset renders to what Jinja renders, with the same values handed to the secret
    collector; where the subset gives up, Jinja decides (the result is then Jinja's by construction)."""
    from runner import simple_template
    from runner.template import _finalize, secret_parts

    parts = simple_template.parse(source)
    expected, expected_seen = _by_jinja(source, context)
    if parts is None:
        return
    seen: list[str] = []
    with secret_parts(seen.append):
        fast = simple_template.render(parts, context, _finalize)
    if fast is not None:
        assert fast == expected, (source, context)
        assert seen == expected_seen, (source, context)
    assert render_string(source, context) == expected if not expected.startswith("error: ") else True


@FUZZ
@given(expressions, contexts)
def test_a_whole_expression_keeps_its_value_as_in_jinja(expr: str, context: dict[str, Any]) -> None:
    from runner import jinja_templates, simple_template

    parsed = simple_template.parse_expression(expr)
    if parsed is None:
        return
    found, value = simple_template.value_of(parsed, context)
    if found:
        assert value == jinja_templates.render_expression(expr, context), (expr, context)


@FUZZ
@given(templates)
def test_the_subset_reads_the_names_jinja_reads(source: str) -> None:
    """check_templates' view of a template (its top-level names, and each vars./steps./env. use with the attribute
    after it, in Jinja's order) is the same from the subset's tree as from Jinja's."""
    from runner import jinja_templates, simple_template

    parts = simple_template.parse(source)
    if parts is not None:
        assert simple_template.names_used(parts) == jinja_templates.template_names(source), source


def test_long_and_deep_expressions_are_left_to_jinja() -> None:
    """The subset reads an expression in time linear in its length and never nests deeper than MAX_DEPTH:
    100,000 filters in a row or 100 parentheses deep are Jinja's to refuse (as they were before the subset)."""
    from runner import simple_template

    deep = simple_template.MAX_DEPTH
    assert simple_template.parse("{{ vars.a" + " | quote" * deep + " }}") is not None
    assert simple_template.parse("{{ vars.a" + " | quote" * (deep + 1) + " }}") is None
    assert simple_template.parse("{{ vars.a" + " | quote" * 100_000 + " }}") is None
    assert simple_template.parse("{{ " + "(" * deep + "vars.a" + ")" * deep + " }}") is not None
    assert simple_template.parse("{{ " + "(" * 100 + "vars.a" + ")" * 100 + " }}") is None
    many = "".join(f"{{{{ vars.a }}}}{i}," for i in range(20_000))
    assert render_string(many, {"vars": {"a": "x"}}) == "".join(f"x{i}," for i in range(20_000))
