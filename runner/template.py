"""Jinja2 templates as Ansible users know them: sandboxed, StrictUndefined, `{{ }}`.

Context: ``vars``, ``env``, ``facts`` and ``steps.<name>.<output>``. Strings without ``{{``/``{%`` are
never parsed, so plain specs cost nothing.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shlex
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment

if TYPE_CHECKING:
    from runner.marks import MarkedData
    from runner.model import StepDecl

from steps._support.interpreter import this_python
from steps._support.words import TEMPLATE_MARKERS, TRUE_WORDS, is_template

__all__ = ["TEMPLATE_MARKERS", "is_template"]

CONTEXT_NAMES = frozenset({"vars", "env", "facts", "steps"})


def _quote(value: Any) -> str:
    return shlex.quote(str(value))


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in TRUE_WORDS
    return bool(value)


def _ip_address(value: Any) -> bool:
    """`x is ip_address`: a literal IPv4 or IPv6 address (not a host name): sslip.io domains need one."""
    import ipaddress

    try:
        ipaddress.ip_address(str(value).strip())
    except ValueError:
        return False
    return True


class Outputs(dict[str, Any]):
    """A step's outputs in the template context; knows its step's name for error messages."""

    def __init__(self, step: str, values: Mapping[str, Any]) -> None:
        super().__init__(values)
        self.step = step


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


MAX_RENDERED = 1_000_000  # characters one template may produce
MAX_RENDER_SECONDS = 5.0  # time one template may take
MAX_SEQUENCE = 100_000  # items or characters a `*` may make; the sandbox already caps range() there


class TemplateLimit(Exception):
    """A template went past a limit (size, time, repetition): it is refused, not run to exhaustion."""


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


_parts = threading.local()


def _finalize(value: Any) -> Any:
    """Each `{{ expression }}`'s value on its way into the text: handed to the collector that
    `secret_parts` installs (a slice of a secret is masked as the secret is)."""
    sink = getattr(_parts, "sink", None)
    if sink is not None and isinstance(value, str):
        sink(value)
    return value


@contextlib.contextmanager
def secret_parts(sink: Callable[[str], None]) -> Iterator[None]:
    """While rendering in this thread, every expression's string value goes to `sink` too."""
    previous = getattr(_parts, "sink", None)
    _parts.sink = sink
    try:
        yield
    finally:
        _parts.sink = previous


class EnvView(dict[str, str]):
    """`env` in templates: runner's environment and the exports of the env steps a step sees. A variable that
    is not set is an error that says so (not Jinja's "'dict object' has no attribute")."""

    def unset(self, environment: SandboxedEnvironment, name: str) -> Any:
        return environment.undefined(
            hint=f"env.{name} is not set (not in runner's environment, nor exported by an env step this step "
            f"sees); `{{{{ env.{name} | default('') }}}}` makes it optional"
        )


@functools.lru_cache(maxsize=1)
def environment() -> SandboxedEnvironment:
    env = _Environment(undefined=_Undefined, autoescape=False, keep_trailing_newline=True, finalize=_finalize)
    env.globals["range"] = _range
    env.filters["quote"] = _quote
    env.filters["bool"] = _bool
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


def when_source(when: str) -> str:
    """`when:` takes a template (`"{{ vars.x }}"`) or, as in Ansible, a bare expression (`vars.x`)."""
    return when if is_template(when) else "{{ (" + when + ") }}"


