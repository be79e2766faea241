"""The step's `host:`, one spelling for every kind that works on a machine, in process (tests/harness.py): what
load and render accept and refuse, where the error points, and the older spelling inside the kind read as it.
Nothing here reaches a machine: tests/test_remote.py runs the steps there against a real sshd."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import Harness


@pytest.fixture
def runner(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_the_kinds_older_spelling_is_read_as_the_steps_host_and_validate_says_to_move_it(runner: Harness) -> None:
    runner.write(
        """
        name: spelling
        steps:
          - name: old
            run: {host: node1, command: "true"}
          - name: new
            host: node1
            run: {command: "true"}
        """
    )
    said = runner("validate")
    assert said.code == 0, said.err
    notes = [line for line in said.out.splitlines() if line.startswith("note:")]
    moved = "`run.host` is written on the step now (`host:` beside `name:`); this spelling still works"
    assert notes == [f"note: steps[0] (old): {moved}"]


@pytest.mark.parametrize(
    ("step", "line", "words"),
    [
        # a kind that works here only
        ('    env: {A: "1"}\n    host: node1', 5, "an env step works on this machine only, so it takes no `host`"),
        ("    host: node1\n    secret: {generate: 16}", 4, "a secret step works on this machine only"),
        # both spellings at once
        ('    host: node1\n    run: {host: node2, command: "true"}', 5, "`host` is given twice"),
        # the machine and an engine address
        (
            "    host: node1\n    docker: {host: tcp://10.0.0.9:2376, name: x, image: busybox}",
            4,
            "the step's `host` is the machine and `docker.host` that machine's Docker Engine address: give one",
        ),
        # not an ssh destination, on the step and in the older spelling
        ('    host: "a b"\n    run: {command: "true"}', 4, "'a b' is not an ssh destination"),
        ('    run:\n      command: "true"\n      host: "x;id"', 6, "'x;id' is not an ssh destination"),
        # what a kind cannot do on another machine, said at load
        ("    host: node1\n    git: {url: ./bundle.git, dest: d}", 5, "is a path beside the pipeline file"),
        (
            "    host: node1\n    pip: {venv: v, packages: [x], inherit_packages: true}",
            5,
            "`inherit_packages` is not available with `host` yet",
        ),
        (
            '    host: node1\n    launch: {command: "true", ray: {address: "http://127.0.0.1:8265"}}',
            5,
            "give `host` (run it there over ssh) or `ray`",
        ),
    ],
)
def test_a_host_where_it_cannot_be_is_bad_input_at_its_line(runner: Harness, step: str, line: int, words: str) -> None:
    runner.write(f"name: bad\nsteps:\n  - name: s\n{step}\n")
    said = runner("validate")
    assert said.code == 2, said.out + said.err
    assert words in said.err, said.err
    assert f"pipeline.yaml:{line}" in said.err, said.err
    assert "Traceback" not in said.err


def test_a_host_template_is_checked_once_rendered_and_empty_is_this_machine(runner: Harness) -> None:
    runner.write(
        """
        name: rendered
        vars: {where: "", bad: "a b"}
        steps:
          - name: here
            host: "{{ vars.where }}"
            run: {command: "echo ran > made", creates: [made]}
          - name: there
            needs: []
            host: "{{ vars.bad }}"
            run: {command: "true"}
        """
    )
    assert runner("validate").code == 0  # a template is not an ssh destination yet
    said = runner("apply", "--only", "here")
    assert said.code == 0, said.err
    assert (runner.path / "made").read_text() == "ran\n"  # empty: this machine
    said = runner("apply", "--only", "there")
    assert said.code == 2, said.out + said.err
    text = said.out + said.err
    assert "'a b' is not an ssh destination" in text and "(after rendering templates)" in text, text
    assert "pipeline.yaml:9" in text, text


def test_a_host_template_may_use_the_item_and_outputs_it_references_order_the_step(runner: Harness) -> None:
    runner.write(
        """
        name: refs
        steps:
          - name: pick
            needs: []
            run: {command: "echo node9"}
          - name: use
            needs: []
            host: "{{ steps.pick.stdout }}"
            run: {command: "true"}
        """
    )
    said = runner("graph")
    assert said.code == 0, said.err
    assert "pick" in said.out and "use" in said.out
    runner.write(
        """
        name: refs
        steps:
          - name: use
            host: "{{ item }}"
            run: {command: "true"}
        """
    )
    said = runner("validate")
    assert said.code == 2 and "`item` exists only in a step with `for_each`" in said.err, said.err
    assert "pipeline.yaml:4" in said.err, said.err
