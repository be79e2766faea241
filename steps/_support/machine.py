"""The machine a step works on: this one (in-process: stat, glob, a child process) or another over ssh (the run's
master connection and agent, steps/_support/ssh.py). A kind written against :class:`Machine` is written once and
runs on either; `machine_for(host)` gives the one a step's `host:` names.

What a machine offers a kind, each the same in meaning on both:

- `look(ctx, cwd, creates, inputs)`: the first `creates` pattern that matches nothing (or None) and what goes
  into the fingerprint for the `inputs` (their content digests); on another machine one round trip for both.
- `run(ctx, command, cwd, env)`: the command (a list is argv, a string runs under `sh -c`), its output streamed
  to the step's log, stopped with the step (timeout, Ctrl-C); `failure(...)` words a non-zero exit.
- `remove(ctx, cwd, patterns, dry_run)`: `runner down --purge` of what the patterns name (regular files and
  symbolic links, never a directory, never through a link).
- `sweep(tag)`: stop what a step left running there, by its process tag.
- `check()`: raise StepError when the machine cannot be reached (plan says such a step would fail).
- `fact(ctx, fact)`: a read-only query (steps/_support/facts.py :class:`Fact`): here in-process, there its script
  in one round trip, parsed the same.
- `ask(ctx, argv, cwd)`: a short command whose output is read, not logged (`git rev-parse`): (exit code, stdout).
- `path(ctx, path)`: a path as an absolute one there (relative: from the pipeline's directory here, from the
  login directory there; `~/` is that machine's home).
- `entry(ctx, path)`: "none", "empty" (an empty directory), "dir" or "file" (links followed).
- `names(ctx, directory)`, `make_dirs(ctx, path)`, `remove_tree(ctx, path)`, `move(ctx, src, dst)` (False when
  `dst` is there already: never into it).

Paths: on this machine relative paths are from the pipeline file's directory (`cwd` too); on another, from the
login directory, or from `cwd` for `creates` and `inputs`.
"""

from __future__ import annotations

import errno
import os
import platform
import posixpath
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runner.util.datatype import replace
from runner.util.text import argv_of, one_line
from steps._support import remote, ssh
from steps._support.facts import Fact, FactQuery, Facts, T
from steps._support.files import content_digest, expand, remove_created
from steps._support.process import Completed, run_process
from steps.base import StepContext, StepError


