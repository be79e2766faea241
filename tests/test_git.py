"""The git kind against real git: local bare repos, file:// and git daemon on 127.0.0.1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import Project
from tests.gitrepos import CuttingProxy, GitDaemon, Upstream, git, isolated_git_config, random_blob


@pytest.fixture(autouse=True)
def _git_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(isolated_git_config(tmp_path)))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


@pytest.fixture
def upstream(tmp_path: Path) -> Upstream:
    up = Upstream(tmp_path / "remote")
    up.commit("README", "one\n")
    up.tag("v1")
    up.commit("README", "two\n")
    up.tag("v2")
    return up


def _pipeline(project: Project, url: str, ref: str | None = None, extra: str = "") -> None:
    lines = ["steps:", "  - name: src", "    git:", f"      url: {url}", "      dest: src"]
    if ref:
        lines.append(f'      ref: "{ref}"')  # quoted: an all-digit short SHA would read as a number
    lines += [x for x in extra.split("\n") if x.strip()]
    lines += ["  - name: show", '    run: "echo {{ steps.src.commit }} >> commits.txt"']
    (project.path / "pipeline.yaml").write_text("\n".join(lines) + "\n")


def _head(path: Path) -> str:
    return git("rev-parse", "HEAD", cwd=path)


def test_clone_noop_and_moved_pin(project: Project, upstream: Upstream) -> None:
    _pipeline(project, upstream.url, "v1")
    first = project.run("apply")
    assert first.code == 0, first.text
    v1 = git("rev-parse", "v1^{commit}", cwd=upstream.work)
    assert _head(project.path / "src") == v1
    assert (project.path / "src/README").read_text() == "one\n"
    assert not list(project.path.glob(".src.runner-clone-*"))

    again = project.run("apply")
    assert again.code == 0
    assert "ok       src" in again.out and "ok       show" in again.out
    assert project.count("commits.txt") == 1

    _pipeline(project, upstream.url, "v2")
    plan = project.run("plan")
    v2 = git("rev-parse", "v2^{commit}", cwd=upstream.work)
    assert plan.code == 2 and f"ref: v1@{v1[:7]} -> v2 ({v2[:7]})" in plan.out, plan.out
    moved = project.run("apply")
    assert moved.code == 0, moved.text
    v2 = git("rev-parse", "v2^{commit}", cwd=upstream.work)
    assert _head(project.path / "src") == v2
    assert (project.path / "commits.txt").read_text().split() == [v1, v2]  # the dependent re-ran once


def test_commit_pin_and_shallow_branch(project: Project, upstream: Upstream) -> None:
    first_commit = git("rev-list", "--max-parents=0", "HEAD", cwd=upstream.work)
    _pipeline(project, upstream.url, first_commit[:9])
    assert project.run("apply").code == 0
    assert _head(project.path / "src") == first_commit
    assert project.run("apply").out.count("ok ") == 2

    project2 = Project(project.path / "p2")
    project2.path.mkdir()
    _pipeline(project2, upstream.url, "main", extra="\n      depth: 1")
    result = project2.run("apply")
    assert result.code == 0, result.text
    assert git("rev-list", "--count", "HEAD", cwd=project2.path / "src") == "1"
    record = json.loads((project2.path / ".runner/state.json").read_text())["steps"]["src"]
    assert record["outputs"]["branch"] == "main"


def test_branch_follows_remote_only_with_update(project: Project, upstream: Upstream) -> None:
    _pipeline(project, upstream.url, "main")
    assert project.run("apply").code == 0
    old = _head(project.path / "src")
    new = upstream.commit("README", "three\n")
    assert project.run("apply").code == 0
    assert _head(project.path / "src") == old  # no update: pinned to what was cloned, no network

    _pipeline(project, upstream.url, "main", extra="\n      update: true")
    result = project.run("apply")
    assert result.code == 0, result.text
    assert _head(project.path / "src") == new
    assert git("rev-parse", "--abbrev-ref", "HEAD", cwd=project.path / "src") == "main"
    assert project.run("apply").out.count("ok ") == 2


def test_dirty_tree_refused_unless_force(project: Project, upstream: Upstream) -> None:
    _pipeline(project, upstream.url, "v1")
    assert project.run("apply").code == 0
    (project.path / "src/README").write_text("my local edit\n")
    (project.path / "src/build.egg-info").mkdir()  # untracked files alone are no reason to refuse
    _pipeline(project, upstream.url, "v2")
    refused = project.run("apply")
    assert refused.code == 1
    assert "local changes to tracked files (README)" in refused.out
    assert "git stash" in refused.out
    assert (project.path / "src/README").read_text() == "my local edit\n"

    _pipeline(project, upstream.url, "v2", extra="\n      force: true")
    forced = project.run("apply")
    assert forced.code == 0, forced.text
    assert (project.path / "src/README").read_text() == "two\n"


def test_dest_not_a_clone_and_wrong_origin(project: Project, upstream: Upstream, tmp_path: Path) -> None:
    (project.path / "src").mkdir()
    (project.path / "src/keep.txt").write_text("mine")
    _pipeline(project, upstream.url, "v1")
    result = project.run("apply")
    assert result.code == 1 and "exists and is not a git clone" in result.out
    assert (project.path / "src/keep.txt").read_text() == "mine"

    other = Upstream(tmp_path / "other", "other")
    other.commit("x", "x")
    (project.path / "src/keep.txt").unlink()
    (project.path / "src").rmdir()
    _pipeline(project, other.url)
    assert project.run("apply").code == 0
    _pipeline(project, upstream.url, "v1")
    wrong = project.run("apply")
    assert wrong.code == 1 and f"is a clone of {other.url}, not {upstream.url}" in wrong.out
    assert "runner apply --force src" in wrong.out
    # the explicit way to take it over (issue 18, item 2): --force repoints origin and checks out the ref
    forced = project.run("apply", "--force", "src")
    assert forced.code == 0, forced.text
    assert _head(project.path / "src") == git("rev-parse", "v1^{commit}", cwd=upstream.work)


def test_git_daemon_clone_and_cut_transfer(project: Project, tmp_path: Path) -> None:
    up = Upstream(tmp_path / "served", "big")
    up.commit("blob.bin", random_blob(3 * 1024 * 1024))
    daemon = GitDaemon(tmp_path / "served")
    try:
        _pipeline(project, daemon.url("big.git"), "main")
        ok = project.run("apply")
        assert ok.code == 0, ok.text
        assert _head(project.path / "src") == _head(up.work)

        # A remote that dies mid-transfer every time: retried, then git's message; nothing left in dest.
        proxy = CuttingProxy(daemon.port, cut_after=200_000)
        project3 = Project(tmp_path / "p3")
        project3.path.mkdir()
        _pipeline(project3, daemon.url("big.git", proxy.port), "main", extra="\n      attempts: 2")
        cut = project3.run("apply")
        assert cut.code == 1
        assert "attempt 1 of 2 failed" in cut.err
        assert "git clone failed" in cut.out and ("early EOF" in cut.out or "hung up" in cut.out), cut.out
        assert proxy.connections >= 2
        assert not (project3.path / "src").exists()
        assert not list(project3.path.glob(".src.runner-clone-*"))

        # Cut once, then whole: the retry succeeds.
        proxy2 = CuttingProxy(daemon.port, cut_after=200_000, cut_connections=1)
        recovered = project3.path / "p4"
        recovered.mkdir()
        project4 = Project(recovered)
        _pipeline(project4, daemon.url("big.git", proxy2.port), "main")
        again = project4.run("apply")
        assert again.code == 0, again.text
        assert "retrying" in again.err
        assert (recovered / "src/blob.bin").stat().st_size == 3 * 1024 * 1024
        proxy.close()
        proxy2.close()
    finally:
        daemon.stop()

    # The daemon is gone: connection refused, retried, then a clear error.
    project5 = Project(tmp_path / "p5")
    project5.path.mkdir()
    _pipeline(project5, daemon.url("big.git"), "main", extra="\n      attempts: 2")
    down = project5.run("apply")
    assert down.code == 1
    assert "git clone failed" in down.out and not (project5.path / "src").exists()


def test_clone_progress_reaches_the_event_stream(project: Project, upstream: Upstream) -> None:
    for i in range(30):
        upstream.commit(f"f{i}.bin", os.urandom(20_000))
    _pipeline(project, upstream.url, "main")
    result = project.run("apply", "--json")
    assert result.code == 0, result.text
    events = [json.loads(line) for line in result.out.splitlines()]
    progress = [e for e in events if e["event"] == "progress" and e["step"] == "src"]
    assert progress, "no progress events from the clone"
    assert all(0 <= e["done"] <= e["total"] for e in progress)
    assert {e["unit"] for e in progress} <= {"objects", "deltas", "files"}
    assert any(e["done"] == e["total"] for e in progress)
    log = next((project.path / ".runner" / "logs").glob("*/src.log")).read_text()
    assert "Receiving objects:  1%" not in log  # the overwritten updates stay out of the log


def test_a_clone_in_progress_by_another_apply_is_left_alone(project: Project, upstream: Upstream) -> None:
    """Two applies cloning into one dest (issue 18, item 4): the second used to delete the first's unfinished
    temporary clone (any `.DEST.runner-clone-*`, whatever its pid). Now a live process's temporary is left and
    the step says who is cloning; one whose process is gone is cleaned up."""
    import subprocess

    from steps._support.supervise import start_time

    other = subprocess.Popen(["sleep", "300"])
    try:
        theirs = project.path / f".src.runner-clone-{other.pid}-{start_time(other.pid)}"
        theirs.mkdir()
        (theirs / "half").write_text("in progress")
        _pipeline(project, upstream.url, "v2")
        busy = project.run("apply")
        assert busy.code == 1 and f"being cloned by another apply (pid {other.pid}" in busy.text, busy.text
        assert (theirs / "half").exists()
    finally:
        other.kill()
        other.wait()
    done = project.run("apply")  # its process is gone: the temporary is a leftover now
    assert done.code == 0, done.text
    assert not theirs.exists() and (project.path / "src" / "README").read_text() == "two\n"
