"""The Jinja half of runner.template: the sandboxed environment and what needs Jinja's own parser. Imported
only when a template is outside runner.simple_template's subset (or breaks), so most runs never import Jinja."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

from runner.simple_template import MAX_RENDERED, TemplateLimit, check_call, quote, to_bool
from runner.template_base import (
    MAX_ITERATIONS,
    MAX_RENDER_SECONDS,
    MAX_SEQUENCE,
    EnvView,
    Outputs,
    RenderError,
    TemplateSyntax,
    _budget,
    _finalize,
    _ip_address,
    _range,
)


def _check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    check_call(obj, args, kwargs, exempt=_range)


class _Undefined(jinja2.StrictUndefined):
    @property
    def _undefined_message(self) -> str:
        obj = self._undefined_obj
        if isinstance(obj, Outputs):
            have = ", ".join(sorted(obj)) or "none recorded"
            return f"step {obj.step!r} has no output {self._undefined_name!r} (its outputs: {have})"
        if self._undefined_hint is None and self._undefined_obj is jinja2.utils.missing:
            return f"{self._undefined_name!r} is undefined"
        return str(super()._undefined_message)


class _Environment(SandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "%" and isinstance(left, str):
            _check_call(None, (left,), {})
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_SEQUENCE:
                    raise TemplateLimit(f"`*` would make {len(seq) * times} items (the limit is {MAX_SEQUENCE})")
        if operator == "**" and isinstance(right, int) and abs(right) > 1000:
            raise TemplateLimit(f"`**` with an exponent of {right} is refused (the limit is 1000)")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's names
        _check_call(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        # Data first: `vars.items`, `env.keys`, `steps.x.items` are the var, variable or output of that name, not
        # the dict method of that name (Jinja's default tries the attribute first).
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]
        if isinstance(obj, EnvView):
            return obj.unset(self, attribute)
        if isinstance(obj, str) and attribute in ("format", "format_map", "ljust", "rjust", "center", "zfill"):
            _check_call(None, (obj,), {})
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        if isinstance(obj, EnvView) and isinstance(argument, str) and argument not in obj:
            return obj.unset(self, argument)
        return super().getitem(obj, argument)


@functools.lru_cache(maxsize=1)
def environment() -> SandboxedEnvironment:
    env = _Environment(undefined=_Undefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize)
    env.globals["range"] = _range
    env.filters["quote"] = quote
    env.filters["bool"] = to_bool
    env.tests["ip_address"] = _ip_address
    for name, function in list(env.filters.items()):
        env.filters[name] = _checked(function)
    return env


@functools.lru_cache(maxsize=4096)
def _compile(source: str) -> jinja2.Template:
    return environment().from_string(source)


@functools.lru_cache(maxsize=4096)
def _parse(source: str) -> nodes.Template:
    return environment().parse(source)


@contextlib.contextmanager
def _render_errors(path: tuple[str | int, ...]) -> Iterator[None]:
    """Whatever goes wrong while rendering becomes a RenderError naming the field."""
    try:
        yield
    except TemplateLimit as exc:
        raise RenderError(f"template refused: {exc}", path) from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"undefined in template: {exc.message}", path) from None
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"template syntax error: {exc.message}", path) from None
    except jinja2.exceptions.SecurityError as exc:
        raise RenderError(f"not allowed in a template: {exc}", path) from None
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, jinja2.TemplateError) as exc:
        raise RenderError(f"template error: {exc}", path) from None
    except RecursionError:
        raise RenderError("template error: recursion too deep", path) from None


def _checked(function: Any) -> Any:
    """A filter whose arguments pass _check_call first (filters do not go through the sandbox's call)."""

    @functools.wraps(function)  # keeps Jinja's pass_context / pass_environment marks
    def filtered(*args: Any, **kwargs: Any) -> Any:
        _check_call(
            function, tuple(a for a in args if not isinstance(a, (jinja2.runtime.Context, jinja2.Environment))), kwargs
        )
        return function(*args, **kwargs)

    return filtered


def _bounded(template: jinja2.Template, context: Mapping[str, Any]) -> str:
    """Render, but stop a template that produces too much or takes too long (a loop that never ends)."""
    _budget.left = MAX_ITERATIONS
    started = time.monotonic()
    size = 0
    parts: list[str] = []
    for part in template.generate(context):
        size += len(part)
        if size > MAX_RENDERED:
            raise TemplateLimit(f"it renders to more than {MAX_RENDERED} characters")
        if time.monotonic() - started > MAX_RENDER_SECONDS:
            raise TemplateLimit(f"it ran for more than {MAX_RENDER_SECONDS:g}s")
        parts.append(part)
    return "".join(parts)


def render_string(source: str, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> str:
    with _render_errors(path):
        return _bounded(_compile(source), context)


def render_expression(expr: str, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> Any:
    with _render_errors(path):
        _budget.left = MAX_ITERATIONS
        value = environment().compile_expression(expr, undefined_to_none=False)(**context)
    if isinstance(value, jinja2.Undefined):
        raise RenderError("undefined in template", path)
    return value


def _attr_of(node: nodes.Node, root: str) -> str | None:
    """For `root.x` or `root['x']`, the name x."""
    if isinstance(node, nodes.Getattr) and isinstance(node.node, nodes.Name) and node.node.name == root:
        return node.attr
    if (
        isinstance(node, nodes.Getitem)
        and isinstance(node.node, nodes.Name)
        and node.node.name == root
        and isinstance(node.arg, nodes.Const)
        and isinstance(node.arg.value, str)
    ):
        return node.arg.value
    return None


def _guarded(node: nodes.Node, parents: dict[int, nodes.Node]) -> bool:
    """Inside `x | default(...)` or `x is defined`: a missing name is allowed there."""
    parent = parents.get(id(node))
    while parent is not None:
        if isinstance(parent, nodes.Filter) and parent.name in {"default", "d"}:
            return True
        if isinstance(parent, nodes.Test) and parent.name in {"defined", "undefined", "none"}:
            return True
        if not isinstance(parent, (nodes.Getattr, nodes.Getitem)):
            return False
        parent = parents.get(id(parent))
    return False


@functools.lru_cache(maxsize=4096)
def template_names(source: str) -> tuple[frozenset[str], tuple[tuple[str, str, bool, str | None], ...]]:
    """(undeclared top-level names, ((root, attr, guarded, next attr), ...)) used by a template: `steps.a.x`
    gives ("steps", "a", False, "x")."""
    from jinja2 import meta

    try:
        tree = _parse(source)
        undeclared = frozenset(meta.find_undeclared_variables(tree))  # its code generator checks filter names
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateSyntax(exc.message or str(exc)) from None
    parents: dict[int, nodes.Node] = {}
    for parent in tree.find_all(nodes.Node):
        for child in parent.iter_child_nodes():
            parents[id(child)] = parent
    uses: list[tuple[str, str, bool, str | None]] = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        for root in ("vars", "steps", "env"):
            attr = _attr_of(node, root)
            if attr is not None:
                uses.append((root, attr, _guarded(node, parents), _next_attr(node, parents)))
    return undeclared, tuple(uses)


def _next_attr(node: nodes.Node, parents: dict[int, nodes.Node]) -> str | None:
    """For `steps.a.stdout` (or `steps.a['stdout']`), given the node of `steps.a`: "stdout"."""
    parent = parents.get(id(node))
    if isinstance(parent, nodes.Getattr) and parent.node is node:
        return parent.attr
    if isinstance(parent, nodes.Getitem) and parent.node is node and isinstance(parent.arg, nodes.Const):
        value = parent.arg.value
        return value if isinstance(value, str) else None
    return None


@functools.lru_cache(maxsize=4096)
def private_attributes(source: str) -> str | None:
    """The first `x._name` or `x['_name']` in a template: the sandbox refuses them at render time; say so at load."""
    tree = _parse(source)
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = node.attr if isinstance(node, nodes.Getattr) else getattr(getattr(node, "arg", None), "value", None)
        if isinstance(name, str) and name.startswith("_"):
            return name
    return None
