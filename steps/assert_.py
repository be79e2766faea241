"""assert: preflight checks that fail fast with their own message.

Example::

    - name: kvm
      assert:
        path: /dev/kvm
        message: "/dev/kvm is missing: enable virtualisation in the BIOS, or run on a KVM-capable host"
    - name: kernel
      assert: {kernel: "6.8", message: "AgentENV needs Linux >= 6.8"}

Every check given in one step must hold: ``path`` exists, ``command`` exits 0, the running ``kernel`` is at
least that version, ``file`` contains ``contains``, each variable in ``env`` is set and not empty, each
``program`` is on PATH, each kernel parameter in ``sysctl`` is at least the number given, and ``that``
(usually a template such as ``"{{ vars.n | int > 0 }}"``) renders true. Checks run on every apply.
"""

from __future__ import annotations

import platform
import re
import shlex
import shutil
from typing import Any

from pydantic import Field, field_validator, model_validator

from steps._support import remote
from steps._support.files import expand
from steps._support.process import run_process
from steps._support.words import FALSE_WORDS, TRUE_WORDS, argv_of, is_template
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind


def version_tuple(text: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a version like 6.8")
    return tuple(int(x) for x in match.group(0).split("."))


class AssertSpec(SpecModel):
    path: str | None = Field(None, description="A path (or glob) that must exist.")
    command: Command | None = Field(None, description="A command that must exit 0 (a string runs under `sh -c`).")
    kernel: str | None = Field(None, description="The lowest Linux kernel version accepted, e.g. `6.8`.")
    file: str | None = Field(None, description="A file that must contain `contains`.")
    contains: str | None = Field(None, description="The text `file` must contain.")
    env: str | list[str] | None = Field(None, description="Variables that must be set and not empty.")
    program: str | list[str] | None = Field(
        None, description="Programs that must be on PATH (looked up, not run: cheap on every apply)."
    )
    sysctl: dict[str, int] | None = Field(
        None,
        description="Kernel parameters and the lowest value accepted, read from /proc/sys "
        "(e.g. `{kernel.pid_max: 4194304}`): a read, so `plan` shows a failing one.",
    )
    that: str | bool | None = Field(None, description="A condition (usually a template) that must be true.")
    message: str | None = Field(None, description="The message shown when a check fails: say how to fix it.")
    host: str | None = Field(
        None,
        description="Check that machine instead, over ssh (a ~/.ssh/config alias, user@host or ssh://user@host:port): "
        "every check but `that` runs there, in one round trip.",
    )

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return remote.check_host(value)

    @field_validator("kernel")
    @classmethod
    def _kernel(cls, value: str | None) -> str | None:
        if value is not None and not is_template(value):
            version_tuple(value)
        return value

    @model_validator(mode="after")
    def _some_check(self) -> AssertSpec:
        checks = [self.path, self.command, self.kernel, self.file, self.env, self.program, self.sysctl, self.that]
        if all(c is None for c in checks):
            raise ValueError("give at least one check: path, command, kernel, file, env, program, sysctl or that")
        for key in self.sysctl or {}:
            if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_-]+)+", key):
                raise ValueError(f"sysctl: {key!r} is not a kernel parameter name like kernel.pid_max")
        if (self.file is None) != (self.contains is None):
            raise ValueError("`file` and `contains` go together")
        return self


def _sysctl_failure(key: str, lowest: int) -> list[str]:
    path = "/proc/sys/" + key.replace(".", "/")
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            text = fh.read().split()
    except OSError:
        return [f"{key} is not available here ({path} is missing: is its kernel module loaded?)"]
    try:
        value = int(text[0])
    except (IndexError, ValueError):
        return [f"{key} is {' '.join(text)!r}, not a number"]
    return [f"{key} is {value}, below {lowest}"] if value < lowest else []


