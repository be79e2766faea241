"""The templates most pipelines are made of — `{{ steps.openenv.path }}`, `{{ vars.work | quote }}`,
`{{ '--n 8' if vars.smoke | bool else '' }}` — rendered without Jinja, so that a run need not import it (nor
lex, parse and compile each template): about 0.05 s of a converged run.

The subset, and nothing more: text, and `{{ expression }}` where an expression is a dotted name (`a.b.c`, no
part starting with `_`), a quoted string without backslashes or braces, `( expression )`, either followed by
`| quote` or `| bool`, and `X if Y else Z` of those. Anything else — `{%`, `{#`, `{{-`, other filters,
operators, subscripts, a name the context does not hold, a value that is not a mapping where a name is looked
up in it, more than a few filters or parentheses in a row — is left to Jinja (runner.jinja_templates), which
then gives the same result or the same error it always did. What a subset template means is what that sandboxed
Jinja environment makes of it (data first for `a.b` on a mapping, `str()` of each expression's value after
`finalize`, the `quote` and `bool` filters and their call checks); tests/test_fuzz.py renders random subset
templates both ways and compares.
"""

from __future__ import annotations

import functools
import re
import shlex
from collections.abc import Callable, Mapping
from typing import Any

from runner.util.text import TRUE_WORDS

MAX_RENDERED = 1_000_000  # characters one template may produce
MAX_ARGUMENT = 1_000_000  # the largest number a template may pass to a call (a width, a count)
_HUGE_FORMAT = re.compile(r"\d{7,}")


class TemplateLimit(Exception):
    """A template asked for more than runner allows (too long, too many iterations, a huge argument)."""


def check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any], exempt: Any = None) -> None:
    """Refuse calls that would build something enormous: `'x'.ljust(10**9)`, `center(10**9)`,
    `'%999999999d' | format(1)`."""
    if exempt is not None and obj is exempt:
        return
    values = [*args, *kwargs.values()]
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARGUMENT:
            raise TemplateLimit(f"a call with the number {value} is refused (the limit is {MAX_ARGUMENT})")
    owner = getattr(obj, "__self__", None)
    texts = [v for v in values if isinstance(v, str)] + ([owner] if isinstance(owner, str) else [])
    if any(_HUGE_FORMAT.search(t) for t in texts if "%" in t or "{" in t):
        raise TemplateLimit("a format with a width of a million or more is refused")


def quote(value: Any) -> str:
    return shlex.quote(str(value))


def to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


FILTERS: dict[str, Callable[[Any], Any]] = {"quote": quote, "bool": to_bool}
# Jinja's keywords and constants: not names here (Jinja gives them other meanings).
_RESERVED = frozenset(
    "and or not in is if else elif endif for endfor true false none True False None recursive with".split()
)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_REST = re.compile(r"\s*\Z")
MAX_DEPTH = 8  # filters on one value, parentheses in one another: deeper is Jinja's (and its recursion limit's)
_TOKEN = re.compile(
    r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_]*)|(?P<string>'[^'\\{}\n]*'|\"[^\"\\{}\n]*\")|(?P<op>[.|()]))"
)


class Unsupported(Exception):
    """Not in the subset: Jinja renders it."""


# An expression: ("path", names), ("const", text), ("filter", name, expr), ("cond", test, then, otherwise).
Expr = tuple[Any, ...]
Part = str | Expr


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        self.depth = 0
        while not _REST.match(source, pos):
            match = _TOKEN.match(source, pos)
            if match is None:
                raise Unsupported(source)
            kind = match.lastgroup or ""
            self.tokens.append((kind, match.group(kind)))
            pos = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            raise Unsupported(str(token))
        self.at += 1
        return token[1]

    def whole(self) -> Expr:
        expr = self.cond()
        if self.peek() is not None:
            raise Unsupported(str(self.peek()))
        return expr

    def cond(self) -> Expr:
        then = self.piped()
        token = self.peek()
        if token == ("name", "if"):
            self.at += 1
            test = self.piped()
            if not _has_path(test):
                raise Unsupported("a constant test")  # Jinja folds it while compiling: a branch goes
            self.take("name", "else")
            otherwise = self.piped()
            return ("cond", test, then, otherwise)
        return then

    def piped(self) -> Expr:
        expr = self.primary()
        filters = 0
        while self.peek() == ("op", "|"):
            self.at += 1
            name = self.take("name")
            filters += 1
            if name not in FILTERS or filters > MAX_DEPTH:
                raise Unsupported(name)
            expr = ("filter", name, expr)
        return expr

    def primary(self) -> Expr:
        token = self.peek()
        if token is None:
            raise Unsupported("end")
        kind, value = token
        if kind == "string":
            self.at += 1
            return ("const", value[1:-1])
        if kind == "op" and value == "(":
            self.at += 1
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise Unsupported("nested too deeply")
            inner = self.cond()
            self.take("op", ")")
            self.depth -= 1
            return inner
        if kind == "name":
            names = [self._name()]
            while self.peek() == ("op", "."):
                self.at += 1
                names.append(self._name())
            return ("path", tuple(names))
        raise Unsupported(value)

    def _name(self) -> str:
        name = self.take("name")
        if name in _RESERVED or not _NAME.fullmatch(name):
            raise Unsupported(name)
        return name


