"""for_each: one record per item; resume at the first unfinished item; a changed item re-runs alone."""

from __future__ import annotations

import json

from conftest import Project

LOOP = """
name: loop
vars: {tasks: [alpha, beta, gamma, delta]}
steps:
  - name: bake
    for_each: "{{ vars.tasks }}"
    run:
      command: >-
        echo {{ item }} >> ran.txt && (test {{ item }} != gamma || test -f fixed)
        && echo {{ item_index }} > {{ item }}.out
      creates: ["{{ item }}.out"]
  - name: report
    run: "echo {{ steps.bake.count }} {{ steps.bake['keys'] | join(',') }} > report.txt"
"""


def ran(project: Project) -> list[str]:
    path = project.path / "ran.txt"
    return path.read_text().split() if path.exists() else []


def test_an_interrupted_loop_resumes_at_the_first_unfinished_item(project: Project) -> None:
    project.write(LOOP)
    failed = project.run("apply")
    assert failed.code == 1
    assert "FAILED   bake[gamma]" in failed.out and "blocked" in failed.out
    assert ran(project) == ["alpha", "beta", "gamma"]

    (project.path / "fixed").touch()
    plan = project.run("plan")
    assert "1 of 4 items to run: gamma (failed last time" not in plan.out  # delta has no record either
    assert "2 of 4 items to run: gamma (failed last time" in plan.out, plan.out
    resumed = project.run("apply")
    assert resumed.code == 0, resumed.text
    assert ran(project) == ["alpha", "beta", "gamma", "gamma", "delta"]  # alpha and beta did not run again
    assert (project.path / "report.txt").read_text().strip() == "4 alpha,beta,gamma,delta"

    again = project.run("apply")
    assert again.code == 0 and "4 items up to date" in again.out and "changed=0" in again.out


def test_a_changed_item_reruns_alone_and_a_dropped_item_loses_its_record(project: Project) -> None:
    project.write(LOOP)
    (project.path / "fixed").touch()
    assert project.run("apply").code == 0
    (project.path / "beta.out").unlink()  # the probe of one item fails
    result = project.run("apply", "--var", "tasks=alpha,beta,gamma,epsilon")
    assert result.code == 0, result.text
    assert ran(project)[4:] == ["beta", "epsilon"]
    assert "2 of 4 items ran" in result.out
    assert (project.path / "report.txt").read_text().strip() == "4 alpha,beta,gamma,epsilon"
    state = json.loads((project.path / ".runner" / "state.json").read_text())
    assert "bake[delta]" not in state["steps"] and "bake[epsilon]" in state["steps"]
    assert state["steps"]["bake"]["for_each"] == ["alpha", "beta", "gamma", "epsilon"]


def test_items_that_are_not_words_get_readable_keys(project: Project) -> None:
    project.write(
        """
        name: keys
        steps:
          - name: each
            for_each: [{task: one, n: 1}, "two words", 3]
            run: "echo '{{ item }}' >> ran.txt"
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    state = json.loads((project.path / ".runner" / "state.json").read_text())
    keys = state["steps"]["each"]["for_each"]
    assert keys[1].startswith("two-words-") and keys[2] == "3" and keys[0].startswith("item-")


def test_for_each_errors_name_the_field(project: Project) -> None:
    project.write(
        """
        name: bad
        steps:
          - name: plain
            run: "echo {{ item }}"
        """
    )
    result = project.run("validate")
    assert result.code == 2 and "pipeline.yaml:4" in result.err and "only in a step with `for_each`" in result.err

    project.write(
        """
        name: bad
        steps:
          - name: settings
            for_each: [a, b]
            env: {X: "{{ item }}"}
        """
    )
    result = project.run("validate")
    assert result.code == 2 and "pipeline.yaml:4" in result.err and "cannot have for_each" in result.err

    project.write(
        """
        name: bad
        vars: {n: 3}
        steps:
          - name: each
            for_each: "{{ vars.n }}"
            run: "echo {{ item }}"
        """
    )
    result = project.run("apply")
    assert result.code == 2 and "for_each must give a list, not int" in result.text
    assert "pipeline.yaml:5:" in result.text and "steps[0] (each).for_each" in result.text
    assert "Traceback" not in result.text


def test_vars_and_env_named_like_dict_methods_are_the_data(project: Project) -> None:
    """`vars.items` is the var called items, not dict.items (issue 14, item 9); the same for env and outputs."""
    project.write(
        """
        vars: {items: [a, b], keys: "k1", get: got}
        steps:
          - name: each
            for_each: "{{ vars.items }}"
            run: {command: "echo {{ item }}-{{ vars.keys }}-{{ vars.get }}-{{ env.values }} >> out.txt"}
        """
    )
    env = project.env()
    env["values"] = "v"
    project.env = lambda: env  # type: ignore[method-assign]
    result = project.run("apply")
    assert result.code == 0, result.text
    assert (project.path / "out.txt").read_text().split() == ["a-k1-got-v", "b-k1-got-v"]
