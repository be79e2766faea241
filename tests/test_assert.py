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
