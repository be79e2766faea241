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

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from runner.util.text import FALSE_WORDS, TRUE_WORDS, is_template, one_line
from steps._support.facts import FactQuery
from steps._support.machine import machine_for
from steps.base import Command, Probe, SpecModel, StepContext, StepError, StepKind

# prints the modules it does not find, one a line; a broken parent package counts as not found
FIND_SPECS = (
    "import importlib.util, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        found = importlib.util.find_spec(name) is not None\n"
    "    except (ImportError, ValueError):\n"
    "        found = False\n"
    "    if not found:\n"
    "        print(name)\n"
)


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
    imports: str | list[str] | None = Field(
        None,
        description="Python modules `python` must find (looked up with importlib.util.find_spec, not imported: "
        "a read, so `plan` shows a missing one), e.g. what a launcher imports before it does anything.",
    )
    python: str = Field("python3", description="The interpreter `imports` are looked up with.")
    that: str | bool | None = Field(None, description="A condition (usually a template) that must be true.")
    message: str | None = Field(None, description="The message shown when a check fails: say how to fix it.")

    @field_validator("kernel")
    @classmethod
    def _kernel(cls, value: str | None) -> str | None:
        if value is not None and not is_template(value):
            version_tuple(value)
        return value

    @model_validator(mode="after")
    def _some_check(self) -> AssertSpec:
        checks = [self.path, self.command, self.kernel, self.file, self.env, self.program, self.sysctl, self.that]
        if all(c is None for c in [*checks, self.imports]):
            raise ValueError(
                "give at least one check: path, command, kernel, file, env, program, sysctl, imports or that"
            )
        for module in [self.imports] if isinstance(self.imports, str) else self.imports or []:
            if not is_template(module) and not re.fullmatch(
                r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", module
            ):
                raise ValueError(f"imports: {module!r} is not a module name like ray or torch.nn")
        for key in self.sysctl or {}:
            if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_-]+)+", key):
                raise ValueError(f"sysctl: {key!r} is not a kernel parameter name like kernel.pid_max")
        if (self.file is None) != (self.contains is None):
            raise ValueError("`file` and `contains` go together")
        return self


def _sysctl_failure(key: str, lowest: int, text: str | None, where: str) -> list[str]:
    if text is None:
        path = "/proc/sys/" + key.replace(".", "/")
        return [f"{key} is not available{where or ' here'} ({path} is missing: is its kernel module loaded?)"]
    parts = text.split()
    if not parts or not parts[0].lstrip("-").isdigit():
        return [f"{key} is {' '.join(parts)!r}{where}, not a number"]
    value = int(parts[0])
    return [f"{key} is {value}{where}, below {lowest}"] if value < lowest else []


class AssertStep(StepKind[AssertSpec]):
    kind = "assert"
    Spec = AssertSpec
    outputs = frozenset({"passed"})
    cosmetic_fields = frozenset({"message"})
    changes_system = False
    on_machine = True  # every check but `that` runs on the step's machine, the reads in one round trip

    def _failures(self, ctx: StepContext, run_commands: bool) -> list[str]:
        """Every check that does not hold, in words, on the step's machine (this one, or `host`'s: every check
        but `that` runs there, the reads in one round trip, then the command)."""
        spec = self.spec
        machine = machine_for(ctx.host)
        machine.check()  # a machine that cannot be reached is that, not a failed check
        where = machine.where
        names = [spec.env] if isinstance(spec.env, str) else (spec.env or [])
        programs = [spec.program] if isinstance(spec.program, str) else (spec.program or [])
        query = FactQuery(
            paths=[spec.path] if spec.path is not None else [],
            kernel=spec.kernel is not None,
            contains=[(spec.file, spec.contains)] if spec.file is not None and spec.contains is not None else [],
            env=list(names),
            programs=list(programs),
            sysctl=list(spec.sysctl or {}),
        )
        found = machine.facts(ctx, query)
        failures = [f"{path} does not exist{where}" for path in found.missing_paths]
        if spec.kernel is not None:
            try:
                if version_tuple(found.kernel) < version_tuple(spec.kernel):
                    failures.append(f"kernel {found.kernel} is older than {spec.kernel}{where}")
            except ValueError as exc:
                failures.append(str(exc))
        for (file, text), answer in zip(query.contains, found.contains, strict=True):
            if answer == "absent":
                failures.append(f"{file} does not contain {text!r}{where}")
            elif answer.startswith("unreadable:"):
                why = answer.removeprefix("unreadable:")
                failures.append(f"cannot read {file}{where}" + (f": {why}" if why else ""))
        failures += [f"variable {name} is not set{where}" for name in found.unset]
        failures += [f"{program} is not on PATH{where}" for program in found.not_found]
        for key, lowest in (spec.sysctl or {}).items():
            failures.extend(_sysctl_failure(key, lowest, found.sysctl.get(key), where))
        if spec.that is not None:
            word = str(spec.that).strip().lower()
            if word in FALSE_WORDS:
                failures.append(f"condition is false: {spec.that!r}")
            elif word not in TRUE_WORDS:
                failures.append(f"condition is neither true nor false: {spec.that!r}")
        if spec.imports is not None:
            failures += self._missing_modules(ctx, machine)
        if spec.command is not None and run_commands:
            try:
                result = machine.run(ctx, spec.command)
            except StepError as exc:
                failures.append(exc.message)
            else:
                if result.returncode != 0:
                    failures.append(f"`{one_line(spec.command)}` exited with code {result.returncode}{where}")
        return failures

    def _missing_modules(self, ctx: StepContext, machine: Any) -> list[str]:
        modules = [self.spec.imports] if isinstance(self.spec.imports, str) else list(self.spec.imports or [])
        try:
            found = machine.run(ctx, [self.spec.python, "-c", FIND_SPECS, *modules], quiet=True)
        except StepError as exc:
            return [f"cannot run {self.spec.python}{machine.where}: {exc.message}"]
        if found.returncode == 127 or (found.returncode != 0 and not found.stdout.strip()):
            return [f"{self.spec.python} does not run{machine.where} (exit {found.returncode})"]
        missing = [line for line in found.stdout.split() if line]
        if not missing:
            return []
        return [
            f"{self.spec.python}{machine.where} does not find {', '.join(missing)}: install them into it, or point "
            "`python` at the interpreter that has them"
        ]

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
