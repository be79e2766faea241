"""Templates are sandboxed: no Python internals, no files, no imports, bounded work; argv is never a shell."""

from __future__ import annotations

import pytest
from conftest import Project

from runner.template import RenderError, render_string

CONTEXT = {"vars": {"x": "v"}, "env": {}, "facts": {}, "steps": {}}

ESCAPES = [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ vars.__class__ }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ ''|attr('__class__') }}",
    "{{ range.__call__ }}",
    "{% import 'os' as os %}",
    "{% include '/etc/passwd' %}",
    "{% extends '/etc/passwd' %}",
    "{{ open('/etc/passwd').read() }}",
    "{{ __import__('os') }}",
    "{{ config }}",
    "{{ request }}",
]


@pytest.mark.parametrize("source", ESCAPES)
def test_no_way_out_of_the_sandbox(source: str) -> None:
    try:
        out = render_string(source, CONTEXT)
    except RenderError:
        return
    assert "root:" not in out and "uid=" not in out and "class" not in out, out


LIMITS = [
    "{{ 'x' * 10**9 }}",
    "{{ [0] * 10**8 }}",
    "{{ 9 ** 9999999 }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ 'x'|center(10**9) }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{{ '%999999999d' % 1 }}",
    "{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}",
]


@pytest.mark.parametrize("source", LIMITS)
def test_bounded_work(source: str) -> None:
    with pytest.raises(RenderError, match="template refused"):
        render_string(source, CONTEXT)


def test_argv_values_are_never_shell_interpreted(project: Project) -> None:
    project.write(
        """
        name: argv
        vars: {evil: "x; touch pwned; $(touch pwned2) `touch pwned3`"}
        steps:
          - name: as-argv
            run: {command: [echo, "{{ vars.evil }}"]}
          - name: quoted-shell
            run: "echo {{ vars.evil | quote }} > said.txt"
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    assert not any((project.path / n).exists() for n in ("pwned", "pwned2", "pwned3"))
    assert (project.path / "said.txt").read_text().strip() == "x; touch pwned; $(touch pwned2) `touch pwned3`"


def test_private_attributes_are_refused_at_load_time(project: Project) -> None:
    project.write('name: t\nsteps:\n  - name: a\n    run: "echo {{ vars.x.__class__ }}"\nvars: {x: 1}\n')
    result = project.run("validate")
    assert result.code == 2 and "pipeline.yaml:4" in result.err and "'__class__'" in result.err
