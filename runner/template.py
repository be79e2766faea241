"""Jinja2 templates as Ansible users know them: sandboxed, StrictUndefined, `{{ }}`.

Context: ``vars``, ``env``, ``facts`` and ``steps.<name>.<output>``. Strings without ``{{``/``{%`` are
never parsed, so plain specs cost nothing. Templates of runner.simple_template's subset (dotted names, `quote`,
`bool`, `x if y else z`) are rendered and checked there, without Jinja; everything else, and every error, goes
through Jinja (runner.jinja_templates, imported when first needed).
"""

from __future__ import annotations

import os
import re
import socket
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runner import simple_template as simple
from runner.simple_template import MAX_ARGUMENT, MAX_RENDERED, TemplateLimit
from runner.template_base import (
    MAX_ITERATIONS,
    MAX_RENDER_SECONDS,
    MAX_SEQUENCE,
    EnvView,
    Outputs,
    RenderError,
    TemplateSyntax,
    secret_parts,
)
from runner.template_base import _finalize as _finalize

if TYPE_CHECKING:
    from runner.marks import MarkedData
    from runner.model import StepDecl

from runner.util.interpreter import this_python
from runner.util.text import TEMPLATE_MARKERS, is_template

__all__ = [
    "MAX_ARGUMENT",
    "MAX_ITERATIONS",
    "MAX_RENDERED",
    "MAX_RENDER_SECONDS",
    "MAX_SEQUENCE",
    "TEMPLATE_MARKERS",
    "EnvView",
    "Outputs",
    "RenderError",
    "TemplateLimit",
    "TemplateSyntax",
    "is_template",
    "secret_parts",
]

CONTEXT_NAMES = frozenset({"vars", "env", "facts", "steps"})


def when_source(when: str) -> str:
    """`when:` takes a template (`"{{ vars.x }}"`) or, as in Ansible, a bare expression (`vars.x`)."""
    return when if is_template(when) else "{{ (" + when + ") }}"


def render_string(source: str, context: Mapping[str, Any], path: tuple[str | int, ...] = ()) -> str:
    if not is_template(source):
        return source
    parts = simple.parse(source)
    if parts is not None:
        text = simple.render(parts, context, _finalize)
        if text is not None:
            return text
    from runner import jinja_templates

    return jinja_templates.render_string(source, context, path)


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
    expr = simple.parse_expression(match.group("expr"))
    if expr is not None:
        found, value = simple.value_of(expr, context)
        if found:
            return value
    from runner import jinja_templates

    return jinja_templates.render_expression(match.group("expr"), context, path)


def template_names(source: str) -> tuple[frozenset[str], tuple[tuple[str, str, bool, str | None], ...]]:
    """(undeclared top-level names, ((root, attr, guarded, next attr), ...)) used by a template: `steps.a.x`
    gives ("steps", "a", False, "x"). TemplateSyntax when Jinja cannot parse it."""
    parts = simple.parse(source)
    if parts is not None:
        return simple.names_used(parts)
    from runner import jinja_templates

    return jinja_templates.template_names(source)


def _private_attributes(source: str) -> str | None:
    if simple.parse(source) is not None:
        return None  # the subset has no name that starts with _
    from runner import jinja_templates

    return jinja_templates.private_attributes(source)


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
        if step.common.host and is_template(step.common.host):
            sources.append((step.host_at, step.common.host, step.common.host))
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
            except TemplateSyntax as exc:
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
                        from runner.errors import suggest

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
