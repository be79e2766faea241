"""The walk in process (tests/harness.py): plan and apply decide every step by the same rules and say it in the
same words; blocking, `when` upstream, for_each, held restarts, stopped services and the executor's deadline,
with fake kinds whose system is a dict. No subprocess."""

from __future__ import annotations

import time

import pytest

from tests.harness import WORLD, Harness

# what apply's status may be for each plan action: plan and apply agree
AGREES = {
    "run": {"changed", "ok"},
    "ok": {"ok"},
    "skip": {"skipped"},
    "fail": {"failed"},
    "block": {"blocked"},
    "pending": {"pending"},
    "maybe": {"ok", "changed"},
}


def plan_then_apply(runner: Harness, *apply_args: str) -> tuple[dict[str, str], dict[str, dict[str, object]], int, int]:
    plan = runner("plan")
    planned = plan.planned()
    applied = runner("apply", "--json", *apply_args)
    finished = applied.finished()
    for name, line in planned.items():
        action = line.split(" ", 1)[0]
        if action == "maybe":
            continue
        assert name in finished, (name, plan.out, applied.out)
        assert finished[name]["status"] in AGREES[action], (name, line, finished[name])
    return planned, finished, plan.code, applied.code


def test_a_step_skipped_by_when_upstream_lets_plan_settle(runner: Harness) -> None:
    """The flagship's host_setup -> ublk shape: once apply ran, plan says nothing to do (it said `upstream
    changed: host_setup` forever, while apply ran nothing)."""
    runner.write(
        """
        name: t
        steps:
          - name: host_setup
            when: false
            fake: {}
          - name: check
            needs: [host_setup]
            fake: {}
        """
    )
    assert runner("apply").code == 0
    plan = runner("plan")
    assert plan.planned() == {"host_setup": "skip `when` is false: False", "check": "ok up to date"}, plan.out
    assert plan.code == 0 and "plan: nothing to do" in plan.out
    assert WORLD.runs == ["check"]
    assert runner("apply").code == 0 and WORLD.runs == ["check"]


def test_a_stopped_service_blocks_what_depends_on_it_in_plan_and_apply_alike(runner: Harness) -> None:
    runner.write(
        """
        name: t
        steps:
          - name: sandbox_server
            fake: {}
          - name: rollout
            needs: [sandbox_server]
            fake: {value: "{{ steps.sandbox_server.value }}-1"}
          - name: report
            needs: [rollout]
            fake: {}
        """
    )
    assert runner("apply").code == 0
    WORLD.stopped.add("sandbox_server")
    del WORLD.made["rollout"]  # rollout would run again: it is blocked by the stopped server
    planned, finished, plan_code, apply_code = plan_then_apply(runner)
    held = "sandbox_server is stopped (`runner stop`; `apply --force sandbox_server` relaunches it)"
    assert planned["rollout"] == f"block blocked: {held}"
    assert planned["report"] == f"block blocked: {held} (via rollout)", planned
    assert finished["rollout"]["reason"] == f"blocked: {held}"
    assert finished["report"]["reason"] == f"blocked: {held} (via rollout)"
    assert finished["rollout"]["cause"]["kind"] == "held"
    assert plan_code == 2 and apply_code == 1
    plan = runner("plan")
    assert "plan: nothing to do" not in plan.out and "blocked: rollout, report" in plan.out, plan.out
    assert WORLD.runs == ["sandbox_server", "rollout", "report"]  # nothing ran the second time


def test_a_failure_blocks_downstream_with_the_same_words_but_its_tense(runner: Harness) -> None:
    runner.write(
        """
        name: t
        steps:
          - name: broken
            fake: {fail: true, preview_fails: "no KVM"}
          - name: after
            needs: [broken]
            fake: {}
          - name: later
            fake: {}
          - name: free
            needs: []
            fake: {}
        """
    )
    planned, finished, plan_code, apply_code = plan_then_apply(runner, "--keep-going")
    assert planned["broken"] == "fail would fail: no KVM"
    assert planned["after"] == "block blocked: broken would fail"
    assert planned["later"] == "block blocked: broken would fail (via after)"
    assert finished["after"]["reason"] == "blocked: broken failed"
    assert finished["later"]["reason"] == "blocked: broken failed (via after)"
    assert finished["after"]["cause"] == {
        "kind": "waits_on",
        "roots": ["broken"],
        "via": [],
        "holds": {},
        "happened": True,
    }
    assert planned["free"].startswith("run ") and finished["free"]["status"] == "changed"
    assert (plan_code, apply_code) == (2, 1)