class RenderError(Exception):
    def __init__(self, message: str, path: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def render_string(source: str, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> str:
    if not is_template(source):
        return source
    with _render_errors(path):
        return _bounded(_compile(source), context)


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


MAX_ARGUMENT = 1_000_000  # the largest number a template may pass to a call (a width, a count)
_HUGE_FORMAT = re.compile(r"\d{7,}")


def _check_call(obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse calls that would build something enormous: `'x'.ljust(10**9)`, `center(10**9)`,
    `'%999999999d' | format(1)`."""
    values = [*args, *kwargs.values()]
    if obj is _range:
        return
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_ARGUMENT:
            raise TemplateLimit(f"a call with the number {value} is refused (the limit is {MAX_ARGUMENT})")
    owner = getattr(obj, "__self__", None)
    texts = [v for v in values if isinstance(v, str)] + ([owner] if isinstance(owner, str) else [])
    if any(_HUGE_FORMAT.search(t) for t in texts if "%" in t or "{" in t):
        raise TemplateLimit("a format with a width of a million or more is refused")


def _checked(function: Any) -> Any:
    """A filter whose arguments pass _check_call first (filters do not go through the sandbox's call)."""

    @functools.wraps(function)  # keeps Jinja's pass_context / pass_environment marks
    def filtered(*args: Any, **kwargs: Any) -> Any:
        _check_call(
            function, tuple(a for a in args if not isinstance(a, (jinja2.runtime.Context, jinja2.Environment))), kwargs
        )
        return function(*args, **kwargs)

    return filtered


MAX_ITERATIONS = 1_000_000  # range() items one render may ask for, nested loops included
_budget = threading.local()


def _range(*args: int) -> range:
    """range() under a budget per render: nested loops cannot multiply into hours of work."""
    made = range(*args)
    left = getattr(_budget, "left", MAX_ITERATIONS) - len(made)
    if left < 0:
        raise TemplateLimit(f"its loops ask for more than {MAX_ITERATIONS} iterations")
    _budget.left = left
    return made


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


def render_data(data: Any, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> Any:
    """Render every string inside nested dicts and lists."""
    if isinstance(data, str):
        return render_string(data, context, path)
    if isinstance(data, dict):
        return {k: render_data(v, context, (*path, k)) for k, v in data.items()}
    if isinstance(data, list):
        return [render_data(v, context, (*path, i)) for i, v in enumerate(data)]
    return data


_WHOLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\}\}).)*)\}\}\s*$", re.S)


