"""Bad input exits 2 with file:line:col, the field and what was expected — never a traceback."""

from __future__ import annotations

import pytest
from conftest import Project

from tests.harness import Harness

# (id, pipeline text, line, column or None, text the message must contain)
CASES = [
    ("yaml-syntax", "steps: [\n", 2, None, "YAML syntax error"),
    (
        "yaml-unclosed-quote",
        'steps:\n  - name: "a\n    run: x\n',
        4,
        1,
        "(while scanning a quoted scalar that starts at line 2, column 11)",
    ),
    ("yaml-tab", "steps:\n\t- name: a\n", 2, None, "YAML syntax error"),
    ("top-level-list", "- name: a\n", 1, 1, "top level must be a mapping"),
    ("top-level-scalar", "hello\n", 1, 1, "top level must be a mapping"),
    ("empty-file", "", 1, None, "the file is empty"),
    ("no-steps-key", "name: x\n", 1, 1, "no `steps:`"),
    ("empty-steps", "steps: []\n", 1, 8, "no steps"),
    ("steps-not-list", "steps: {a: 1}\n", 1, 8, "expected a list of steps"),
    ("unknown-top-key", "name: x\nstepz: []\n", 2, 1, "did you mean 'steps'?"),
    ("step-not-mapping", "steps:\n  - just a string\n", 2, 5, "a step must be a mapping"),
    ("unknown-kind", "steps:\n  - name: a\n    shell: {command: x}\n", 3, 5, "unknown key 'shell'"),
    ("no-kind", "steps:\n  - name: a\n", 2, 5, "no step kind"),
    (
        "two-kinds",
        "steps:\n  - name: a\n    run: {command: x}\n    env: {A: b}\n",
        4,
        5,
        "two kinds in one step (run and env)",
    ),
    ("missing-name", "steps:\n  - run: {command: x}\n", 2, 5, "name: this required field is missing"),
    ("missing-command", "steps:\n  - name: a\n    run: {cwd: x}\n", 3, 10, "command: this required field is missing"),
    ("wrong-type-command", "steps:\n  - name: a\n    run: {command: 5}\n", 3, 20, "expected a string or a list"),
    ("typo-command", "steps:\n  - name: a\n    run:\n      comand: x\n", 4, 7, "did you mean 'command'?"),
    ("typo-common", "steps:\n  - name: a\n    neds: [b]\n    run: {command: x}\n", 3, 5, "did you mean 'needs'?"),
    (
        "duplicate-name",
        "steps:\n  - name: a\n    run: {command: x}\n  - name: a\n    run: {command: y}\n",
        4,
        11,
        "duplicate step name 'a'",
    ),
    ("unknown-need", "steps:\n  - name: a\n    needs: [zz]\n    run: {command: x}\n", 3, 13, "unknown step 'zz'"),
    ("self-need", "steps:\n  - name: a\n    needs: [a]\n    run: {command: x}\n", 3, 13, "cannot need itself"),
    (
        "cycle",
        "steps:\n  - name: a\n    needs: [b]\n    run: {command: x}\n"
        "  - name: b\n    needs: [a]\n    run: {command: y}\n",
        None,
        None,
        "dependency cycle: ",
    ),
    ("undefined-var", 'steps:\n  - name: a\n    run: {command: "{{ vars.nope }}"}\n', 3, 20, "vars.nope"),
    ("undefined-name", 'steps:\n  - name: a\n    run: {command: "{{ foo }}"}\n', 3, 20, "'foo'"),
    ("unknown-step-ref", 'steps:\n  - name: a\n    run: {command: "{{ steps.zz.x }}"}\n', 3, 20, "unknown step 'zz'"),
    ("template-syntax", 'steps:\n  - name: a\n    run: {command: "{{ vars.x "}\n', 3, 20, "template syntax error"),
    ("when-undefined", 'steps:\n  - name: a\n    when: "vars.nope"\n    run: {command: x}\n', 3, 11, "vars.nope"),
    ("negative-retries", "steps:\n  - name: a\n    retries: -1\n    run: {command: x}\n", 3, 14, "retries"),
    ("negative-timeout", "steps:\n  - name: a\n    timeout: -5\n    run: {command: x}\n", 3, 14, "timeout"),
    ("timeout-string", "steps:\n  - name: a\n    timeout: fast\n    run: {command: x}\n", 3, 14, "expected a number"),
    ("bad-name", 'steps:\n  - name: "bad name"\n    run: {command: x}\n', 2, 11, "not a valid name"),
    ("empty-command", 'steps:\n  - name: a\n    run: {command: ""}\n', 3, 20, "the command is empty"),
    ("creates-not-list", "steps:\n  - name: a\n    run: {command: x, creates: 5}\n", 3, 32, "expected a list"),
    ("env-bad-name", 'steps:\n  - name: a\n    env: {"1x": a}\n', 3, 10, "not a valid variable name"),
    ("env-not-mapping", "steps:\n  - name: a\n    env: [a]\n", 3, 10, "expected a mapping"),
    ("assert-empty", "steps:\n  - name: a\n    assert: {}\n", 3, 13, "give at least one check"),
    ("assert-bad-kernel", 'steps:\n  - name: a\n    assert: {kernel: "six"}\n', 3, 22, "not a version"),
    ("assert-file-alone", "steps:\n  - name: a\n    assert: {file: x}\n", 3, 13, "go together"),
    ("duplicate-key", "steps:\n  - name: a\n    name: b\n    run: {command: x}\n", 3, 5, "duplicate key 'name'"),
    (
        "duplicate-beside-a-merge",
        "x-c: &c {retries: 1}\nsteps:\n  - name: a\n    <<: *c\n    name: b\n    run: {command: x}\n",
        5,
        5,
        "duplicate key 'name'",
    ),
    (
        "python-tag",
        'steps:\n  - name: a\n    run: !!python/object/apply:os.system ["echo x"]\n',
        3,
        10,
        "YAML tag '!!python/object/apply:os.system' is not allowed",
    ),
    ("custom-tag", "steps:\n  - name: a\n    run: {command: !custom x}\n", 3, 20, "YAML tag '!custom' is not allowed"),
    (
        "assert-bad-import",
        'steps:\n  - name: a\n    assert: {imports: ["not a module"]}\n',
        3,
        13,
        "imports: 'not a module' is not a module name",
    ),
    ("secret-not-a-var", "secrets: [key]\nsteps:\n  - name: a\n    run: {command: x}\n", 1, 10, "'key' is not a var"),
    ("vars-not-mapping", "vars: [1]\nsteps:\n  - name: a\n    run: {command: x}\n", 1, 7, "expected a mapping"),
]


