"""A git step on another machine (`git: {host: ...}`): the clone is made there, by that machine's git.

The probe is one round trip (origin, HEAD, branch; with `update: true` also the remote's branch head, which that
machine asks its origin for). Apply is one script there with the same rules as a local clone: a fresh clone goes
into a temporary sibling and is renamed into place, so a dropped connection or a killed runner never leaves a
half clone that counts as done (a later apply removes a dead run's temporary); an existing clone of another
origin is not taken over without `force`; local changes to tracked files are never checked out over without
`force`; a branch is fetched as `origin/<branch>` and checked out as a local branch, a tag or a commit detached;
network operations are tried `attempts` times with a pause between.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steps._support import remote, ssh
from steps._support.gitdir import NETWORK_ERRORS, same_url
from steps.base import Probe, StepContext, StepError

HEX_CHARS = set("0123456789abcdef")
SCRIPT = Path(__file__).with_name("remote_git.sh")


def _is_commit(ref: str) -> bool:
    return 7 <= len(ref) <= 40 and set(ref.lower()) <= HEX_CHARS


def _dest_word(dest: str) -> str:
    """The clone's path as a shell word there: ~/ is that machine's home."""
    if dest == "~" or dest.startswith("~/"):
        return '"$HOME"' + ssh.quote(dest[1:]) if len(dest) > 1 else '"$HOME"'
    return ssh.quote(dest)


class RemoteGit:
    def __init__(self, step: Any, host: str) -> None:
        self.step = step
        self.host = host  # the step's `host:`

    def probe(self, ctx: StepContext) -> Probe:
        spec = self.step.spec
        lines = [
            f"cd {_dest_word(spec.dest)} 2>/dev/null || {{ echo NONE; exit 0; }}",
            '[ "$(git rev-parse --show-toplevel 2>/dev/null)" = "$(pwd -P)" ] || { echo NOTGIT; exit 0; }',
            'echo "URL $(git config --get remote.origin.url)"',
            'echo "HEAD $(git rev-parse -q --verify HEAD)"',
            'echo "BRANCH $(git symbolic-ref -q --short HEAD)"',
        ]
        wanted = spec.ref or ctx.record_outputs.get("branch") or "HEAD"
        check_remote = spec.update and not (spec.ref and _is_commit(spec.ref))
        if check_remote:
            what = "HEAD" if wanted == "HEAD" else f"refs/heads/{wanted}"
            ask = f"GIT_TERMINAL_PROMPT=0 git ls-remote origin {ssh.quote(what)} 2>/dev/null"
            lines.append(f'echo "REMOTE $({ask} | head -n 1 | cut -f1)"')
        code, out = ssh.quick(self.host, "\n".join(lines) + "\n", timeout=ctx.timeout or 120)
        said = {}
        for line in out.splitlines():
            key, _, value = line.partition(" ")
            said[key] = value.strip()
        where = f"on {self.host}"
        if "NONE" in said:
            return Probe.missing(f"{spec.dest} is not a clone yet {where}")
        if "NOTGIT" in said:
            return Probe.missing(f"{spec.dest} {where} is not a git clone (apply will say what to do)")
        url = said.get("URL", "")
        if not same_url(url, spec.url):
            return Probe.drift(
                f"origin of {spec.dest} {where} is {url}, not {spec.url}", (f"url: {url} -> {spec.url}",)
            )
        commit = said.get("HEAD", "")
        if not commit:
            return Probe.missing(f"{spec.dest} {where} has no HEAD commit")
        if spec.ref and _is_commit(spec.ref):
            if not commit.startswith(spec.ref.lower()):
                return Probe.drift(
                    f"HEAD is {commit[:12]}, not {spec.ref} {where}", (f"ref: {commit[:12]} -> {spec.ref}",)
                )
            return Probe.ok()
        recorded = str(ctx.record_outputs.get("commit", ""))
        if commit != recorded:
            return Probe.drift(
                f"HEAD {where} moved to {commit[:12]} (recorded {recorded[:12] or 'none'})",
                (f"commit: {recorded[:12]} -> {commit[:12]}",),
            )
        if check_remote:
            head = said.get("REMOTE", "")
            if not head:
                raise StepError(f"git ls-remote origin failed {where}: its origin did not answer for {wanted}")
            if head != commit:
                return Probe.drift(
                    f"origin/{wanted} moved: {commit[:12]} -> {head[:12]}", (f"commit: {commit[:12]} -> {head[:12]}",)
                )
        branch = said.get("BRANCH", "")
        return Probe.ok(f"at {commit[:12]}" + (f" ({branch})" if branch else "") + f" {where}")

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.step.spec
        q = ssh.quote
        script = "\n".join(
            [
                f"dest={_dest_word(spec.dest)}",
                f"url={q(spec.url)}",
                f"ref={q(spec.ref or '')}",
                f"force={1 if spec.force or ctx.forced else 0}",
                f"attempts={int(spec.attempts)}",
                f"depth={q(f'--depth={int(spec.depth)}') if spec.depth else ''}",
                f"update={1 if spec.update else 0}",
                f"submodules={1 if spec.submodules else 0}",
                f"network={q('|'.join(NETWORK_ERRORS))}",
                SCRIPT.read_text(encoding="utf-8"),
            ]
        )
        result = remote.run(ctx, self.host, script, env={})
        said = [line for line in [*result.stdout.splitlines(), *result.tail] if line.startswith("RUNNER-GIT ")]
        tail = "\n".join(line for line in result.tail if not line.startswith("RUNNER-GIT "))
        where = f"on {self.host}"
        for line in said:
            word, _, rest = line[len("RUNNER-GIT ") :].partition(" ")
            if word == "FAIL":
                raise self._failure(rest, where, tail)
        done = [line for line in said if line.startswith("RUNNER-GIT DONE ")]
        if result.returncode != 0 or not done:
            raise StepError(f"the git script exited with code {result.returncode} {where}", output_tail=tail)
        parts = done[-1].split(" ", 4)[2:]
        commit, path = parts[0], parts[1] if len(parts) > 1 else spec.dest
        branch = parts[2] if len(parts) > 2 else ""
        if any(line == "RUNNER-GIT SAME" for line in said):
            ctx.changed = False
        return {"commit": commit, "path": path, "branch": branch.strip(), "host": self.host}

    def _failure(self, what: str, where: str, tail: str) -> StepError:
        spec = self.step.spec
        name = ctx_name = spec.dest
        if what == "NOTGIT":
            return StepError(
                f"{spec.dest} exists {where} and is not a git clone",
                hint="move it away or choose another `dest`; runner never deletes a directory it did not make",
            )
        if what.startswith("ORIGIN"):
            return StepError(
                f"{spec.dest} {where} is a clone of {what[7:] or 'no origin'}, not {spec.url}: runner does not take "
                "it over",
                hint="fix `url`, move the directory away, or `force: true` to repoint its origin",
            )
        if what.startswith("DIRTY"):
            return StepError(
                f"{name} {where} has local changes to tracked files ({what[6:].strip() or 'staged changes'}); "
                f"not checking out {spec.ref or 'the default branch'} over them",
                hint="commit or stash them there (git stash), or set `force: true` to discard them",
            )
        if what.startswith(("NET", "GIT")):  # the network after every attempt, or the request itself
            lines = [x for x in tail.splitlines() if x.lower().startswith(("fatal:", "error:"))]
            said = lines[-1].strip() if lines else "see the output"
            if what.startswith("NET"):
                failed = f"failed {where} after {spec.attempts} attempt(s)"
                hint = f"check that {self.host} reaches {spec.url} (its network, proxy, credentials)"
            else:
                failed = f"failed {where}"
                hint = f"not a network error, so not retried: check `url` and `ref` as {self.host} sees them"
            return StepError(f"git {what[4:]} {failed}: {said}", hint=hint, output_tail=tail)
        if what == "NOCOMMIT":
            return StepError(f"commit {spec.ref} is not in {spec.url} (looked {where})", hint="check `ref`")
        if what == "NOREF":
            return StepError(f"{spec.ref} is neither a branch nor a tag of {spec.url} (looked {where})")
        if what == "APPEARED":
            return StepError(f"{ctx_name} appeared {where} while this step cloned", hint="run apply again")
        return StepError(f"git failed {where}: {what}", output_tail=tail)

    def teardown(self, ctx: StepContext, dry_run: bool) -> str | None:
        spec = self.step.spec
        script = (
            f"cd {_dest_word(spec.dest)} 2>/dev/null || exit 0\n"
            'echo "URL $(git config --get remote.origin.url)"; echo "PATH $(pwd -P)"\n'
        )
        _, out = ssh.quick(self.host, script)
        said = dict(line.partition(" ")[::2] for line in out.splitlines() if line)
        if "PATH" not in said:
            return None
        if not same_url(said.get("URL"), spec.url):
            return f"left {said['PATH']} on {self.host}: a clone of {said.get('URL')}, not of this step's url"
        if dry_run:
            return f"would remove the clone {said['PATH']} on {self.host}"
        code, _ = ssh.quick(self.host, f"rm -rf -- {ssh.quote(said['PATH'])}")
        return f"removed the clone {said['PATH']} on {self.host}" if code == 0 else None
