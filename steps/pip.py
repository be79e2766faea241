"""pip: packages installed into an interpreter or a virtual environment, checked without running pip.

Example::

    - name: e2b
      pip:
        venv: .venv                     # created when missing; or `python: /usr/bin/python3`
        packages: ["e2b<2.51"]          # the server image predates AgentENV PR #306
    - name: tbench2-env
      pip:
        venv: .venv
        editable: [OpenEnv/envs/tbench2_env]
        packages: [typed-argument-parser, openai]

Installs go through uv when it is there (the `uv` package, a dependency of runner, brings it), which is
an order of magnitude faster than pip on a cold venv; pip is the fallback and stays the reference: the same
requirements, constraints, indexes and markers mean the same with either (pip's own configuration — pip.conf
and PIP_* — is passed on to uv), and `installer: pip` keeps pip. A venv the step creates for uv has no pip in
it (`python -m venv --without-pip`, 0.1 s instead of 3 s); add `pip` to `packages` to have one.

The probe asks the interpreter once (one process, shared by every pip step on it in a run) what is
installed, and checks each requirement with `packaging`: name, version specifier, markers, extras, and for an
editable install the source path it points at; a verdict of "satisfied" is kept beside what is installed, so a
converged probe (nothing changed on the interpreter's path) checks nothing. A converged apply never runs an
installer, and neither does a first apply that finds everything already satisfied. A requirements file's
content, and an editable project's pyproject.toml / setup.cfg / setup.py, are part of the fingerprint.
Outputs: `versions` (name -> version) and `python`. With the step's `host:` the install is made there, with
that machine's interpreter and pip: paths are paths there, and the check is one round trip.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runner.util.text import is_template
from steps._support.installer import choose_uv, pip_settings, uv_arguments
from steps._support.machine import machine_for
from steps._support.pip_env import Env, PipFact
from steps._support.python_env import (
    SIMPLE_REQUIREMENT,
    canonical,
    check,
    check_editable,
    editable_dist,
    forget_query,
    inherit_files,
    known_satisfied,
    merge,
    query,
    raise_failure,
    remember_satisfied,
    verdict_key,
    write_inherit,
)
from steps.base import Change, Probe, SpecModel, StepContext, StepError, StepKind, machine_named


class PipSpec(SpecModel):
    packages: list[str] = Field(default_factory=list, description="Requirement strings, e.g. `e2b<2.51`, `openai`.")
    requirements: list[str] = Field(default_factory=list, description="Requirements files (`-r`), pipeline-relative.")
    editable: list[str] = Field(default_factory=list, description="Project paths installed editable (`-e`).")
    python: str | None = Field(
        None, description="Interpreter to install into (or to make `venv` with); default `python3` on PATH."
    )
    venv: str | None = Field(None, description="Virtual environment to install into; created when missing.")
    inherit_packages: bool = Field(
        False,
        description="The venv also sees the packages of the interpreter that made it (its site-packages, named in "
        "a .pth file; the venv's own come first), so it holds only what this step adds.",
    )
    index_url: str | None = Field(None, description="`--index-url`.")
    extra_index_urls: list[str] = Field(default_factory=list, description="`--extra-index-url`, each.")
    find_links: list[str] = Field(default_factory=list, description="`--find-links`, each (paths or URLs).")
    no_index: bool = Field(False, description="`--no-index`: only `find_links`.")
    constraints: list[str] = Field(default_factory=list, description="Constraints files (`-c`).")
    no_build_isolation: bool = Field(False, description="`--no-build-isolation`.")
    pre: bool = Field(False, description="`--pre`: allow pre-releases.")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More arguments for the installer: `pip install`'s (so `installer: auto` then uses pip), or "
        "`uv pip install`'s with `installer: uv`.",
    )
    installer: Literal["auto", "uv", "pip"] = Field(
        "auto",
        description="What installs: `auto` uses uv when runner finds it (the `uv` package beside runner, or `uv` on "
        "PATH) and pip otherwise, or when pip's configuration sets something uv cannot be told; `uv` insists on "
        "uv; `pip` keeps pip. With `inherit_packages`, uv installs only what is missing (uv does not see inherited "
        "packages) and pip finishes whatever uv leaves unsatisfied. How, not what: not in the fingerprint.",
    )

    @field_validator("packages")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for item in value:
            if is_template(item) or SIMPLE_REQUIREMENT.fullmatch(item):
                continue  # a template is checked again once rendered; a plain `name>=1.2` needs no parser
            from packaging.requirements import InvalidRequirement, Requirement

            try:
                Requirement(item)
            except InvalidRequirement as exc:
                if item.startswith((".", "/", "~")) or item.endswith((".whl", ".tar.gz", ".zip")):
                    raise ValueError(
                        f"{item!r} is a path, not a requirement: install a project directory with "
                        f"`editable: [{item}]`, or name it, `mypkg @ file:///abs/path` (a wheel or sdist alike)"
                    ) from None
                raise ValueError(f"{item!r} is not a requirement: {exc}") from None
        return value

    @model_validator(mode="after")
    def _something(self, info: ValidationInfo) -> PipSpec:
        if not (self.packages or self.requirements or self.editable):
            raise ValueError("give at least one of `packages`, `requirements` or `editable`")
        if machine_named(info) and self.inherit_packages:
            raise ValueError("`inherit_packages` is not available with `host` yet: give the venv what it needs")
        if machine_named(info) and self.installer == "uv":
            raise ValueError("`installer: uv` is not available with `host` yet: pip installs there (`auto` or `pip`)")
        return self


class PipStep(StepKind[PipSpec]):
    local_probe = True
    on_machine = True  # with the step's `host:`, that machine's interpreter, its paths and its pip
    kind = "pip"
    Spec = PipSpec
    cosmetic_fields = frozenset({"installer"})
    outputs = frozenset({"versions", "python", "host"})

    _env: Env | None = None

    # ---- what the machine has: one fact (in-process here, one round trip there) -----------------------------

    def _fact(self, ctx: StepContext) -> PipFact:
        spec = self.spec
        where = machine_for(ctx.host).where
        return PipFact(spec.python, spec.venv, spec.requirements, spec.constraints, spec.editable, where)

    def env(self, ctx: StepContext) -> Env:
        """The interpreter and the inputs as the step's machine has them, looked at once until something changes."""
        if self._env is None:
            self._env = machine_for(ctx.host).fact(ctx, self._fact(ctx))
        return self._env

    def _forget(self, ctx: StepContext) -> None:
        """After a change to the interpreter: look again (here its kept listing goes too)."""
        if self._env is not None and self._env.cache is not None:
            forget_query(self._env.python, self._env.cache)
        self._env = None

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        env = self.env(ctx)
        if env.missing and ctx.host:  # read there before anything runs (a venv made, pip asked); plan agrees
            raise StepError(
                f"requirements file {env.missing[0]} is missing{machine_for(ctx.host).where}",
                hint=f"the requirements and constraints paths of a pip step with `host:` are read on {ctx.host}",
            )
        return env.fingerprint

    # ---- checking ---------------------------------------------------------------------------------------

    def _lines(self, env: Env) -> tuple[list[str], list[str]]:
        """(requirement lines, editables as python_env.check_editable takes them) from the spec and the
        requirements files as the machine has them (options such as `--index-url` left out)."""
        spec = self.spec
        reqs = list(spec.packages)
        editables = [e for e in (env.editables.get(p) for p in spec.editable) if e is not None]
        seen: set[str] = set()

        def visit(key: str, depth: int) -> None:
            text = env.files.get(key)
            if text is None or key in seen or depth > 10:
                return
            seen.add(key)
            base = posixpath.dirname(key)
            for raw in text.splitlines():
                line = raw.split(" #", 1)[0].strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith(("-r ", "--requirement ")):
                    visit(str(Path(base, line.split(None, 1)[1]).resolve()), depth + 1)
                elif line.startswith(("-e ", "--editable ")) and env.here:  # a path beside the file, here
                    target = line.split(None, 1)[1]
                    editables.append(str((Path(base) / target).resolve()) if "://" not in target else target)
                elif not line.startswith("-"):
                    reqs.append(line)

        for path in spec.requirements:
            visit(env.keys.get(path, path), 0)
        return reqs, editables

    def unsatisfied(self, ctx: StepContext, wanted: list[str] | None = None) -> list[str]:
        """Why the environment does not satisfy the spec: one line per problem, empty when it does. `wanted`
        collects what would fix each: a requirement (marker evaluated and dropped) or `-e PATH`."""
        env = self.env(ctx)
        if env.error is not None:
            raise env.error
        where = machine_for(ctx.host).where
        problems = [f"requirements file {p} is missing{where}" for p in env.missing]
        data = env.data()
        reqs, editables = self._lines(env)
        key = verdict_key(reqs, editables)
        if not problems and known_satisfied(data, key):
            return []
        from packaging.requirements import InvalidRequirement, Requirement

        dists: dict[str, Any] = data["dists"]
        marker_env: dict[str, str] = data["env"]
        checked: set[str] = set()
        for line in reqs:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue  # URLs and the like that packaging does not parse: the fingerprint covers them
            problems += check(req, dists, marker_env, checked, wanted=wanted)
        for path in self.spec.editable:
            if env.editables.get(path) is None:
                problems.append(f"{path} does not exist{where}")
        for path in editables:
            problems += check_editable(path, dists, marker_env, checked, wanted)
        if not problems and env.cache is not None:
            remember_satisfied(env.python, data, key, env.cache)
        return problems

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[Change]) -> list[Change]:
        """The spec changed: say what that means for this environment (`e2b: 2.63.0 installed, wants <2.51`)."""
        if not self.env(ctx).exists:
            return changes
        problems = self.unsatisfied(ctx)
        return changes + [Change.fact(p) for p in problems or ["(already satisfied: pip will not run)"]]

    def probe(self, ctx: StepContext) -> Probe:
        env = self.env(ctx)
        where = machine_for(ctx.host).where
        if not env.exists:
            return Probe.missing(f"{env.python} does not exist{where}" + (" (no venv yet)" if self.spec.venv else ""))
        if self.spec.venv and self.spec.inherit_packages and not self._inherit_files(ctx):
            return Probe.missing("the venv does not inherit its base interpreter's packages yet")
        problems = self.unsatisfied(ctx)
        if problems:
            return Probe.drift("; ".join(problems), tuple(problems))
        return Probe.ok(f"satisfied{where}" if where else "")

    # ---- apply ----------------------------------------------------------------------------------------

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        """With --purge: the step's `venv:` (a directory with a pyvenv.cfg; packages installed into a `python:`
        that is not the step's own venv are left alone)."""
        if not purge or not self.spec.venv:
            return None
        machine = machine_for(ctx.host)
        venv = machine.path(ctx, self.spec.venv)
        code, _ = machine.ask(ctx, ["sh", "-c", '[ -f "$1/pyvenv.cfg" ] && [ ! -L "$1" ]', "-", venv])
        if code != 0:
            return None
        if dry_run:
            return f"would remove the venv {venv}{machine.where}"
        machine.remove_tree(ctx, venv)
        forget_query(posixpath.join(venv, "bin", "python"), ctx.state_dir / "cache")
        return f"removed the venv {venv}{machine.where}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.spec
        machine = machine_for(ctx.host)
        made_venv = False
        uv: str | None = None
        if spec.venv:
            root = machine.path(ctx, spec.venv)
            made_venv = not self.env(ctx).exists
            uv = self._choose(ctx, root)
            self._ensure_venv(ctx, root, with_pip=uv is None)
        self._forget(ctx)
        env = self.env(ctx)
        if not env.exists:
            raise StepError(
                f"no interpreter {env.python!r}{machine.where}",
                hint="give `python:` as a full path there, or install Python 3 there",
            )
        wanted: list[str] = []
        problems = self.unsatisfied(ctx, wanted)
        ctx.changed = made_venv or bool(problems)
        if not problems:
            ctx.on_output("every requirement is already satisfied: nothing installed")
            return self._outputs(ctx)
        ctx.on_output("to install: " + "; ".join(problems))
        if not spec.venv:
            uv = self._choose(ctx, env.data().get("prefix", ""))
        left = problems
        if uv is not None:
            left = self._install_uv(ctx, uv, problems, wanted)
        if left:
            if uv is not None:
                ctx.on_output("uv left: " + "; ".join(left) + " — pip finishes")
            self._install_pip(ctx)
            left = self._recheck(ctx)
        if left:
            raise StepError(
                f"the install finished but the environment{machine.where} still does not satisfy the spec: "
                + "; ".join(left),
                hint="a conflicting constraint or a package that installs under another name",
            )
        return self._outputs(ctx)

    def _recheck(self, ctx: StepContext, wanted: list[str] | None = None) -> list[str]:
        self._forget(ctx)
        return self.unsatisfied(ctx, wanted)

    # ---- which installer ------------------------------------------------------------------------------

    def _settings(self, ctx: StepContext, prefix: str) -> tuple[list[str], dict[str, str], list[str]]:
        """pip's configuration for an interpreter with this sys.prefix, said to uv (flags, variables, what
        uv cannot be told)."""
        return uv_arguments(pip_settings(ctx.env, prefix), has_index=bool(self.spec.index_url))

    def _choose(self, ctx: StepContext, prefix: str) -> str | None:
        """The uv binary to install with, or None for pip (and why, in the step's output). uv is runner's, so
        this machine's: on another, pip installs (`installer: uv` with `host:` is refused at load)."""
        if self.spec.installer == "pip" or ctx.host:
            return None
        config = None if self.spec.extra_args else self._settings(ctx, prefix)[2]
        return choose_uv(self.spec.installer, ctx.env, bool(self.spec.extra_args), config, ctx.on_output)

    # ---- installing -----------------------------------------------------------------------------------

    def _path(self, ctx: StepContext, path: str) -> str:
        return machine_for(ctx.host).path(ctx, path)

    def _index_args(self, ctx: StepContext) -> list[str]:
        """The step's own index, link and constraint flags (spelled the same for pip and uv)."""
        spec = self.spec
        argv: list[str] = []
        if spec.index_url:
            argv += ["--index-url", spec.index_url]
        for url in spec.extra_index_urls:
            argv += ["--extra-index-url", url]
        for link in spec.find_links:
            argv += ["--find-links", link if "://" in link else self._path(ctx, link)]
        if spec.no_index:
            argv.append("--no-index")
        if spec.no_build_isolation:
            argv.append("--no-build-isolation")
        for path in spec.constraints:
            argv += ["-c", self._path(ctx, path)]
        return argv

    def _targets(self, ctx: StepContext) -> list[str]:
        spec = self.spec
        argv = list(spec.packages)
        for path in spec.requirements:
            argv += ["-r", self._path(ctx, path)]
        for path in spec.editable:
            argv += ["-e", self._path(ctx, path)]
        return argv

    def _run(self, ctx: StepContext, argv: list[str], env: dict[str, str] | None = None) -> Any:
        """An installer's command on the step's machine, without the variables that would point it elsewhere."""
        return machine_for(ctx.host).run(ctx, argv, env={"PIP_NO_INPUT": "1", **(env or {})}, drop=CHILD_DROP)

    def _install_uv(self, ctx: StepContext, uv: str, left: list[str], wanted: list[str]) -> list[str]:
        """Install with uv; what is still unsatisfied after it (empty when uv did it all). In a venv that
        inherits packages uv would not see them and would install its own copies, so there uv installs only
        what is missing, without dependencies, and again for what that still lacks, a few rounds at most."""
        spec = self.spec
        python = self.env(ctx).python
        prefix = self._path(ctx, spec.venv) if spec.venv else self.env(ctx).data()["prefix"]
        config, variables, _ = self._settings(ctx, prefix)
        flags = config + self._index_args(ctx)
        if spec.pre:
            flags += ["--prerelease", "allow"]
        if flags.count("--extra-index-url") + ("--index-url" in flags) > 0:
            flags += ["--index-strategy", "unsafe-best-match"]  # pip's: the best version from every index
        flags += list(spec.extra_args) if spec.installer == "uv" else []
        base = [uv, "pip", "install", "--python", python, *flags]
        ctx.on_output(f"installing with uv ({uv})")
        if not (spec.venv and spec.inherit_packages):
            result = self._run(ctx, [*base, *self._targets(ctx)], variables)
            if result.returncode != 0:
                return self._uv_failed(ctx, result)
            return self._recheck(ctx)
        for _ in range(8):
            if not left or not wanted:
                return left
            argv = [*base, "--no-deps"]
            for item in merge(wanted):
                argv += ["-e", item[3:]] if item.startswith("-e ") else [item]
            result = self._run(ctx, argv, variables)
            if result.returncode != 0:
                return self._uv_failed(ctx, result)
            wanted = []
            left = self._recheck(ctx, wanted)
        return left

    def _uv_failed(self, ctx: StepContext, result: Any) -> list[str]:
        """uv failed: with `installer: uv` that is the step's failure; with `auto`, pip tries."""
        if self.spec.installer == "uv":
            raise_failure("uv pip install", result)
        errors = [line.strip() for line in result.tail if line.strip()]
        ctx.on_output("uv failed" + (f" ({errors[-1][:200]})" if errors else "") + ": trying pip")
        return self._recheck(ctx) or ["uv failed"]

    def _ensure_pip(self, ctx: StepContext) -> None:
        """pip in the target interpreter (a venv made for uv has none): ensurepip, which needs no network."""
        env = self.env(ctx)
        if "pip" in env.data()["dists"]:
            return
        ctx.on_output(f"{env.python} has no pip: installing it with ensurepip")
        result = self._run(ctx, [env.python, "-m", "ensurepip", "--default-pip"])
        self._forget(ctx)
        if result.returncode != 0:
            raise StepError(f"{env.python} has no pip and ensurepip failed", output_tail="\n".join(result.tail))

    def _install_pip(self, ctx: StepContext) -> None:
        spec = self.spec
        self._ensure_pip(ctx)
        python = self.env(ctx).python
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *self._index_args(ctx)]
        if spec.pre:
            argv.append("--pre")
        argv += list(spec.extra_args) + self._targets(ctx)
        ctx.on_output("installing with pip")
        result = self._run(ctx, argv)
        if result.returncode != 0:
            raise_failure(f"pip install{machine_for(ctx.host).where}", result)

    def _ensure_venv(self, ctx: StepContext, root: str, with_pip: bool = True) -> None:
        machine = machine_for(ctx.host)
        there = machine.entry(ctx, posixpath.join(root, "pyvenv.cfg")) == "file"
        if not (there and self.env(ctx).exists):
            base = self._fact(ctx).base(ctx) if not ctx.host else (self.spec.python or "python3")
            ctx.on_output(f"creating virtual environment {root} with {base}" + ("" if with_pip else " (no pip)"))
            argv = [base, "-m", "venv", "--clear", *([] if with_pip else ["--without-pip"]), root]
            result = machine.run(ctx, argv, drop=CHILD_DROP)
            if result.returncode != 0:
                raise StepError(f"creating the venv {root}{machine.where} failed", output_tail="\n".join(result.tail))
            self._forget(ctx)
        self._write_inherit(ctx, Path(root))

    def _inherit_files(self, ctx: StepContext) -> list[Path]:
        assert self.spec.venv
        return inherit_files(ctx.resolve(self.spec.venv))

    def _write_inherit(self, ctx: StepContext, root: Path) -> None:
        """`inherit_packages` (this machine only: refused with `host:` at load)."""
        if not ctx.host:
            base = self._fact(ctx).base(ctx) if self.spec.inherit_packages else ""
            write_inherit(root, base, ctx.on_output)

    def note(self, outputs: dict[str, Any]) -> str:
        """What the requirements resolved to (e.g. the e2b an expression pinned), a few at most."""
        versions = outputs.get("versions")
        if not isinstance(versions, dict) or not versions:
            return ""
        shown = [f"{name} {version}" for name, version in list(versions.items())[:4]]
        more = len(versions) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def _outputs(self, ctx: StepContext) -> dict[str, Any]:
        from packaging.requirements import InvalidRequirement, Requirement

        env = self.env(ctx)
        dists = env.data()["dists"]
        reqs, editables = self._lines(env)
        out: dict[str, str] = {}
        for line in reqs:
            try:
                name = canonical(Requirement(line).name)
            except InvalidRequirement:
                continue
            if name in dists:
                out[dists[name]["name"]] = dists[name]["version"]
        for path in editables:
            found = editable_dist(path, dists)
            if found:
                out[found["name"]] = found["version"]
        outputs = {"versions": dict(sorted(out.items())), "python": env.python}
        return {**outputs, "host": ctx.host} if ctx.host else outputs


CHILD_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")  # what would point an installer at another environment


__all__ = ["PipSpec", "PipStep", "canonical", "forget_query", "query"]
