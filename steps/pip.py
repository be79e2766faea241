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

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from runner.util.interpreter import this_python
from runner.util.text import is_template
from steps._support.files import content_digest
from steps._support.installer import find_uv, pip_settings, uv_arguments
from steps._support.process import run_process
from steps._support.python_env import (
    SIMPLE_REQUIREMENT,
    canonical,
    check,
    check_editable,
    editable_dist,
    forget_query,
    known_satisfied,
    merge,
    query,
    raise_failure,
    remember_satisfied,
    verdict_key,
)
from steps.base import Change, Probe, SpecModel, StepContext, StepError, StepKind, machine_named

INHERIT_PTH = "_runner_inherit.pth"


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

    _remote: Any = None

    def away(self, ctx: StepContext) -> Any:
        """The install on another machine (the step's `host`), or None."""
        if not ctx.host:
            return None
        if self._remote is None:
            from steps._support.remote_pip import RemotePip

            self._remote = RemotePip(self, ctx.host)
        return self._remote

    # ---- where ----------------------------------------------------------------------------------------

    def base_python(self, ctx: StepContext) -> str:
        spec = self.spec
        name = spec.python or "python3"
        if "/" in name:
            return str(ctx.resolve(name))
        found = shutil.which(name, path=ctx.env.get("PATH"))
        if found:
            return found
        if spec.python is None:
            return this_python()
        raise StepError(f"no interpreter {name!r} on PATH", hint="give `python:` as a full path")

    def target_python(self, ctx: StepContext) -> str:
        spec = self.spec
        if spec.venv:
            return str(ctx.resolve(spec.venv) / "bin" / "python")
        return self.base_python(ctx)

    # ---- what -----------------------------------------------------------------------------------------

    def _files(self, ctx: StepContext) -> tuple[list[str], list[str], list[Path]]:
        """(requirement lines, editable paths, files read) from the spec and its requirements files."""
        spec = self.spec
        reqs = list(spec.packages)
        editables = [str(ctx.resolve(p)) for p in spec.editable]
        read: list[Path] = []

        def visit(path: Path, depth: int) -> None:
            if depth > 10 or path in read:
                return
            read.append(path)
            try:
                lines = path.read_text(encoding="utf-8").splitlines()
            except OSError as exc:
                raise StepError(f"cannot read requirements file {path}: {exc.strerror}") from None
            for raw in lines:
                line = raw.split(" #", 1)[0].strip()
                if not line or line.startswith("#"):
                    continue
                if line.startswith(("-r ", "--requirement ")):
                    visit((path.parent / line.split(None, 1)[1]).resolve(), depth + 1)
                elif line.startswith(("-e ", "--editable ")):
                    target = line.split(None, 1)[1]
                    editables.append(str((path.parent / target).resolve()) if "://" not in target else target)
                elif line.startswith("-"):
                    continue  # options: part of the fingerprint through the file's content
                else:
                    reqs.append(line)

        for item in spec.requirements:
            visit(ctx.resolve(item), 0)
        return reqs, editables, read

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        if self.away(ctx):
            return self.away(ctx).fingerprint_extra(ctx)
        spec = self.spec
        files = [ctx.resolve(p) for p in spec.requirements + spec.constraints]
        for path in spec.editable:
            root = ctx.resolve(path)
            files += [root / n for n in ("pyproject.toml", "setup.cfg", "setup.py") if (root / n).exists()]
        try:
            _, _, read = self._files(ctx)
        except StepError:
            read = []
        files += [p for p in read if p not in files]
        return {"files": content_digest(files, ctx)} if files else {}

    # ---- checking ---------------------------------------------------------------------------------------

    def unsatisfied(self, ctx: StepContext, python: str, wanted: list[str] | None = None) -> list[str]:
        """Why the environment does not satisfy the spec: one line per problem, empty when it does. `wanted`
        collects what would fix each: a requirement (marker evaluated and dropped) or `-e PATH`."""
        data = query(python, ctx.env, ctx.state_dir / "cache")
        reqs, editables, _ = self._files(ctx)
        key = verdict_key(reqs, editables)
        if known_satisfied(data, key):
            return []
        from packaging.requirements import InvalidRequirement, Requirement

        dists: dict[str, Any] = data["dists"]
        env: dict[str, str] = data["env"]
        problems: list[str] = []
        seen: set[str] = set()
        for line in reqs:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue  # URLs and the like that packaging does not parse: the fingerprint covers them
            problems += check(req, dists, env, seen, wanted=wanted)
        for path in editables:
            problems += check_editable(path, dists, env, seen, wanted)
        if not problems:
            remember_satisfied(python, data, key, ctx.state_dir / "cache")
        return problems

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[Change]) -> list[Change]:
        """The spec changed: say what that means for this environment (`e2b: 2.63.0 installed, wants <2.51`)."""
        if self.away(ctx):
            return changes
        python = self.target_python(ctx)
        if "/" in python and not Path(python).exists():
            return changes
        problems = self.unsatisfied(ctx, python)
        return changes + [Change.fact(p) for p in problems or ["(already satisfied: pip will not run)"]]

    def probe(self, ctx: StepContext) -> Probe:
        if self.away(ctx):
            return self.away(ctx).probe(ctx)
        python = self.target_python(ctx)
        if not Path(python).exists() and "/" in python:
            return Probe.missing(f"{python} does not exist" + (" (no venv yet)" if self.spec.venv else ""))
        if self.spec.venv and self.spec.inherit_packages and not self._inherit_files(ctx):
            return Probe.missing("the venv does not inherit its base interpreter's packages yet")
        problems = self.unsatisfied(ctx, python)
        if problems:
            return Probe.drift("; ".join(problems), tuple(problems))
        return Probe.ok()

    # ---- apply ----------------------------------------------------------------------------------------

    def teardown(self, ctx: StepContext, purge: bool, dry_run: bool) -> str | None:
        """With --purge: the step's `venv:` (a directory with a pyvenv.cfg; packages installed into a `python:`
        that is not the step's own venv are left alone)."""
        if not purge or not self.spec.venv:
            return None
        if self.away(ctx):
            return self.away(ctx).teardown(ctx, dry_run)
        venv = ctx.resolve(self.spec.venv)
        if venv.is_symlink() or not (venv / "pyvenv.cfg").is_file():
            return None
        if dry_run:
            return f"would remove the venv {venv}"
        shutil.rmtree(venv)
        forget_query(str(venv / "bin" / "python"), ctx.state_dir / "cache")
        return f"removed the venv {venv}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        if self.away(ctx):
            return self.away(ctx).apply(ctx)
        spec = self.spec
        made_venv = False
        uv: str | None = None
        if spec.venv:
            root = ctx.resolve(spec.venv)
            made_venv = not (root / "bin" / "python").exists()
            uv = self._choose(ctx, str(root))
            self._ensure_venv(ctx, with_pip=uv is None)
        python = self.target_python(ctx)
        forget_query(python, ctx.state_dir / "cache")
        wanted: list[str] = []
        problems = self.unsatisfied(ctx, python, wanted)
        ctx.changed = made_venv or bool(problems)
        if not problems:
            ctx.on_output("every requirement is already satisfied: nothing installed")
            return {"versions": self._versions(ctx, python), "python": python}
        ctx.on_output("to install: " + "; ".join(problems))
        if not spec.venv:
            uv = self._choose(ctx, query(python, ctx.env, ctx.state_dir / "cache")["prefix"])
        left = problems
        if uv is not None:
            left = self._install_uv(ctx, python, uv, problems, wanted)
        if left:
            if uv is not None:
                ctx.on_output("uv left: " + "; ".join(left) + " — pip finishes")
            self._install_pip(ctx, python)
            left = self._recheck(ctx, python)
        if left:
            raise StepError(
                "the install finished but the environment still does not satisfy the spec: " + "; ".join(left),
                hint="a conflicting constraint or a package that installs under another name",
            )
        return {"versions": self._versions(ctx, python), "python": python}

    def _recheck(self, ctx: StepContext, python: str, wanted: list[str] | None = None) -> list[str]:
        forget_query(python, ctx.state_dir / "cache")
        return self.unsatisfied(ctx, python, wanted)

    # ---- which installer ------------------------------------------------------------------------------

    def _settings(self, ctx: StepContext, prefix: str) -> tuple[list[str], dict[str, str], list[str]]:
        """pip's configuration for an interpreter with this sys.prefix, said to uv (flags, variables, what
        uv cannot be told)."""
        return uv_arguments(pip_settings(ctx.env, prefix), has_index=bool(self.spec.index_url))

    def _choose(self, ctx: StepContext, prefix: str) -> str | None:
        """The uv binary to install with, or None for pip (and why, in the step's output)."""
        spec = self.spec
        if spec.installer == "pip":
            return None
        uv = find_uv(ctx.env)
        if uv is None:
            if spec.installer == "uv":
                raise StepError(
                    "installer: uv, but there is no uv: neither the `uv` package beside runner nor `uv` on PATH",
                    hint="pip install uv (a dependency of runner), or drop `installer: uv` to fall back to pip",
                    field="installer",
                )
            ctx.on_output("no uv found (pip install uv): installing with pip")
            return None
        if spec.installer == "auto":
            if spec.extra_args:
                ctx.on_output("extra_args are pip's arguments: installing with pip")
                return None
            _, _, left = self._settings(ctx, prefix)
            if left:
                ctx.on_output(f"pip's configuration sets {', '.join(left)}, which uv is not told: installing with pip")
                return None
        return uv

    # ---- installing -----------------------------------------------------------------------------------

    def _child_env(self, ctx: StepContext) -> dict[str, str]:
        env = {k: v for k, v in ctx.env.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.pop("VIRTUAL_ENV", None)
        return env

    def _index_args(self, ctx: StepContext) -> list[str]:
        """The step's own index, link and constraint flags (spelled the same for pip and uv)."""
        spec = self.spec
        argv: list[str] = []
        if spec.index_url:
            argv += ["--index-url", spec.index_url]
        for url in spec.extra_index_urls:
            argv += ["--extra-index-url", url]
        for link in spec.find_links:
            argv += ["--find-links", link if "://" in link else str(ctx.resolve(link))]
        if spec.no_index:
            argv.append("--no-index")
        if spec.no_build_isolation:
            argv.append("--no-build-isolation")
        for path in spec.constraints:
            argv += ["-c", str(ctx.resolve(path))]
        return argv

    def _targets(self, ctx: StepContext) -> list[str]:
        spec = self.spec
        argv = list(spec.packages)
        for path in spec.requirements:
            argv += ["-r", str(ctx.resolve(path))]
        for path in spec.editable:
            argv += ["-e", str(ctx.resolve(path))]
        return argv

    def _install_uv(self, ctx: StepContext, python: str, uv: str, left: list[str], wanted: list[str]) -> list[str]:
        """Install with uv; what is still unsatisfied after it (empty when uv did it all). In a venv that
        inherits packages uv would not see them and would install its own copies, so there uv installs only
        what is missing, without dependencies, and again for what that still lacks, a few rounds at most."""
        spec = self.spec
        prefix = str(ctx.resolve(spec.venv)) if spec.venv else query(python, ctx.env, ctx.state_dir / "cache")["prefix"]
        config, variables, _ = self._settings(ctx, prefix)
        flags = config + self._index_args(ctx)
        if spec.pre:
            flags += ["--prerelease", "allow"]
        if flags.count("--extra-index-url") + ("--index-url" in flags) > 0:
            flags += ["--index-strategy", "unsafe-best-match"]  # pip's: the best version from every index
        flags += list(spec.extra_args) if spec.installer == "uv" else []
        base = [uv, "pip", "install", "--python", python, *flags]
        env = {**self._child_env(ctx), **variables}
        ctx.on_output(f"installing with uv ({uv})")
        if not (spec.venv and spec.inherit_packages):
            result = run_process([*base, *self._targets(ctx)], ctx, cwd=ctx.pipeline_dir, env=env)
            if result.returncode != 0:
                return self._uv_failed(ctx, python, result)
            return self._recheck(ctx, python)
        for _ in range(8):
            if not left or not wanted:
                return left
            argv = [*base, "--no-deps"]
            for item in merge(wanted):
                argv += ["-e", item[3:]] if item.startswith("-e ") else [item]
            result = run_process(argv, ctx, cwd=ctx.pipeline_dir, env=env)
            if result.returncode != 0:
                return self._uv_failed(ctx, python, result)
            wanted = []
            left = self._recheck(ctx, python, wanted)
        return left

    def _uv_failed(self, ctx: StepContext, python: str, result: Any) -> list[str]:
        """uv failed: with `installer: uv` that is the step's failure; with `auto`, pip tries."""
        if self.spec.installer == "uv":
            raise_failure("uv pip install", result)
        errors = [line.strip() for line in result.tail if line.strip()]
        ctx.on_output("uv failed" + (f" ({errors[-1][:200]})" if errors else "") + ": trying pip")
        return self._recheck(ctx, python) or ["uv failed"]

    def _ensure_pip(self, ctx: StepContext, python: str) -> None:
        """pip in the target interpreter (a venv made for uv has none): ensurepip, which needs no network."""
        if "pip" in query(python, ctx.env, ctx.state_dir / "cache")["dists"]:
            return
        ctx.on_output(f"{python} has no pip: installing it with ensurepip")
        result = run_process([python, "-m", "ensurepip", "--default-pip"], ctx, env=self._child_env(ctx))
        forget_query(python, ctx.state_dir / "cache")
        if result.returncode != 0:
            raise StepError(f"{python} has no pip and ensurepip failed", output_tail="\n".join(result.tail))

    def _install_pip(self, ctx: StepContext, python: str) -> None:
        spec = self.spec
        self._ensure_pip(ctx, python)
        argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *self._index_args(ctx)]
        if spec.pre:
            argv.append("--pre")
        argv += list(spec.extra_args) + self._targets(ctx)
        ctx.on_output("installing with pip")
        result = run_process(argv, ctx, cwd=ctx.pipeline_dir, env=self._child_env(ctx))
        if result.returncode != 0:
            raise_failure("pip install", result)

    def _ensure_venv(self, ctx: StepContext, with_pip: bool = True) -> None:
        assert self.spec.venv
        root = ctx.resolve(self.spec.venv)
        if not ((root / "pyvenv.cfg").exists() and (root / "bin" / "python").exists()):
            base = self.base_python(ctx)
            ctx.on_output(f"creating virtual environment {root} with {base}" + ("" if with_pip else " (no pip)"))
            argv = [base, "-m", "venv", "--clear", *([] if with_pip else ["--without-pip"]), str(root)]
            result = run_process(argv, ctx, env=ctx.env)
            if result.returncode != 0:
                raise StepError(f"creating the venv {root} failed", output_tail="\n".join(result.tail))
        self._write_inherit(ctx, root)

    def _inherit_files(self, ctx: StepContext) -> list[Path]:
        assert self.spec.venv
        return sorted(ctx.resolve(self.spec.venv).glob(f"lib/python*/site-packages/{INHERIT_PTH}"))

    def _write_inherit(self, ctx: StepContext, root: Path) -> None:
        targets = sorted(root.glob("lib/python*/site-packages"))
        if not self.spec.inherit_packages:
            for target in targets:
                (target / INHERIT_PTH).unlink(missing_ok=True)
            return
        base = self.base_python(ctx)
        query = "import json, site, sys; print(json.dumps(site.getsitepackages()))"
        try:
            done = subprocess.run([base, "-I", "-c", query], capture_output=True, text=True, timeout=60)
            dirs = [d for d in json.loads(done.stdout) if isinstance(d, str)]
        except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
            raise StepError(f"cannot read the site-packages of {base}: {exc}") from None
        own = {os.path.realpath(t) for t in targets}
        lines = [d for d in dirs if os.path.realpath(d) not in own]
        for target in targets:
            (target / INHERIT_PTH).write_text("".join(f"{d}\n" for d in lines), encoding="utf-8")
        ctx.on_output(f"the venv inherits the packages of {base}")

    def note(self, outputs: dict[str, Any]) -> str:
        """What the requirements resolved to (e.g. the e2b an expression pinned), a few at most."""
        versions = outputs.get("versions")
        if not isinstance(versions, dict) or not versions:
            return ""
        shown = [f"{name} {version}" for name, version in list(versions.items())[:4]]
        more = len(versions) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more > 0 else "")

    def _versions(self, ctx: StepContext, python: str) -> dict[str, str]:
        from packaging.requirements import InvalidRequirement, Requirement

        dists = query(python, ctx.env, ctx.state_dir / "cache")["dists"]
        reqs, editables, _ = self._files(ctx)
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
        return dict(sorted(out.items()))


__all__ = ["PipSpec", "PipStep", "canonical", "forget_query", "query"]