@pytest.mark.parametrize(("text", "line", "column", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_line_and_field(
    project: Project, text: str, line: int | None, column: int | None, expected: str
) -> None:
    """In process (tests/harness.py: the real CLI's main, its exit code and its words); the CLI as a program is
    run on one case below."""
    project.write(text)
    runner = Harness(project.path)
    for command in ("validate", "apply", "plan"):
        result = runner(command)
        assert result.code == 2, (command, result.out, result.err)
        assert "Traceback" not in result.out + result.err
        message = result.err
        assert expected in message, message
        if line is not None:
            where = f"pipeline.yaml:{line}:" + (f"{column}:" if column is not None else "")
            assert where in message, message


def test_the_program_exits_2_on_bad_input_as_main_does(project: Project) -> None:
    project.write("steps:\n  - name: a\n    run:\n      comand: x\n")
    result = project.run("plan")
    assert result.code == 2 and "pipeline.yaml:4:7:" in result.err and "did you mean 'command'?" in result.err
    assert "Traceback" not in result.text


def test_missing_file_says_where_it_looked(project: Project) -> None:
    result = project.run("apply", "-f", "missing.yaml")
    assert result.code == 2
    assert str(project.path / "missing.yaml") in result.err


def test_malformed_var_is_a_usage_error(project: Project) -> None:
    project.write("steps:\n  - name: a\n    run: {command: x}\n")
    result = project.run("apply", "--var", "novalue")
    assert result.code == 2 and "expected NAME=VALUE" in result.err


def test_non_utf8_names_the_line(project: Project) -> None:
    (project.path / "pipeline.yaml").write_bytes(b"steps:\n  - name: a\n    run: {command: \xff}\n")
    result = project.run("validate")
    assert result.code == 2
    assert "pipeline.yaml:3:20: not valid UTF-8" in result.err


def test_alias_bomb_is_refused(project: Project) -> None:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 9):
        prev = chr(ord("a") + i - 1)
        cur = chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 10) + "]")
    lines.append("steps:\n  - name: s\n    run: {command: x}")
    project.write(
        "vars:\n"
        + "\n".join("  " + x if not x.startswith("steps") else x for x in lines[:-1])
        + "\n"
        + lines[-1]
        + "\n"
    )
    result = project.run("validate", timeout=30)
    assert result.code == 2, result.text
    assert "YAML aliases expand the document by more than" in result.err


def test_undefined_output_at_run_time_names_step_and_field(project: Project) -> None:
    """An env step's outputs are the variables exported so far, so only a run knows them; a kind with fixed
    outputs is checked at load time (tests/test_first_hour.py)."""
    project.write(
        """
        steps:
          - name: a
            env: {X: "1"}
          - name: b
            run: {command: "echo {{ steps.a.nothing }}"}
        """
    )
    result = project.run("apply")
    assert result.code == 2, result.text
    assert "pipeline.yaml:5:20: steps[1] (b).run.command" in result.out
    assert "step 'a' has no output 'nothing' (its outputs: X" in result.out
    assert "Traceback" not in result.text


def test_a_plain_file_of_20000_steps_is_not_taken_for_an_alias_bomb(project: Project) -> None:
    """The alias guard counts what aliases add, not a plain file's size (issue 18, item 1): 20,000 steps (about
    100,000 values) used to be refused with "the document expands to more than 100000 values"."""
    lines = ["name: big", "steps:"]
    for i in range(20_000):
        lines += [f"  - name: s{i}", '    run: {command: ["true"]}']
    project.write("\n".join(lines) + "\n")
    result = project.run("validate", timeout=120)
    assert result.code == 0 and "(20000 steps)" in result.out, result.text


def test_a_nul_byte_in_a_command_is_bad_input(project: Project) -> None:
    """YAML's "\\0" in a double-quoted string is a NUL, which no program can be given: it used to reach the
    process start as `internal error: ValueError: embedded null byte`."""
    project.write(
        r"""
        name: nul
        steps:
          - name: a
            run: {command: [echo, "a\0b"]}
        """
    )
    for command in ("validate", "plan", "apply"):
        result = project.run(command)
        assert result.code == 2, result.text
        assert "pipeline.yaml:4:" in result.err and "run.command" in result.err, result.err
        assert "internal error" not in result.text and "holds a NUL byte" in result.err