def test_maybe_after_a_changed_upstream_then_exactly_what_moved_reruns(runner: Harness) -> None:
    runner.write(
        """
        name: t
        vars: {v: "1"}
        steps:
          - name: clone
            fake: {value: "{{ vars.v }}"}
          - name: install
            needs: [clone]
            fake: {value: "{{ steps.clone.value }}"}
          - name: unrelated
            needs: []
            fake: {}
        """
    )
    assert runner("apply").code == 0
    plan = runner("plan", "--var", "v=2")
    assert plan.planned()["clone"].startswith("run spec changed: value: '1' -> '2'") or plan.planned()[
        "clone"
    ].startswith('run spec changed: value: "1" -> "2"'), plan.out
    assert plan.planned()["install"] == "maybe after clone runs (re-runs if their outputs change)"
    assert plan.planned()["unrelated"] == "ok up to date"
    WORLD.runs.clear()
    assert runner("apply", "--var", "v=2").code == 0
    assert WORLD.runs == ["clone", "install"]
    assert runner("plan", "--var", "v=2").code == 0


def test_json_plan_carries_the_cause_and_each_change_once(runner: Harness) -> None:
    runner.write(
        """
        name: t
        vars: {v: "1"}
        steps:
          - name: one
            fake: {value: "{{ vars.v }}"}
        """
    )
    assert runner("apply").code == 0
    planned = runner("plan", "--json", "--var", "v=2").events("planned")
    assert planned == [
        {
            "event": "planned",
            "time": planned[0]["time"],
            "step": "one",
            "action": "run",
            "reason": "spec changed: value",
            "cause": {"kind": "spec_changed", "fields": ["value"]},
            "changes": [{"field": "value", "old": '"1"', "new": '"2"'}],
        }
    ]
    explained = runner("explain", "one", "--var", "v=2")
    assert "decision: run - spec changed: value\n" in explained.out and '    value: "1" -> "2"' in explained.out


def test_for_each_items_decided_alike_and_a_held_restart(runner: Harness) -> None:
    runner.write(
        """
        name: t
        vars: {items: "a,b"}
        steps:
          - name: prep
            for_each: "{{ vars.items }}"
            fake: {value: "{{ item }}"}
          - name: serve
            needs: [prep]
            fake: {value: "{{ steps.prep.count }}"}
          - name: use
            needs: [serve]
            fake: {}
        """
    )
    assert runner("apply").code == 0
    WORLD.live.add("serve")
    planned, finished, plan_code, _ = plan_then_apply(runner)  # nothing moved: all ok
    assert plan_code == 0 and set(planned.values()) <= {"ok up to date", "ok 2 items up to date"}
    WORLD.runs.clear()
    plan = runner("plan", "--var", "items=a,b,c")
    assert plan.planned()["prep"] == "run 1 of 3 items to run: c (no record yet)", plan.out
    assert plan.planned()["serve"].startswith("maybe after prep runs"), plan.out
    applied = runner("apply", "--json", "--var", "items=a,b,c")
    done = applied.finished()
    assert WORLD.runs == ["prep[c]"]
    assert done["serve"]["status"] == "pending"
    assert done["serve"]["reason"] == (
        'restart pending (spec changed: value: "2" -> "3"); serve serves; `apply --force serve` restarts it'
    )
    assert done["use"]["status"] == "ok"  # up to date: nothing of it would run
    again = runner("plan", "--var", "items=a,b,c")
    assert again.planned()["serve"].startswith("pending restart pending"), again.out
    WORLD.runs.clear()
    assert runner("apply", "--force", "serve", "--var", "items=a,b,c").code == 0
    assert WORLD.runs == ["serve", "use"]  # serve's outputs moved: what reads them runs again


def test_a_step_timeout_ends_a_kind_that_never_checks_it(runner: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor owns the deadline: a kind deaf to ctx.timeout and ctx.cancel still stops at `timeout:`."""
    from runner.engine import deadline

    # the graces a deaf kind is given are the same code path however long they are: short ones keep this quick
    monkeypatch.setattr(deadline, "CANCEL_GRACE", 0.3)
    monkeypatch.setattr(deadline, "KILL_WAIT", 0.3)
    runner.write(
        """
        name: t
        steps:
          - name: deaf
            timeout: 1
            fake: {hang: 30}
          - name: after
            fake: {}
        """
    )
    began = time.monotonic()
    applied = runner("apply", "--json", "--keep-going")
    took = time.monotonic() - began
    done = applied.finished()
    assert done["deaf"]["status"] == "failed" and "timed out after 1s" in done["deaf"]["error"], done
    assert took < 10, took
    assert done["after"]["reason"] == "blocked: deaf failed"
    plan = runner("plan")
    assert plan.planned()["deaf"].startswith("run failed last time: timed out after 1s"), plan.out
