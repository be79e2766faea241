"""git: a clone at a pinned ref.

Example::

    - name: openenv
      needs: []                      # independent: `-j 3` clones it beside the others
      git:
        url: https://github.com/meta-pytorch/OpenEnv.git
        dest: OpenEnv
        ref: 04d259ea6              # a branch, a tag or a commit
        depth: 1

A fresh clone goes into a temporary sibling and is renamed into place, so a crash never leaves a half clone
that counts as done. The probe reads `.git` in-process (no git process, no network): the origin URL matches,
HEAD is the recorded commit of the ref. A branch follows its remote only with `update: true` (then each apply
asks the remote). A working tree with changes to tracked files is never checked out over unless
`force: true`. Network failures are retried with backoff, then reported with git's own message.
Outputs: `commit`, `path`, `branch` (empty when detached). With the step's `host:` the clone is made there, by
that machine's git: `dest` is a path there (relative: from the login directory) and `url` one it reaches.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from steps._support import faults
from steps._support.gitdir import NETWORK_ERRORS, git_dir, head, origin_url, same_url
from steps._support.process import run_process
from steps._support.supervise import start_time
from steps.base import Change, Probe, SpecModel, StepContext, StepError, StepKind, machine_named

HEX = re.compile(r"^[0-9a-f]{7,40}$")


class GitSpec(SpecModel):
    url: str = Field(
        min_length=1,
        description="The repository to clone (https://, ssh, file://, a path or a bundle; ./ and ../ are relative "
        "to the pipeline file).",
    )
    dest: str = Field(min_length=1, description="Where the clone goes, relative to the pipeline file.")
    ref: str | None = Field(None, min_length=1, description="Branch, tag or commit (default: the remote's HEAD).")
    depth: int | None = Field(None, ge=1, description="Shallow clone with this many commits (`--depth`).")
    submodules: bool = Field(False, description="Also check out submodules, recursively.")
    update: bool = Field(False, description="A branch follows its remote on every apply (asks the remote each time).")
    force: bool = Field(False, description="Check out over local changes to tracked files, and fix a wrong origin.")
    attempts: int = Field(3, ge=1, le=10, description="Tries for each network operation, with backoff between.")

    @model_validator(mode="after")
    def _url_there(self, info: ValidationInfo) -> GitSpec:
        if machine_named(info) and self.url.startswith(("./", "../")):
            raise ValueError(
                f"url {self.url!r} is a path beside the pipeline file, on this machine: with `host`, give a url "
                "that machine reaches (https://, ssh, or a path there)"
            )
        return self


class GitNetworkError(StepError):
    """A git failure that looks like the network: retried."""


def _is_network(exc: BaseException) -> bool:
    return isinstance(exc, GitNetworkError)


class GitStep(StepKind[GitSpec]):
    local_probe = True
    on_machine = True  # with the step's `host:`, cloned there by that machine's git: `dest` and `url` as it sees them
    kind = "git"
    Spec = GitSpec
    outputs = frozenset({"commit", "path", "branch", "host"})
    cosmetic_fields = frozenset({"attempts"})

    # ---- probe: file reads only --------------------------------------------------------------------------

    def away(self, ctx: StepContext) -> Any:
        """The clone on another machine (the step's `host`), or None."""
        if not ctx.host:
            return None
        from steps._support.remote_git import RemoteGit

        return RemoteGit(self, ctx.host)

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[Change]) -> list[Change]:
        spec = self.spec
        if ctx.host:
            return changes
        old_ref = old_spec.get("ref")
        if old_ref == spec.ref:
            return changes
        was = str(ctx.record_outputs.get("commit") or "")[:7]
        new = ""
        gitdir = git_dir(ctx.resolve(spec.dest))
        if gitdir is not None and spec.ref:
            found = _rev(ctx.resolve(spec.dest), f"{spec.ref}^{{commit}}", ctx.env) or _rev(
                ctx.resolve(spec.dest), f"origin/{spec.ref}^{{commit}}", ctx.env
            )
            new = f" ({found[:7]})" if found else " (not in the clone yet: fetched on apply)"
        ref = Change("ref", f"{old_ref or 'HEAD'}" + (f"@{was}" if was else ""), f"{spec.ref or 'HEAD'}{new}")
        return [ref if c.field == "ref" else c for c in changes]

    def _url(self, ctx: StepContext) -> str:
        """A url that starts with ./ or ../ is a path relative to the pipeline file (a bundle shipped beside it)."""
        url = self.spec.url
        return os.fspath(ctx.resolve(url)) if url.startswith(("./", "../")) else url

    def probe(self, ctx: StepContext) -> Probe:
        if self.away(ctx):
            return self.away(ctx).probe(ctx)
        spec = self.spec
        dest = ctx.resolve(spec.dest)
        gitdir = git_dir(dest)
        if gitdir is None:
            return Probe.missing(f"{spec.dest} is not a clone yet")
        url = origin_url(gitdir)
        if not same_url(url, self._url(ctx)):
            return Probe.drift(
                f"origin of {spec.dest} is {url}, not {self._url(ctx)}", (Change("url", url, self._url(ctx)),)
            )
        commit, branch = head(gitdir)
        recorded = str(ctx.record_outputs.get("commit", ""))
        if not commit:
            return Probe.missing(f"{spec.dest} has no HEAD commit")
        if spec.ref and HEX.match(spec.ref.lower()):
            if not commit.startswith(spec.ref.lower()):
                return Probe.drift(f"HEAD is {commit[:12]}, not {spec.ref}", (Change("ref", commit[:12], spec.ref),))
            return Probe.ok()
        if commit != recorded:
            return Probe.drift(
                f"HEAD moved to {commit[:12]} (recorded {recorded[:12] or 'none'})",
                (Change("commit", recorded[:12], commit[:12]),),
            )
        if spec.update:
            wanted = spec.ref or ctx.record_outputs.get("branch") or "HEAD"
            remote = self._remote_head(ctx, str(wanted))
            if remote and remote != commit:
                change = Change("commit", commit[:12], remote[:12])
                return Probe.drift(f"origin/{wanted} moved: {commit[:12]} -> {remote[:12]}", (change,))
        return Probe.ok(f"at {commit[:12]}" + (f" ({branch})" if branch else ""))

    def _remote_head(self, ctx: StepContext, ref: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "ls-remote", self._url(ctx), ref if ref == "HEAD" else f"refs/heads/{ref}"],
                capture_output=True,
                text=True,
                timeout=ctx.timeout or 60,
                env=_git_env(ctx.env),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepError(f"git ls-remote {self._url(ctx)} failed: {exc}") from None
        if proc.returncode != 0:
            raise StepError(f"git ls-remote {self._url(ctx)} failed: {proc.stderr.strip()[-300:]}")
        line = proc.stdout.strip().splitlines()
        return line[0].split()[0] if line else None

    # ---- apply ----------------------------------------------------------------------------------------

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        """With --purge: the clone, if it is a clone of this step's url (a directory of someone else's stays)."""
        if not purge:
            return None
        if self.away(ctx):
            return self.away(ctx).teardown(ctx, dry_run)
        dest = ctx.resolve(self.spec.dest)
        gitdir = git_dir(dest) if dest.is_dir() and not dest.is_symlink() else None
        if gitdir is None:
            return None
        if not same_url(origin_url(gitdir), self._url(ctx)):
            return f"left {dest}: a clone of {origin_url(gitdir)}, not of this step's url"
        if dry_run:
            return f"would remove the clone {dest}"
        shutil.rmtree(dest)
        return f"removed the clone {dest}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        if self.away(ctx):
            return self.away(ctx).apply(ctx)
        spec = self.spec
        dest = ctx.resolve(spec.dest)
        if dest.exists() and not (dest.is_dir() and not any(dest.iterdir())):
            if git_dir(dest) is None:
                raise StepError(
                    f"{dest} exists and is not a git clone",
                    hint="move it away or choose another `dest`; runner never deletes a directory it did not make",
                )
            ctx.changed = self._converge_existing(ctx, dest)
        else:
            self._clone_fresh(ctx, dest)
        gitdir = git_dir(dest)
        assert gitdir is not None
        commit, branch = head(gitdir)
        return {"commit": commit or "", "path": os.fspath(dest), "branch": branch or ""}

    def _git(self, ctx: StepContext, args: list[str], cwd: Path, network: bool = False) -> str:
        argv = ["git", "-c", "advice.detachedHead=false", *args]
        ctx.on_output("$ " + " ".join(args))
        result = run_process(argv, ctx, cwd=cwd, env=_git_env(ctx.env), on_transient=lambda t: _progress(ctx, t))
        if result.returncode != 0:
            text = "\n".join(result.tail).strip()
            message = f"git {args[0]} failed (exit {result.returncode}): {_last_error(text)}"
            if network and any(marker in text.lower() for marker in NETWORK_ERRORS):
                raise GitNetworkError(message, output_tail=text)
            raise StepError(message, output_tail=text)
        return result.stdout

    def _with_retries(self, ctx: StepContext, what: str, action: Any) -> None:
        spec = self.spec

        def before_retry(attempt: int, exc: BaseException | None) -> None:
            ctx.notice(
                f"{ctx.name}: {what} attempt {attempt} of {spec.attempts} failed "
                f"({getattr(exc, 'message', exc)}); retrying"
            )

        from tenacity import retry_if_exception, wait_exponential  # only to clone

        from steps._support.retry import retrying

        tries = retrying(
            attempts=spec.attempts,
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception(_is_network),
            cancel=ctx.cancel,
            interrupted=lambda: StepError("interrupted"),
            before_retry=before_retry,
        )
        for attempt in tries:
            with attempt:
                action()

    def _clone_fresh(self, ctx: StepContext, dest: Path) -> None:
        spec = self.spec
        dest.parent.mkdir(parents=True, exist_ok=True)
        for other in dest.parent.glob(f".{dest.name}.runner-clone-*"):
            owner = _clone_owner(other.name.rsplit(".runner-clone-", 1)[1])
            if owner is None:  # left by a run that died: only a dead process's temporaries are removed
                shutil.rmtree(other, ignore_errors=True)
            elif owner != os.getpid():
                raise StepError(
                    f"{dest} is being cloned by another apply (pid {owner}, into {other.name})",
                    hint="let it finish, then run apply again; two pipelines should not clone into one directory",
                )
        tmp = dest.parent / f".{dest.name}.runner-clone-{os.getpid()}-{start_time(os.getpid())}"
        ref = spec.ref
        by_name = ref is not None and not HEX.match(ref.lower())

        def clone() -> None:
            shutil.rmtree(tmp, ignore_errors=True)
            args = ["clone", "--progress"]
            if spec.depth:
                args += ["--depth", str(spec.depth)]
            if by_name and ref:
                args += ["--branch", ref]
            self._git(ctx, [*args, "--", self._url(ctx), str(tmp)], dest.parent, network=True)

        try:
            self._with_retries(ctx, "clone", clone)
            if ref and not by_name:
                self._checkout_commit(ctx, tmp, ref)
            elif ref and by_name and _is_branch(tmp, ref):
                pass  # --branch checked it out as a local branch tracking origin
            if spec.submodules:
                self._with_retries(
                    ctx,
                    "submodule update",
                    lambda: self._git(ctx, ["submodule", "update", "--init", "--recursive"], tmp, network=True),
                )
            if dest.is_dir():
                with contextlib.suppress(OSError):
                    dest.rmdir()  # an empty directory stood in the way
            faults.point("git-cloned")
            try:
                os.rename(tmp, dest)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise StepError(
                    f"{dest} appeared while this step cloned into {tmp.name} (another apply or tool made it)",
                    hint="run apply again: it checks what is there now",
                ) from None
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)

    def _checkout_commit(self, ctx: StepContext, repo: Path, sha: str) -> None:
        if not _has_commit(repo, sha, ctx.env):
            args = ["fetch", "origin", sha] + (["--depth", str(self.spec.depth)] if self.spec.depth else [])
            self._with_retries(ctx, "fetch", lambda: self._git(ctx, args, repo, network=True))
            target = "FETCH_HEAD" if not _has_commit(repo, sha, ctx.env) else sha
        else:
            target = sha
        force = ["--force"] if self.spec.force else []
        self._git(ctx, ["checkout", *force, "--detach", target], repo)
        commit, _ = head(git_dir(repo) or repo / ".git")
        if not commit or not commit.startswith(sha.lower()):
            raise StepError(f"commit {sha} is not in {self._url(ctx)}", hint="check `ref`")

    def _converge_existing(self, ctx: StepContext, dest: Path) -> bool:
        """Bring an existing clone to the spec; False when it already was (same origin, commit and branch)."""
        import git

        spec = self.spec
        repo = git.Repo(dest)
        repointed = False
        try:
            url = repo.remotes.origin.url if "origin" in [r.name for r in repo.remotes] else None
            if not same_url(url, self._url(ctx)):
                if not (spec.force or ctx.forced):
                    raise StepError(
                        f"{dest} is a clone of {url}, not {self._url(ctx)}: runner does not take it over",
                        hint=f"fix `url`, move the directory away, or `runner apply --force {ctx.name}` (or "
                        "`force: true`) to repoint its origin and check out the step's ref",
                    )
                if url is None:
                    repo.create_remote("origin", self._url(ctx))
                else:
                    repo.remotes.origin.set_url(self._url(ctx))
                repointed = True
            target, branch = self._target(ctx, repo, dest)
            if (
                repo.head.is_valid()
                and repo.head.commit.hexsha == target
                and (branch is None or (not repo.head.is_detached and repo.active_branch.name == branch))
            ):
                return repointed
            if repo.is_dirty(untracked_files=False) and not spec.force:
                changed = [str(d.a_path) for d in repo.index.diff(None)][:5]
                raise StepError(
                    f"{dest} has local changes to tracked files ({', '.join(changed) or 'staged changes'}); "
                    f"not checking out {spec.ref or 'the default branch'} over them",
                    hint="commit or stash them (git stash), or set `force: true` to discard them",
                )
            force = ["--force"] if spec.force else []
            if branch is not None:
                self._git(ctx, ["checkout", *force, "-B", branch, target], dest)
                self._git(ctx, ["branch", "--set-upstream-to", f"origin/{branch}", branch], dest)
            else:
                self._git(ctx, ["checkout", *force, "--detach", target], dest)
            if spec.submodules:
                self._with_retries(
                    ctx,
                    "submodule update",
                    lambda: self._git(ctx, ["submodule", "update", "--init", "--recursive"], dest, network=True),
                )
            return True
        finally:
            repo.close()

    def _target(self, ctx: StepContext, repo: Any, dest: Path) -> tuple[str, str | None]:
        """(commit to check out, branch name when the ref is a branch), fetching when it is not here yet."""
        spec = self.spec
        ref = spec.ref
        depth = ["--depth", str(spec.depth)] if spec.depth else []
        if ref is None:
            ref = _default_branch(repo) or "main"
        if HEX.match(ref.lower()):
            if not _has_commit(dest, ref, ctx.env):
                self._with_retries(ctx, "fetch", lambda: self._git(ctx, ["fetch", "origin", ref, *depth], dest, True))
            found = _rev(dest, f"{ref}^{{commit}}", ctx.env) or _rev(dest, "FETCH_HEAD^{commit}", ctx.env)
            if not found or not found.startswith(ref.lower()):
                raise StepError(f"commit {ref} is not in {self._url(ctx)}", hint="check `ref`")
            return found, None
        tag = _rev(dest, f"refs/tags/{ref}^{{commit}}", ctx.env)
        if tag and not spec.update:
            return tag, None
        remote_branch = _rev(dest, f"refs/remotes/origin/{ref}", ctx.env)
        if remote_branch is None or spec.update:
            refspec = f"+refs/heads/{ref}:refs/remotes/origin/{ref}"

            def fetch_branch() -> None:
                self._git(ctx, ["fetch", "origin", refspec, *depth], dest, network=True)

            try:
                self._with_retries(ctx, "fetch", fetch_branch)
            except GitNetworkError:
                raise
            except StepError:
                if tag:
                    return tag, None
                # not a branch: try it as a tag
                tag_refspec = f"+refs/tags/{ref}:refs/tags/{ref}"
                self._with_retries(
                    ctx, "fetch", lambda: self._git(ctx, ["fetch", "origin", tag_refspec, *depth], dest, True)
                )
                tag = _rev(dest, f"refs/tags/{ref}^{{commit}}", ctx.env)
                if tag:
                    return tag, None
                raise StepError(f"{ref} is neither a branch nor a tag of {self._url(ctx)}") from None
            remote_branch = _rev(dest, f"refs/remotes/origin/{ref}", ctx.env)
        if remote_branch is None:
            raise StepError(f"{ref} is neither a branch nor a tag of {self._url(ctx)}")
        return remote_branch, ref