_OPEN = re.compile(r"\{\{|\{%|\{#|\}\}")


@functools.lru_cache(maxsize=4096)
def parse(source: str) -> tuple[Part, ...] | None:
    """The parts of a subset template (text, and expressions), or None when it is not one."""
    if "\r" in source:
        return None  # Jinja turns \r\n into \n in the text: leave that to it
    parts: list[Part] = []
    pos = 0
    while True:
        start = source.find("{{", pos)
        text = source[pos:] if start < 0 else source[pos:start]
        if _OPEN.search(text):
            return None  # a block, a comment, or a stray `}}`
        if text:
            parts.append(text)
        if start < 0:
            break
        end = source.find("}}", start + 2)
        if end < 0:
            return None
        inner = source[start + 2 : end]
        if inner.startswith(("-", "+")) or inner.endswith(("-", "+")) or "{" in inner:
            return None  # whitespace control, or a nested opening
        try:
            expr = _Parser(inner).whole()
        except Unsupported:
            return None
        if not _has_path(expr):
            return None  # a constant: Jinja finalizes it while compiling; leave it to Jinja
        parts.append(expr)
        pos = end + 2
    return tuple(parts)


@functools.lru_cache(maxsize=4096)
def parse_expression(source: str) -> Expr | None:
    """A subset expression on its own (the inside of `{{ }}`), or None."""
    if "\r" in source or "{" in source or "}" in source:
        return None
    try:
        expr = _Parser(source).whole()
    except Unsupported:
        return None
    return expr if _has_path(expr) else None


def _has_path(expr: Expr) -> bool:
    kind = expr[0]
    if kind == "path":
        return True
    if kind == "const":
        return False
    if kind == "filter":
        return _has_path(expr[2])
    return any(_has_path(e) for e in expr[1:])


class _Missing(Exception):
    """A name the context does not hold, or a lookup in something that is not a mapping: Jinja decides."""


def evaluate(expr: Expr, context: Mapping[str, Any]) -> Any:
    kind = expr[0]
    if kind == "path":
        names = expr[1]
        if names[0] not in context:
            raise _Missing(names[0])
        value = context[names[0]]
        for name in names[1:]:
            if not isinstance(value, Mapping) or name not in value:
                raise _Missing(name)
            value = value[name]
        return value
    if kind == "const":
        return expr[1]
    if kind == "filter":
        value = evaluate(expr[2], context)
        function = FILTERS[expr[1]]
        check_call(function, (value,), {})
        return function(value)
    _, test, then, otherwise = expr
    return evaluate(then, context) if evaluate(test, context) else evaluate(otherwise, context)


def render(parts: tuple[Part, ...], context: Mapping[str, Any], finalize: Callable[[Any], Any]) -> str | None:
    """The rendered text, or None when Jinja must decide (a missing name, a limit reached)."""
    out: list[str] = []
    size = 0
    try:
        for part in parts:
            text = part if isinstance(part, str) else str(finalize(evaluate(part, context)))
            size += len(text)
            if size > MAX_RENDERED:
                return None
            out.append(text)
    except (_Missing, TemplateLimit):
        return None
    return "".join(out)


def value_of(expr: Expr, context: Mapping[str, Any]) -> tuple[bool, Any]:
    """(True, the expression's value) or (False, None) when Jinja must decide."""
    try:
        return True, evaluate(expr, context)
    except (_Missing, TemplateLimit):
        return False, None


def names_used(parts: tuple[Part, ...]) -> tuple[frozenset[str], tuple[tuple[str, str, bool, str | None], ...]]:
    """What runner.template.template_names reports for the same template, read from the subset's own tree:
    the top-level names, and for each `vars.x`, `steps.x.y`, `env.x` (root, x, guarded, y) in the order Jinja's
    tree walk finds them (a conditional's test before its branches)."""
    roots: set[str] = set()
    uses: list[tuple[str, str, bool, str | None]] = []

    def walk(expr: Expr) -> None:
        kind = expr[0]
        if kind == "path":
            names = expr[1]
            roots.add(names[0])
            if len(names) > 1 and names[0] in ("vars", "steps", "env"):
                uses.append((names[0], names[1], False, names[2] if len(names) > 2 else None))
        elif kind == "filter":
            walk(expr[2])
        elif kind == "cond":
            walk(expr[1])
            walk(expr[2])
            walk(expr[3])

    for part in parts:
        if not isinstance(part, str):
            walk(part)
    return frozenset(roots), tuple(uses)