class Machine:
    """This machine; :class:`SshMachine` is another. See the module's docstring for the operations."""

    host: str | None = None  # the ssh destination, None for this machine

    @property
    def where(self) -> str:
        """ " on HOST" for another machine, "" for this one: the end of a message about something there."""
        return ""

    def check(self) -> None:
        return None

    def look(
        self, ctx: StepContext, cwd: str | None, creates: Sequence[str], inputs: Sequence[str]
    ) -> tuple[str | None, dict[str, Any]]:
        missing = next((p for p in creates if not expand(ctx.resolve(p), ctx)), None)
        if not inputs:
            return missing, {}
        found = {p: [str(x) for x in expand(ctx.resolve(p), ctx)] for p in inputs}
        paths = [ctx.resolve(x) for matches in found.values() for x in matches]
        return missing, {"inputs": found, "input_digests": content_digest(paths, ctx)}

    def facts(self, ctx: StepContext, query: FactQuery) -> Facts:
        found = Facts()
        found.missing_paths = [p for p in query.paths if not expand(ctx.resolve(p), ctx)]
        if query.kernel:
            found.kernel = platform.release()
        for file, text in query.contains:
            try:
                with open(ctx.resolve(file), encoding="utf-8", errors="replace") as fh:
                    found.contains.append("" if text in fh.read() else "absent")
            except OSError as exc:
                found.contains.append(f"unreadable:{exc.strerror}")
        found.unset = [name for name in query.env if not ctx.env.get(name)]
        found.not_found = [p for p in query.programs if shutil.which(p, path=ctx.env.get("PATH")) is None]
        for key in query.sysctl:
            try:
                with open("/proc/sys/" + key.replace(".", "/"), encoding="ascii", errors="replace") as fh:
                    found.sysctl[key] = fh.read().strip()
            except OSError:
                found.sysctl[key] = None
        return found

    def fact(self, ctx: StepContext, fact: Fact[T]) -> T:
        return fact.here(ctx)

    def ask(
        self, ctx: StepContext, argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        try:
            proc = subprocess.run(
                list(argv),
                cwd=cwd or ctx.pipeline_dir,
                env={**ctx.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=ctx.timeout or 120,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return 127, str(exc)
        return proc.returncode, proc.stdout

    def path(self, ctx: StepContext, path: str) -> str:
        return os.fspath(ctx.resolve(path))

    def entry(self, ctx: StepContext, path: str) -> str:
        if os.path.isdir(path):
            try:
                return "dir" if os.listdir(path) else "empty"
            except OSError:
                return "dir"
        return "file" if os.path.lexists(path) else "none"

    def names(self, ctx: StepContext, directory: str) -> list[str]:
        try:
            return sorted(os.listdir(directory))
        except OSError:
            return []

    def make_dirs(self, ctx: StepContext, path: str) -> None:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            raise StepError(f"cannot make {path}: {exc.strerror}") from None

    def remove_tree(self, ctx: StepContext, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def move(self, ctx: StepContext, src: str, dst: str) -> bool:
        try:
            os.rename(src, dst)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                raise StepError(f"cannot move {src} to {dst}: {exc.strerror}") from None
            return False
        return True

    def workdir(self, ctx: StepContext, cwd: str | None) -> str:
        """Where a command with this `cwd` runs, as the step's `cwd` output says it."""
        return os.fspath(ctx.resolve(cwd) if cwd else ctx.pipeline_dir)

    def run(
        self,
        ctx: StepContext,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stop_signal: str = "TERM",
        grace: float = 3.0,
        quiet: bool = False,
        on_transient: Callable[[str], None] | None = None,
        drop: Sequence[str] = (),
    ) -> Completed:
        """`quiet`: its output goes to no log and no screen (a secret being read); `on_transient`: the lines a
        carriage return ends (git's progress); `drop`: variables the command must not get (an installer's
        PYTHONPATH)."""
        where = ctx.resolve(cwd) if cwd else ctx.pipeline_dir
        if not where.is_dir():
            raise StepError(f"working directory does not exist: {where}")
        full = {k: v for k, v in {**ctx.env, **(env or {})}.items() if k not in drop}
        if "PWD" in full:
            full["PWD"] = str(where)
        if quiet:
            ctx = replace(ctx, log_path=None, on_output=lambda line: None)
        stop = getattr(signal, f"SIG{stop_signal.upper().removeprefix('SIG')}", signal.SIGTERM)
        return run_process(
            argv_of(command), ctx, cwd=where, env=full, stop_signal=stop, grace=grace, on_transient=on_transient
        )

    def failure(self, code: int, command: str | list[str], tail: Sequence[str], what: str = "command") -> StepError:
        shown = one_line(command)
        hint = ""
        if isinstance(command, str) and code == 127:
            hint = "the shell could not find a command (exit 127): check its name and PATH"
        return StepError(f"{what} exited with code {code}: {shown}", hint=hint, output_tail="\n".join(tail))

    def remove(self, ctx: StepContext, cwd: str | None, patterns: list[str], dry_run: bool) -> str | None:
        return "; ".join(remove_created(ctx, patterns, dry_run)) or None

    def sweep(self, tag: str) -> list[tuple[int, str]]:
        """Here the engine sweeps by itself (runner/util/sweep.py, with the processes' own words)."""
        return []


class SshMachine(Machine):
    """Another machine, over the run's ssh master for `host` (steps/_support/remote.py writes the shell)."""

    def __init__(self, host: str) -> None:
        self.host = host

    @property
    def where(self) -> str:
        return f" on {ssh.display(self.target)}"

    @property
    def target(self) -> str:
        assert self.host is not None
        return self.host

    def check(self) -> None:
        ssh.connect(self.target)

    def look(
        self, ctx: StepContext, cwd: str | None, creates: Sequence[str], inputs: Sequence[str]
    ) -> tuple[str | None, dict[str, Any]]:
        if not creates and not inputs:
            return None, {}
        missing, digests = remote.observe(self.target, cwd, creates, inputs)
        return missing, ({"remote_input_digests": digests} if inputs else {})

    def workdir(self, ctx: StepContext, cwd: str | None) -> str:
        return cwd or "~"

    def facts(self, ctx: StepContext, query: FactQuery) -> Facts:
        return remote.facts(ctx, self.target, query)

    def fact(self, ctx: StepContext, fact: Fact[T]) -> T:
        code, out = ssh.quick(self.target, fact.script() + "\n", timeout=ctx.timeout or 120)
        return fact.parse(code, out)

    def _quick(self, script: str) -> tuple[int, str]:
        return ssh.quick(self.target, script + "\n")

    def ask(
        self, ctx: StepContext, argv: Sequence[str], cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> tuple[int, str]:
        cd = f"cd {ssh.quote(cwd)} || exit 1; " if cwd else ""
        exports = ssh.exports(dict(env or {}))
        return self._quick(f"{exports}\n{cd}exec {remote.join(list(argv))} 2>/dev/null")

    _home: str | None = None

    def path(self, ctx: StepContext, path: str) -> str:
        if path.startswith("/"):
            return posixpath.normpath(path)
        if self._home is None:
            code, out = self._quick('printf "%s\\n" "$HOME"')
            home = out.strip().splitlines()[-1] if code == 0 and out.strip() else ""
            if not home.startswith("/"):
                raise StepError(f"cannot tell the home directory{self.where}")
            self._home = home
        rest = path[2:] if path.startswith("~/") else ("" if path == "~" else path)
        return posixpath.normpath(posixpath.join(self._home, rest))

    def entry(self, ctx: StepContext, path: str) -> str:
        p = ssh.quote(path)
        code, out = self._quick(
            f'if [ -d {p} ]; then if [ -n "$(ls -A -- {p} 2>/dev/null)" ]; then echo dir; else echo empty; fi; '
            f"elif [ -e {p} ] || [ -L {p} ]; then echo file; else echo none; fi"
        )
        said = out.strip().splitlines()[-1] if out.strip() else ""
        if said not in ("none", "empty", "dir", "file"):
            raise StepError(f"cannot look at {path}{self.where}: {out.strip()[-200:]}")
        return said

    def names(self, ctx: StepContext, directory: str) -> list[str]:
        code, out = self._quick(f"cd {ssh.quote(directory)} 2>/dev/null && ls -A")
        return sorted(out.splitlines()) if code == 0 else []

    def make_dirs(self, ctx: StepContext, path: str) -> None:
        code, out = self._quick(f"mkdir -p -- {ssh.quote(path)}")
        if code != 0:
            raise StepError(f"cannot make {path}{self.where}: {out.strip()[-200:]}")

    def remove_tree(self, ctx: StepContext, path: str) -> None:
        self._quick(f"rm -rf -- {ssh.quote(path)}")

    def move(self, ctx: StepContext, src: str, dst: str) -> bool:
        a, b = ssh.quote(src), ssh.quote(dst)
        code, out = self._quick(f"if [ -d {b} ]; then rmdir -- {b} 2>/dev/null || exit 17; fi; mv -- {a} {b}")
        if code == 17:
            return False
        if code != 0:
            raise StepError(f"cannot move {src} to {dst}{self.where}: {out.strip()[-200:]}")
        return True

    def run(
        self,
        ctx: StepContext,
        command: str | list[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stop_signal: str = "TERM",
        grace: float = 3.0,
        quiet: bool = False,
        on_transient: Callable[[str], None] | None = None,
        drop: Sequence[str] = (),
    ) -> Completed:
        return remote.run(
            ctx,
            self.target,
            command,
            cwd=cwd,
            env=env,
            stop_signal=stop_signal,
            grace=grace,
            quiet=quiet,
            on_transient=on_transient,
            drop=drop,
        )

    def failure(self, code: int, command: str | list[str], tail: Sequence[str], what: str = "command") -> StepError:
        return remote.failure(self.target, code, command, tail, what=what)

    def remove(self, ctx: StepContext, cwd: str | None, patterns: list[str], dry_run: bool) -> str | None:
        if not patterns:
            return None
        if dry_run:
            return f"would remove {', '.join(patterns)}{self.where}"
        cd = f"cd {ssh.quote(cwd)} || exit 1; " if cwd else ""
        # as here: regular files and links only, never a directory
        removes = "; ".join(
            f"{remote.match_lines(p)} | while IFS= read -r _p; do "
            f'if [ -L "$_p" ] || [ -f "$_p" ]; then rm -f -- "$_p"; fi; done'
            for p in patterns
        )
        code, _ = ssh.quick(self.target, f"{cd}{removes}; :")
        return f"removed {', '.join(patterns)}{self.where}" if code == 0 else None

    def sweep(self, tag: str) -> list[tuple[int, str]]:
        return remote.sweep(self.target, tag)


THIS = Machine()
_machines: dict[str, SshMachine] = {}
_lock = threading.Lock()


def machine_for(host: str | None) -> Machine:
    """The machine a step's `host:` names (None or "": this one); one object per host in a run."""
    if not host:
        return THIS
    with _lock:
        if host not in _machines:
            _machines[host] = SshMachine(host)
        return _machines[host]