_PROGRESS = re.compile(r"(Receiving objects|Resolving deltas|Updating files|Counting objects):\s+\d+% \((\d+)/(\d+)\)")


def _progress(ctx: StepContext, text: str) -> None:
    """git's `Receiving objects:  45% (450/1000)` as progress (the live view draws a bar)."""
    match = _PROGRESS.search(text)
    if match:
        ctx.progress(int(match.group(2)), int(match.group(3)), match.group(1).split()[-1])


def _git_env(env: Mapping[str, str]) -> dict[str, str]:
    return {**env, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true", "LC_ALL": "C"}


def _rev(repo: Path, expr: str, env: Mapping[str, str]) -> str | None:
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", expr], cwd=repo, capture_output=True, text=True, env=_git_env(env)
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _has_commit(repo: Path, sha: str, env: Mapping[str, str]) -> bool:
    return _rev(repo, f"{sha}^{{commit}}", env) is not None


def _is_branch(repo: Path, name: str) -> bool:
    gitdir = git_dir(repo)
    return gitdir is not None and head(gitdir)[1] == name


def _default_branch(repo: Any) -> str | None:
    try:
        ref = repo.git.symbolic_ref("refs/remotes/origin/HEAD")
    except Exception:  # noqa: BLE001 - no origin/HEAD recorded
        return None
    text = str(ref).strip()
    return text.rsplit("/", 1)[-1] if text else None


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("$ ")]
    errors = [line for line in lines if line.lower().startswith(("fatal:", "error:"))]
    chosen = errors[-1] if errors else (lines[-1] if lines else "no output")
    return chosen.strip()


def _clone_owner(suffix: str) -> int | None:
    """The live process a temporary clone belongs to (its name ends in PID-STARTTIME), or None when that
    process is gone (or the name is of an older runner, PID alone, and the pid is not running)."""
    pid_text, _, began = suffix.partition("-")
    if not pid_text.isdigit():
        return None
    pid = int(pid_text)
    now = start_time(pid)
    if now is None or (began and now != began):
        return None
    return pid