def render_value(source: Any, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> Any:
    """Like render_data, but a string that is one whole `{{ expression }}` keeps the expression's type (a list
    stays a list): for `for_each: "{{ vars.tasks }}"`."""
    if not isinstance(source, str):
        return render_data(source, context, path)
    match = _WHOLE_EXPRESSION.match(source)
    if not match:
        return render_string(source, context, path)
    with _render_errors(path):
        _budget.left = MAX_ITERATIONS
        value = environment().compile_expression(match.group("expr"), undefined_to_none=False)(**context)
    if isinstance(value, jinja2.Undefined):
        raise RenderError("undefined in template", path)
    return value


def iter_strings(data: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if isinstance(data, str):
        yield path, data
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from iter_strings(v, (*path, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from iter_strings(v, (*path, i))


# ---- static checks: which names a template uses -------------------------------------------------------


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

    tree = _parse(source)
    undeclared = frozenset(meta.find_undeclared_variables(tree))
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
def _private_attributes(source: str) -> str | None:
    """The first `x._name` or `x['_name']` in a template: the sandbox refuses them at render time; say so at load."""
    tree = _parse(source)
    for node in tree.find_all((nodes.Getattr, nodes.Getitem)):
        name = node.attr if isinstance(node, nodes.Getattr) else getattr(getattr(node, "arg", None), "value", None)
        if isinstance(name, str) and name.startswith("_"):
            return name
    return None


def declared_outputs(step: StepDecl) -> frozenset[str] | None:
    """The outputs `steps.NAME.x` may name: a for_each step's aggregate, else what its kind declares (None: any,
    as an env step's, whose outputs are every variable exported so far)."""
    if step.common.for_each is not None:
        return frozenset({"items", "keys", "count"})
    from steps import kind_class

    return kind_class(step.kind).outputs


def check_templates(
    steps: Sequence[StepDecl], variables: Mapping[str, Any], marks: MarkedData
) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Syntax, unknown names, unknown vars, unknown steps and outputs, at load time; returns each step's
    references to steps and the `env.X` names it reads."""
    names = {s.name for s in steps}
    by_name = {s.name: s for s in steps}
    outputs_of = {s.name: declared_outputs(s) for s in steps}
    refs: dict[str, set[str]] = {s.name: set() for s in steps}
    env_refs: dict[str, set[str]] = {s.name: set() for s in steps}
    for step in steps:
        sources: list[tuple[tuple[str | int, ...], str, str]] = []
        for path, text in iter_strings(step.raw, ("steps", step.index, step.kind)):
            if is_template(text):
                sources.append((path, text, text))
        if isinstance(step.common.when, str):
            sources.append((("steps", step.index, "when"), step.common.when, when_source(step.common.when)))
        if step.common.hint and is_template(step.common.hint):
            sources.append((("steps", step.index, "hint"), step.common.hint, step.common.hint))
        loop = step.common.for_each
        if loop is not None:
            for path, text in iter_strings(loop, ("steps", step.index, "for_each")):
                if is_template(text):
                    sources.append((path, text, text))
        allowed = CONTEXT_NAMES | ({"item", "item_index"} if loop is not None else set())
        for path, shown, source in sources:
            field = f"steps[{step.index}] ({step.name})." + ".".join(str(p) for p in path[2:])
            try:
                undeclared, uses = template_names(source)
            except jinja2.TemplateSyntaxError as exc:
                raise marks.error(path, f"template syntax error: {exc.message} in {shown!r}", field=field) from None
            except RecursionError:
                raise marks.error(path, "template nested too deeply", field=field) from None
            if path[2] == "for_each":
                allowed = CONTEXT_NAMES  # the list itself cannot use its items
            private = _private_attributes(source)
            if private:
                raise marks.error(
                    path,
                    f"not allowed in a template: the attribute {private!r} (names that start with _ are internals)",
                    field=field,
                )
            for name in sorted(undeclared - allowed):
                hint = " (`item` exists only in a step with `for_each`)" if name in ("item", "item_index") else ""
                raise marks.error(
                    path,
                    f"undefined template variable {name!r}; the context has vars, env, facts and steps{hint}",
                    field=field,
                )
            allowed = CONTEXT_NAMES | ({"item", "item_index"} if loop is not None else set())
            for root, attr, guarded, output in uses:
                if root == "vars" and attr not in variables and not guarded:
                    known = ", ".join(sorted(variables)) or "none"
                    raise marks.error(
                        path, f"undefined template variable vars.{attr} (vars defined: {known})", field=field
                    )
                if root == "steps":
                    if attr not in names:
                        raise marks.error(path, f"template references unknown step {attr!r}", field=field)
                    if attr == step.name:
                        raise marks.error(path, "a step cannot reference its own outputs", field=field)
                    refs[step.name].add(attr)
                    known_outputs = outputs_of.get(attr)
                    if output is not None and known_outputs is not None and output not in known_outputs:
                        from runner.load import suggest

                        kind = by_name[attr].kind
                        if by_name[attr].common.for_each is not None:
                            kind = f"a for_each {kind}"
                        raise marks.error(
                            path,
                            f"step {attr!r} ({kind}) has no output {output!r}" + suggest(output, sorted(known_outputs)),
                            field=field,
                        )
                if root == "env" and not guarded:
                    env_refs[step.name].add(attr)
    return refs, env_refs


# ---- facts: computed on first use -----------------------------------------------------------------------


def _default_route_ip() -> str | None:
    """The IPv4 address of the interface that holds the default route, read locally (no traffic)."""
    try:
        with open("/proc/net/route", encoding="ascii") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    iface = None
    for line in lines:
        fields = line.split()
        if len(fields) > 2 and fields[1] == "00000000":
            iface = fields[0]
            break
    if iface is None:
        return None
    try:
        import fcntl

        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = struct.pack("256s", iface.encode()[:15])
            return socket.inet_ntoa(fcntl.ioctl(sock.fileno(), 0x8915, packed)[20:24])  # SIOCGIFADDR
    except OSError:
        return None


def _host_ip() -> str:
    ip = _default_route_ip()
    if ip:
        return ip
    try:
        resolved = socket.gethostbyname(socket.gethostname())
        if resolved:
            return resolved
    except OSError:
        pass
    return "127.0.0.1"


class Facts(Mapping[str, Any]):
    """Host facts, each computed the first time a template asks for it."""

    _makers: dict[str, Any] = {
        "host_ip": _host_ip,
        "hostname": socket.gethostname,
        "cpus": lambda: os.cpu_count() or 1,
        "user": lambda: os.environ.get("USER") or str(os.getuid()),
        "home": lambda: os.path.expanduser("~"),
        "kernel": lambda: os.uname().release,
        "arch": lambda: os.uname().machine,
        "python": this_python,  # the interpreter running runner, one spelling however it was started
    }

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._values:
            if key == "host_ip_dashed":
                self._values[key] = str(self["host_ip"]).replace(".", "-")
            elif key in self._makers:
                self._values[key] = self._makers[key]()
            else:
                raise KeyError(key)
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._makers, "host_ip_dashed"])

    def __len__(self) -> int:
        return len(self._makers) + 1