class AssertStep(StepKind[AssertSpec]):
    kind = "assert"
    Spec = AssertSpec
    outputs = frozenset({"passed"})
    cosmetic_fields = frozenset({"message"})
    changes_system = False

    def remote_host(self) -> str | None:
        return self.spec.host

    def _failures(self, ctx: StepContext, run_commands: bool) -> list[str]:
        if self.spec.host:
            return self._remote_failures(ctx, self.spec.host, run_commands)
        spec = self.spec
        failures: list[str] = []
        if spec.path is not None and not expand(ctx.resolve(spec.path), ctx):
            failures.append(f"{spec.path} does not exist")
        if spec.kernel is not None:
            release = platform.release()
            try:
                if version_tuple(release) < version_tuple(spec.kernel):
                    failures.append(f"kernel {release} is older than {spec.kernel}")
            except ValueError as exc:
                failures.append(str(exc))
        if spec.file is not None and spec.contains is not None:
            target = ctx.resolve(spec.file)
            try:
                with open(target, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError as exc:
                failures.append(f"cannot read {spec.file}: {exc.strerror}")
            else:
                if spec.contains not in text:
                    failures.append(f"{spec.file} does not contain {spec.contains!r}")
        if spec.env is not None:
            names = [spec.env] if isinstance(spec.env, str) else spec.env
            for name in names:
                if not ctx.env.get(name):
                    failures.append(f"variable {name} is not set")
        if spec.program is not None:
            for program in [spec.program] if isinstance(spec.program, str) else spec.program:
                if shutil.which(program, path=ctx.env.get("PATH")) is None:
                    failures.append(f"{program} is not on PATH")
        for key, lowest in (spec.sysctl or {}).items():
            failures.extend(_sysctl_failure(key, lowest))
        if spec.that is not None:
            word = str(spec.that).strip().lower()
            if word in FALSE_WORDS:
                failures.append(f"condition is false: {spec.that!r}")
            elif word not in TRUE_WORDS:
                failures.append(f"condition is neither true nor false: {spec.that!r}")
        if spec.command is not None and run_commands:
            argv = argv_of(spec.command)
            try:
                result = run_process(argv, ctx, cwd=ctx.pipeline_dir, env=ctx.env)
            except StepError as exc:
                failures.append(exc.message)
            else:
                if result.returncode != 0:
                    shown = spec.command if isinstance(spec.command, str) else shlex.join(spec.command)
                    failures.append(f"`{shown}` exited with code {result.returncode}")
        return failures

    def _remote_failures(self, ctx: StepContext, host: str, run_commands: bool) -> list[str]:
        """The same checks on `host`: its files, kernel, PATH, /proc/sys and the variables a command there gets,
        read by one script (one round trip); then the command, if any and if asked."""
        spec = self.spec
        q = remote.ssh.quote
        lines = [remote.ssh.exports(remote.variables(ctx, {}))]
        if spec.path is not None:
            lines.append(f'{remote.any_match(spec.path)} || echo "P"')
        if spec.kernel is not None:
            lines.append('echo "K $(uname -r)"')
        last = ""  # a file's text, for a `contains` of more than one line: read at the end of the output
        if spec.file is not None and spec.contains is not None:
            target = remote.glob_word(spec.file) if spec.file.startswith("~") else q(spec.file)
            if "\n" in spec.contains:
                last = f"if [ -r {target} ]; then echo B; head -c 16777216 {target}; else echo R; fi"
            else:
                grep = f"grep -qF -- {q(spec.contains)} {target}"
                lines.append(f"if [ -r {target} ]; then {grep} || echo N; else echo R; fi")
        names = [spec.env] if isinstance(spec.env, str) else (spec.env or [])
        for index, name in enumerate(names):
            ok = f'[ -n "${{{name}:-}}" ]' if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "false"
            lines.append(f"{ok} || echo E{index}")
        programs = [spec.program] if isinstance(spec.program, str) else (spec.program or [])
        for index, program in enumerate(programs):
            lines.append(f"command -v {q(program)} >/dev/null 2>&1 || echo G{index}")
        keys = list(spec.sysctl or {})
        for index, key in enumerate(keys):
            path = "/proc/sys/" + key.replace(".", "/")
            lines.append(f'if [ -r {path} ]; then echo "S{index} $(cat {path})"; else echo "S{index} -"; fi')
        if last:
            lines.append(last)
        failures: list[str] = []
        where = f" on {host}"
        if len(lines) > 1:
            code, out = remote.ssh.quick(host, "\n".join(lines) + "\n")
            body = out.split("B\n", 1)[1] if "B\n" in out else None
            for line in (out.split("B\n", 1)[0] if body is not None else out).splitlines():
                tag, _, rest = line.partition(" ")
                if tag == "P":
                    failures.append(f"{spec.path} does not exist{where}")
                elif tag == "K":
                    try:
                        if version_tuple(rest) < version_tuple(spec.kernel or "0"):
                            failures.append(f"kernel {rest} is older than {spec.kernel}{where}")
                    except ValueError as exc:
                        failures.append(str(exc))
                elif tag == "N":
                    failures.append(f"{spec.file} does not contain {spec.contains!r}{where}")
                elif tag == "R":
                    failures.append(f"cannot read {spec.file}{where}")
                elif tag.startswith("E") and tag[1:].isdigit():
                    failures.append(f"variable {names[int(tag[1:])]} is not set{where}")
                elif tag.startswith("G") and tag[1:].isdigit():
                    failures.append(f"{programs[int(tag[1:])]} is not on PATH{where}")
                elif tag.startswith("S") and tag[1:].isdigit():
                    key = keys[int(tag[1:])]
                    lowest = (spec.sysctl or {})[key]
                    if rest == "-":
                        failures.append(f"{key} is not available{where} (is its kernel module loaded?)")
                    elif not rest.split() or not rest.split()[0].lstrip("-").isdigit():
                        failures.append(f"{key} is {rest!r}{where}, not a number")
                    elif int(rest.split()[0]) < lowest:
                        failures.append(f"{key} is {rest.split()[0]}{where}, below {lowest}")
            if body is not None and spec.contains is not None and spec.contains not in body:
                failures.append(f"{spec.file} does not contain {spec.contains!r}{where}")
        if spec.that is not None:
            word = str(spec.that).strip().lower()
            if word in FALSE_WORDS:
                failures.append(f"condition is false: {spec.that!r}")
            elif word not in TRUE_WORDS:
                failures.append(f"condition is neither true nor false: {spec.that!r}")
        if spec.command is not None and run_commands:
            result = remote.run(ctx, host, spec.command)
            if result.returncode != 0:
                failures.append(f"`{remote.shown(spec.command)}` exited with code {result.returncode}{where}")
        return failures

    def probe(self, ctx: StepContext) -> Probe:
        # A command check cannot be probed without running it: the check itself is the probe.
        if self.spec.command is not None:
            return Probe.missing("a command check runs on every apply")
        failures = self._failures(ctx, run_commands=False)
        return Probe.missing("; ".join(failures)) if failures else Probe.ok("all checks hold")

    def preview(self, ctx: StepContext) -> str | None:
        failures = self._failures(ctx, run_commands=False)  # commands run only on apply
        if not failures:
            return None
        detail = "; ".join(failures)
        return f"{self.spec.message} ({detail})" if self.spec.message else f"check failed: {detail}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        failures = self._failures(ctx, run_commands=True)
        if failures:
            detail = "; ".join(failures)
            if self.spec.message:
                raise StepError(f"{self.spec.message} ({detail})")
            raise StepError(f"check failed: {detail}")
        return {"passed": True}
