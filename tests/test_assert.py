"""assert: preflight checks fail fast with their own message, and pass quietly."""

from __future__ import annotations

import platform

from conftest import Project


def test_passing_checks_report_ok_not_changed(project: Project) -> None:
    (project.path / "src.py").write_text("TB2_WITHHOLD_TESTS = True\n")
    project.write(
        """
        steps:
          - name: pre
            assert:
              path: src.py
              file: src.py
              contains: TB2_WITHHOLD_TESTS
              kernel: "2.6"
              env: PATH
              that: "{{ 1 < 2 }}"
              command: "true"
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    assert "ok=1 changed=0" in result.out


def test_failing_check_shows_its_message_and_stops(project: Project) -> None:
    project.write(
        """
        steps:
          - name: kvm
            assert:
              path: /no/such/kvm
              message: "/dev/kvm is missing: enable virtualisation, or use a KVM host"
          - name: later
            run: {command: "echo 1 >> later.count"}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert "/dev/kvm is missing: enable virtualisation, or use a KVM host (/no/such/kvm does not exist)" in result.out
    assert project.count("later.count") == 0


def test_kernel_too_old(project: Project) -> None:
    project.write('steps:\n  - name: k\n    assert: {kernel: "999.1", message: "needs Linux >= 999.1"}\n')
    result = project.run("apply")
    assert result.code == 1
    assert f"kernel {platform.release()} is older than 999.1" in result.out


def test_file_contains_and_env_and_command(project: Project) -> None:
    (project.path / "src.py").write_text("old code\n")
    project.write(
        """
        steps:
          - name: c
            assert: {file: src.py, contains: TB2_WITHHOLD_TESTS}
        """
    )
    assert "does not contain 'TB2_WITHHOLD_TESTS'" in project.run("apply").out
    project.write("steps:\n  - name: e\n    assert: {env: [RUNNER_TEST_UNSET_VAR]}\n")
    assert "variable RUNNER_TEST_UNSET_VAR is not set" in project.run("apply").out
    project.write('steps:\n  - name: c\n    assert: {command: "exit 4"}\n')
    assert "`exit 4` exited with code 4" in project.run("apply").out


def test_check_sees_exported_env(project: Project) -> None:
    project.write(
        """
        steps:
          - name: settings
            env: {E2B_API_KEY: "abc"}
          - name: check
            assert: {env: E2B_API_KEY}
        """
    )
    assert project.run("apply").code == 0


def test_sysctl_minimums_are_read_from_proc_sys_and_shown_by_plan(project: Project) -> None:
    pid_max = int(open("/proc/sys/kernel/pid_max").read())
    project.write(
        f"""
        steps:
          - name: enough
            assert:
              sysctl: {{kernel.pid_max: {pid_max}}}
          - name: too_low
            needs: []
            assert:
              sysctl: {{kernel.pid_max: {pid_max + 1}, net.no_such.param: 1}}
              message: run AgentENV's scripts/docker-setup.sh
        """
    )
    plan = project.run("plan")
    assert plan.code == 2
    line = next(x for x in plan.out.splitlines() if "too_low" in x)
    assert line.startswith("x fail")
    assert f"kernel.pid_max is {pid_max}, below {pid_max + 1}" in line
    assert "net.no_such.param is not available here (/proc/sys/net/no_such/param is missing" in line
    applied = project.run("apply", "--keep-going")
    assert applied.code == 1 and f"kernel.pid_max is {pid_max}, below {pid_max + 1}" in applied.out
    assert "ok       enough" in applied.out

    project.write("steps:\n  - name: bad\n    assert: {sysctl: {'PID MAX': 3}}\n")
    refused = project.run("validate")
    assert refused.code == 2 and "pipeline.yaml:3" in refused.err and "is not a kernel parameter name" in refused.err


def test_ip_address_test_refuses_host_names(project: Project) -> None:
    project.write(
        """
        vars: {server: "10.0.0.5"}
        steps:
          - name: address
            assert:
              that: "{{ vars.server is ip_address }}"
              message: "server must be an IP address ('{{ vars.server }}')"
        """
    )
    assert project.run("plan").out.startswith("+ run")
    for given in ("aenv.internal", "10.0.0", ""):
        line = project.run("plan", "--var", f"server={given}").out.splitlines()[0]
        assert line.startswith("x fail") and f"server must be an IP address ('{given}')" in line, line
    assert project.run("plan", "--var", "server=::1").out.startswith("+ run")


def test_imports_are_looked_up_in_the_named_interpreter_and_plan_shows_a_missing_one(project: Project) -> None:
    import sys

    project.write(
        f"""
        vars: {{python: {sys.executable}}}
        steps:
          - name: runtime
            assert:
              python: "{{{{ vars.python }}}}"
              imports: [json, email.mime, no_such_module_r1, no_such_pkg_r2.sub]
              message: not a training environment
          - name: after
            run: "echo after >> after.count"
        """
    )
    plan = project.run("plan")
    assert plan.code == 2
    line = next(line for line in plan.out.splitlines() if "runtime" in line)
    assert line.startswith("x fail") and "not a training environment" in line, plan.out
    assert "does not find no_such_module_r1, no_such_pkg_r2.sub" in line and "json" not in line.split("find")[1]
    applied = project.run("apply", "--keep-going")
    assert applied.code == 1 and "does not find no_such_module_r1" in applied.out and project.count("after.count") == 0
    gone = project.run("plan", "--var", "python=/nonexistent/python3")
    assert "cannot run /nonexistent/python3" in gone.out, gone.out
    project.write(
        project.path.joinpath("pipeline.yaml").read_text().replace(", no_such_module_r1, no_such_pkg_r2.sub", "")
    )
    assert project.run("apply").code == 0 and project.count("after.count") == 1
