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

import os
import posixpath
import re
import socket
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from runner.util import faults
from steps._support.gitdir import DISK_FULL, NETWORK_ERRORS, CloneFact, git_dir, same_url
from steps._support.machine import machine_for
from steps._support.process import log_line
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

    # ---- probe: file reads only here, one round trip there ---------------------------------------------------

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[Change]) -> list[Change]:
        spec = self.spec
        old_ref = old_spec.get("ref")
        if old_ref == spec.ref:
            return changes
        was = str(ctx.record_outputs.get("commit") or "")[:7]
        new = ""
        machine = machine_for(ctx.host)
        dest = machine.path(ctx, spec.dest)
        if spec.ref and machine.fact(ctx, CloneFact(spec.dest, self._url(ctx))).state == "clone":
            found = self._rev(ctx, dest, f"{spec.ref}^{{commit}}") or self._rev(
                ctx, dest, f"origin/{spec.ref}^{{commit}}"
            )
            new = f" ({found[:7]})" if found else " (not in the clone yet: fetched on apply)"
        ref = Change("ref", f"{old_ref or 'HEAD'}" + (f"@{was}" if was else ""), f"{spec.ref or 'HEAD'}{new}")
        return [ref if c.field == "ref" else c for c in changes]

    def _url(self, ctx: StepContext) -> str:
        """A url that starts with ./ or ../ is a path relative to the pipeline file (a bundle shipped beside it)."""
        url = self.spec.url
        return os.fspath(ctx.resolve(url)) if url.startswith(("./", "../")) else url

    def probe(self, ctx: StepContext) -> Probe:
        spec = self.spec
        machine = machine_for(ctx.host)
        where = machine.where
        wanted = str(spec.ref or ctx.record_outputs.get("branch") or "HEAD")
        ask = spec.update and not (spec.ref and HEX.match(spec.ref.lower()))
        seen = machine.fact(ctx, CloneFact(spec.dest, self._url(ctx), wanted if ask else None))
        if seen.state == "none":
            return Probe.missing(f"{spec.dest} is not a clone yet{where}")
        if seen.state == "notgit":
            return Probe.missing(f"{spec.dest}{where} is not a git clone (apply will say what to do)")
        url = self._url(ctx)
        if not same_url(seen.url, url):
            return Probe.drift(
                f"origin of {spec.dest}{where} is {seen.url}, not {url}", (Change("url", seen.url, url),)
            )
        commit = seen.commit
        if not commit:
            return Probe.missing(f"{spec.dest}{where} has no HEAD commit")
        if spec.ref and HEX.match(spec.ref.lower()):
            if not commit.startswith(spec.ref.lower()):
                return Probe.drift(
                    f"HEAD is {commit[:12]}, not {spec.ref}{where}", (Change("ref", commit[:12], spec.ref),)
                )
            return Probe.ok()
        recorded = str(ctx.record_outputs.get("commit", ""))
        if commit != recorded:
            return Probe.drift(
                f"HEAD{where} moved to {commit[:12]} (recorded {recorded[:12] or 'none'})",
                (Change("commit", recorded[:12], commit[:12]),),
            )
        if ask:
            if seen.remote is None:
                raise StepError(f"git ls-remote origin failed{where}: its origin did not answer for {wanted}")
            if seen.remote and seen.remote != commit:
                change = Change("commit", commit[:12], seen.remote[:12])
                return Probe.drift(f"origin/{wanted} moved: {commit[:12]} -> {seen.remote[:12]}", (change,))
        return Probe.ok(f"at {commit[:12]}" + (f" ({seen.branch})" if seen.branch else "") + where)

    # ---- apply: git commands on the step's machine -----------------------------------------------------------

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        """With --purge: the clone, if it is a clone of this step's url (a directory of someone else's stays)."""
        if not purge:
            return None
        machine = machine_for(ctx.host)
        seen = machine.fact(ctx, CloneFact(self.spec.dest, self._url(ctx)))
        if seen.state != "clone":
            return None
        dest = machine.path(ctx, self.spec.dest)
        where = machine.where
        if not same_url(seen.url, self._url(ctx)):
            return f"left {dest}{where}: a clone of {seen.url}, not of this step's url"
        if dry_run:
            return f"would remove the clone {dest}{where}"
        machine.remove_tree(ctx, dest)
        return f"removed the clone {dest}{where}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        machine = machine_for(ctx.host)
        dest = machine.path(ctx, self.spec.dest)
        entry = machine.entry(ctx, dest)
        if entry in ("dir", "file"):
            if entry == "file" or self._top(ctx, dest) is None:
                raise StepError(
                    f"{dest} exists{machine.where} and is not a git clone",
                    hint="move it away or choose another `dest`; runner never deletes a directory it did not make",
                )
            ctx.changed = self._converge_existing(ctx, dest)
        else:
            self._clone_fresh(ctx, dest)
        commit = self._rev(ctx, dest, "HEAD") or ""
        code, out = machine.ask(ctx, ["git", "symbolic-ref", "-q", "--short", "HEAD"], cwd=dest, env=_GIT_ENV)
        outputs = {"commit": commit, "path": dest, "branch": out.strip() if code == 0 else ""}
        return {**outputs, "host": ctx.host} if ctx.host else outputs

    def _top(self, ctx: StepContext, dest: str) -> str | None:
        """The clone's top directory when `dest` is one (not a directory inside another clone)."""
        if not ctx.host:  # in-process: the .git reader
            return dest if git_dir(Path(dest)) is not None else None
        same = '[ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ]'  # links in the path resolved
        code, _ = machine_for(ctx.host).ask(ctx, ["sh", "-c", same], cwd=dest, env=_GIT_ENV)
        return dest if code == 0 else None

    def _rev(self, ctx: StepContext, repo: str, expr: str) -> str | None:
        code, out = machine_for(ctx.host).ask(ctx, ["git", "rev-parse", "--verify", "--quiet", expr], repo, _GIT_ENV)
        return (out.strip() or None) if code == 0 else None

    def _git(self, ctx: StepContext, args: list[str], cwd: str, network: bool = False) -> str:
        machine = machine_for(ctx.host)
        ctx.on_output("$ git " + " ".join(args))
        result = machine.run(
            ctx,
            ["git", "-c", "advice.detachedHead=false", *args],
            cwd=cwd,
            env=_GIT_ENV,
            on_transient=lambda t: _progress(ctx, t),
        )
        if result.returncode != 0:
            text = "\n".join(result.tail).strip()
            message = f"git {args[0]} failed{machine.where} (exit {result.returncode}): {_last_error(text)}"
            full = next((m for m in DISK_FULL if m in text.lower()), None)
            if full is not None:  # git then also says "early EOF" / "the remote end hung up": not the network
                raise StepError(
                    f"git {args[0]} failed{machine.where}: {full} (exit {result.returncode})",
                    hint=f"free space where `dest` is{machine.where}, then apply again (not retried: it is the disk)",
                    output_tail=text,
                )
            if network and any(marker in text.lower() for marker in NETWORK_ERRORS):
                raise GitNetworkError(message, output_tail=text)
            hint = ""
            if network and ctx.host:
                hint = f"not a network error, so not retried: check `url` and `ref` as {ctx.host} sees them"
            raise StepError(message, hint=hint, output_tail=text)
        return result.stdout

    def _with_retries(self, ctx: StepContext, what: str, action: Any) -> None:
        spec = self.spec

        def before_retry(attempt: int, exc: BaseException | None) -> None:
            said = f"{what} attempt {attempt} of {spec.attempts} failed ({getattr(exc, 'message', exc)}); retrying"
            log_line(ctx, "runner: " + said)
            ctx.notice(f"{ctx.name}: {said}")

        from tenacity import retry_if_exception, wait_exponential  # only to clone

        from runner.util.retry import retrying

        tries = retrying(
            attempts=spec.attempts,
            wait=wait_exponential(multiplier=0.5, max=8),
            retry=retry_if_exception(_is_network),
            cancel=ctx.cancel,
            interrupted=lambda: StepError("interrupted"),
            before_retry=before_retry,
        )
        try:
            for attempt in tries:
                with attempt:
                    action()
        except GitNetworkError as exc:  # every attempt: the network, as far as git's words tell
            where = machine_for(ctx.host).where
            reach = (
                f"check that {ctx.host or 'this machine'} reaches {self._url(ctx)} (its network, proxy, credentials)"
            )
            exc.message = exc.message.replace(
                f"failed{where} (", f"failed{where} after {spec.attempts} attempt(s) (", 1
            )
            raise StepError(exc.message, hint=reach, output_tail=exc.output_tail) from None

    def _clone_fresh(self, ctx: StepContext, dest: str) -> None:
        spec = self.spec
        machine = machine_for(ctx.host)
        parent, name = posixpath.split(dest)
        machine.make_dirs(ctx, parent)
        for other in machine.names(ctx, parent):
            if not other.startswith(f".{name}.runner-clone-"):
                continue
            owner = _clone_owner(other.rsplit(".runner-clone-", 1)[1])
            if owner is None:  # left by a run that died: only a dead process's temporaries are removed
                machine.remove_tree(ctx, posixpath.join(parent, other))
            elif owner != os.getpid():
                raise StepError(
                    f"{dest} is being cloned by another apply (pid {owner}, into {other})",
                    hint="let it finish, then run apply again; two pipelines should not clone into one directory",
                )
        tmp = posixpath.join(parent, f".{name}.runner-clone-{_clone_suffix(bool(ctx.host))}")
        ref = spec.ref
        by_name = ref is not None and not HEX.match(ref.lower())

        def clone() -> None:
            machine.remove_tree(ctx, tmp)
            args = ["clone", "--progress"]
            if spec.depth:
                args += ["--depth", str(spec.depth)]
            if by_name and ref:
                args += ["--branch", ref]
            self._git(ctx, [*args, "--", self._url(ctx), tmp], parent, network=True)

        try:
            self._with_retries(ctx, "clone", clone)
            if ref and not by_name:
                self._checkout_commit(ctx, tmp, ref)
            if spec.submodules:
                self._with_retries(
                    ctx,
                    "submodule update",
                    lambda: self._git(ctx, ["submodule", "update", "--init", "--recursive"], tmp, network=True),
                )
            faults.point("git-cloned")
            if not machine.move(ctx, tmp, dest):
                raise StepError(
                    f"{dest} appeared{machine.where} while this step cloned into {posixpath.basename(tmp)} (another "
                    "apply or tool made it)",
                    hint="run apply again: it checks what is there now",
                )
        finally:
            if machine.entry(ctx, tmp) != "none":
                machine.remove_tree(ctx, tmp)

    def _checkout_commit(self, ctx: StepContext, repo: str, sha: str) -> None:
        if self._rev(ctx, repo, f"{sha}^{{commit}}") is None:
            args = ["fetch", "origin", sha] + (["--depth", str(self.spec.depth)] if self.spec.depth else [])
            self._with_retries(ctx, "fetch", lambda: self._git(ctx, args, repo, network=True))
            target = "FETCH_HEAD" if self._rev(ctx, repo, f"{sha}^{{commit}}") is None else sha
        else:
            target = sha
        force = ["--force"] if self.spec.force else []
        self._git(ctx, ["checkout", *force, "--detach", target], repo)
        commit = self._rev(ctx, repo, "HEAD")
        if not commit or not commit.startswith(sha.lower()):
            raise StepError(f"commit {sha} is not in {self._url(ctx)}", hint="check `ref`")

    def _converge_existing(self, ctx: StepContext, dest: str) -> bool:
        """Bring an existing clone to the spec; False when it already was (same origin, commit and branch)."""
        spec = self.spec
        machine = machine_for(ctx.host)
        repointed = False
        code, out = machine.ask(ctx, ["git", "config", "--get", "remote.origin.url"], cwd=dest, env=_GIT_ENV)
        url = out.strip() if code == 0 and out.strip() else None
        if not same_url(url, self._url(ctx)):
            if not (spec.force or ctx.forced):
                raise StepError(
                    f"{dest}{machine.where} is a clone of {url}, not {self._url(ctx)}: runner does not take it over",
                    hint=f"fix `url`, move the directory away, or `runner apply --force {ctx.name}` (or "
                    "`force: true`) to repoint its origin and check out the step's ref",
                )
            verb = ["remote", "add", "origin"] if url is None else ["remote", "set-url", "origin"]
            self._git(ctx, [*verb, self._url(ctx)], dest)
            repointed = True
        target, branch = self._target(ctx, dest)
        now = self._rev(ctx, dest, "HEAD")
        code, out = machine.ask(ctx, ["git", "symbolic-ref", "-q", "--short", "HEAD"], cwd=dest, env=_GIT_ENV)
        on_branch = out.strip() if code == 0 else ""
        if now == target and (branch is None or on_branch == branch):
            return repointed
        if not spec.force:
            code, _ = machine.ask(ctx, ["git", "diff-index", "--quiet", "HEAD", "--"], cwd=dest, env=_GIT_ENV)
            if code != 0:
                _, names = machine.ask(ctx, ["git", "diff", "--name-only", "HEAD"], cwd=dest, env=_GIT_ENV)
                changed = ", ".join(names.split()[:5]) or "staged changes"
                raise StepError(
                    f"{dest}{machine.where} has local changes to tracked files ({changed}); "
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

    def _target(self, ctx: StepContext, dest: str) -> tuple[str, str | None]:
        """(commit to check out, branch name when the ref is a branch), fetching when it is not here yet."""
        spec = self.spec
        ref = spec.ref
        depth = ["--depth", str(spec.depth)] if spec.depth else []
        if ref is None:
            code, out = machine_for(ctx.host).ask(
                ctx, ["git", "symbolic-ref", "-q", "refs/remotes/origin/HEAD"], cwd=dest, env=_GIT_ENV
            )
            ref = (out.strip().rsplit("/", 1)[-1] if code == 0 and out.strip() else "") or "main"
        if HEX.match(ref.lower()):
            if self._rev(ctx, dest, f"{ref}^{{commit}}") is None:
                self._with_retries(ctx, "fetch", lambda: self._git(ctx, ["fetch", "origin", ref, *depth], dest, True))
            found = self._rev(ctx, dest, f"{ref}^{{commit}}") or self._rev(ctx, dest, "FETCH_HEAD^{commit}")
            if not found or not found.startswith(ref.lower()):
                raise StepError(f"commit {ref} is not in {self._url(ctx)}", hint="check `ref`")
            return found, None
        tag = self._rev(ctx, dest, f"refs/tags/{ref}^{{commit}}")
        if tag and not spec.update:
            return tag, None
        remote_branch = self._rev(ctx, dest, f"refs/remotes/origin/{ref}")
        if remote_branch is None or spec.update:
            refspec = f"+refs/heads/{ref}:refs/remotes/origin/{ref}"

            def fetch_branch() -> None:
                self._git(ctx, ["fetch", "origin", refspec, *depth], dest, network=True)

            try:
                self._with_retries(ctx, "fetch", fetch_branch)
            except StepError as exc:
                if exc.hint.startswith("check that "):  # the network, after every attempt
                    raise
                if tag:
                    return tag, None
                # not a branch: try it as a tag
                tag_refspec = f"+refs/tags/{ref}:refs/tags/{ref}"
                self._with_retries(
                    ctx, "fetch", lambda: self._git(ctx, ["fetch", "origin", tag_refspec, *depth], dest, True)
                )
                tag = self._rev(ctx, dest, f"refs/tags/{ref}^{{commit}}")
                if tag:
                    return tag, None
                raise StepError(f"{ref} is neither a branch nor a tag of {self._url(ctx)}") from None
            remote_branch = self._rev(ctx, dest, f"refs/remotes/origin/{ref}")
        if remote_branch is None:
            raise StepError(f"{ref} is neither a branch nor a tag of {self._url(ctx)}")
        return remote_branch, ref


_PROGRESS = re.compile(r"(Receiving objects|Resolving deltas|Updating files|Counting objects):\s+\d+% \((\d+)/(\d+)\)")


def _progress(ctx: StepContext, text: str) -> None:
    """git's `Receiving objects:  45% (450/1000)` as progress (the live view draws a bar)."""
    match = _PROGRESS.search(text)
    if match:
        ctx.progress(int(match.group(2)), int(match.group(3)), match.group(1).split()[-1])


_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/true", "LC_ALL": "C"}  # never a prompt; git's words


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("$ ")]
    errors = [line for line in lines if line.lower().startswith(("fatal:", "error:"))]
    chosen = errors[-1] if errors else (lines[-1] if lines else "no output")
    return chosen.strip()


def _clone_suffix(elsewhere: bool) -> str:
    """The end of a temporary clone's name: this runner's PID-STARTTIME, and on another machine also this one's
    name after an @ (a pid there means nothing of this machine's)."""
    own = f"{os.getpid()}-{start_time(os.getpid())}"
    return f"{own}@{socket.gethostname()}" if elsewhere else own


def _clone_owner(suffix: str) -> int | None:
    """The live process a temporary clone belongs to (its name ends in PID-STARTTIME, @MACHINE when made from
    another), or None when that process is gone (or the name is of an older runner, PID alone, and the pid is not
    running). A temporary made from another control machine is taken as live: this one cannot look."""
    suffix, at, machine = suffix.partition("@")
    pid_text, _, began = suffix.partition("-")
    if not pid_text.isdigit():
        return None
    pid = int(pid_text)
    if at and machine != socket.gethostname():
        return pid
    now = start_time(pid)
    if now is None or (began and now != began):
        return None
    return pid
