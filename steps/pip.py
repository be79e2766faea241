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
Outputs: `versions` (name -> version) and `python`.
"""

# Over 500 lines, on purpose: the interpreter query (a script run in the target interpreter), its cache and the
# requirement checks are one piece that only this kind uses; issue 16 (installs with uv) reshapes it.

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from steps._support import remote
from steps._support.files import atomic_write, content_digest
from steps._support.installer import find_uv, pip_settings, uv_arguments
from steps._support.interpreter import this_python
from steps._support.process import run_process
from steps._support.words import is_template
from steps.base import Probe, SpecModel, StepContext, StepError, StepKind

QUERY = r"""
import json, os, platform, re, sys
import importlib.metadata as md
dists = {}
for d in md.distributions():
    # the header read by hand: importlib.metadata's email parser is most of the time on a large environment
    text = d.read_text("METADATA") or d.read_text("PKG-INFO") or ""
    fields = {}
    last = None
    for line in text.split("\n\n", 1)[0].splitlines():
        if line[:1] in (" ", "\t") and last:
            fields[last][-1] += " " + line.strip()
            continue
        key, sep, value = line.partition(":")
        if sep:
            last = key.strip().lower()
            fields.setdefault(last, []).append(value.strip())
    name = (fields.get("name") or [""])[0]
    if not name:
        continue
    key = re.sub(r"[-_.]+", "-", name).lower()
    if key in dists:
        continue
    try:
        direct = d.read_text("direct_url.json")
        direct = json.loads(direct) if direct else None
    except Exception:
        direct = None
    requires = fields.get("requires-dist")
    if requires is None and not str(getattr(d, "_path", "")).endswith(".dist-info"):
        requires = d.requires  # an .egg-info keeps them in requires.txt
    dists[key] = {
        "name": name,
        "version": (fields.get("version") or [""])[0],
        "direct_url": direct,
        "requires": requires or [],
        "extras": fields.get("provides-extra") or [],
    }
impl = sys.implementation
iv = "{0.major}.{0.minor}.{0.micro}".format(impl.version)
if impl.version.releaselevel != "final":
    iv += impl.version.releaselevel[0] + str(impl.version.serial)
env = {
    "implementation_name": impl.name,
    "implementation_version": iv,
    "os_name": os.name,
    "platform_machine": platform.machine(),
    "platform_release": platform.release(),
    "platform_system": platform.system(),
    "platform_version": platform.version(),
    "python_full_version": platform.python_version(),
    "platform_python_implementation": platform.python_implementation(),
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "sys_platform": sys.platform,
}
paths = [p for p in sys.path if p and os.path.isdir(p)]
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix, "dists": dists, "env": env, "path": paths}))
"""

# Requirements that packaging always accepts, recognised without importing it (0.03 s of a converged run): a PEP 508
# name, extras, and clauses of an operator and a plain release number (`~=` needs two parts), no spaces, no
# markers, no URLs. Anything else goes to packaging. tests/test_pip.py checks the claim against packaging.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_CLAUSE = r"(?:(?:==|!=|<=|>=|<|>)[0-9]+(?:\.[0-9]+)*|~=[0-9]+(?:\.[0-9]+)+)"
SIMPLE_REQUIREMENT = re.compile(rf"{_NAME}(?:\[{_NAME}(?:,{_NAME})*\])?(?:{_CLAUSE}(?:,{_CLAUSE})*)?")

_cache: dict[str, dict[str, Any]] = {}
_stamps: dict[str, list[Any]] = {}  # the stamp each entry of _cache was read under
_cache_lock = threading.Lock()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _stamp(python: str, paths: list[str]) -> list[Any]:
    """What changes when anything is installed or removed: the mtimes of the interpreter and of every
    directory on its sys.path (pip adds and removes dist-info directories and .pth files there)."""
    stamp: list[Any] = [os.uname().release]
    for path in [python, os.path.realpath(python), *paths]:
        try:
            info = os.stat(path)
            stamp.append([path, info.st_mtime_ns, info.st_size])
        except OSError:
            stamp.append([path, None])
    return stamp


def _cache_file(cache_dir: Path, python: str) -> Path:
    return cache_dir / "pip" / (hashlib.sha256(python.encode()).hexdigest()[:20] + ".json")


def query(python: str, env: Mapping[str, str], cache_dir: Path | None = None) -> dict[str, Any]:
    """What is installed for this interpreter: asked once per run and shared between steps, and kept on disk
    while no directory on the interpreter's path has changed, so a converged run need not ask at all."""
    with _cache_lock:
        if python in _cache:
            return _cache[python]
    if cache_dir is not None:
        try:
            kept = json.loads(_cache_file(cache_dir, python).read_text(encoding="utf-8"))
            if kept.get("stamp") == _stamp(python, kept["data"].get("path", [])):
                with _cache_lock:
                    _cache[python] = kept["data"]
                    _stamps[python] = kept["stamp"]
                return dict(kept["data"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    try:
        proc = subprocess.run([python, "-I", "-c", QUERY], capture_output=True, text=True, env=clean, timeout=120)
    except OSError as exc:
        raise StepError(f"cannot run {python}: {exc.strerror}") from None
    except subprocess.TimeoutExpired:
        raise StepError(f"{python} did not answer within 120s") from None
    if proc.returncode != 0:
        raise StepError(f"{python} failed to list its packages: {proc.stderr.strip()[-300:]}")
    data: dict[str, Any] = json.loads(proc.stdout)
    stamp = _stamp(python, data.get("path", []))
    with _cache_lock:
        _cache[python] = data
        _stamps[python] = stamp
    if cache_dir is not None:
        target = _cache_file(cache_dir, python)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(target, json.dumps({"stamp": stamp, "data": data}))
        except OSError:
            pass  # a cache only
    return data


def _verdict_key(reqs: list[str], editables: list[str]) -> str:
    return hashlib.sha256(json.dumps([reqs, editables]).encode()).hexdigest()[:32]


def _known_satisfied(data: dict[str, Any], key: str) -> bool:
    return key in (data.get("satisfied") or ())


def _remember_satisfied(python: str, data: dict[str, Any], key: str, cache_dir: Path | None) -> None:
    """Keep, beside what is installed, that these requirements were found satisfied by it: the verdict depends on
    nothing else (the requirement lines, the editable paths, and the installed distributions' metadata and marker
    environment, which `data` holds), and goes when the kept query does (any change on the interpreter's path).
    A converged run then checks nothing and does not import packaging."""
    with _cache_lock:
        current = _cache.get(python)
        if current is None or current.get("dists") is not data.get("dists"):
            return  # asked again since (an install): this verdict is about what was there before
        known = list(current.get("satisfied") or ())
        if key in known:
            return
        current["satisfied"] = [*known[-63:], key]
        kept = dict(current)
        stamp = _stamps.get(python)
    if cache_dir is None or stamp is None or stamp != _stamp(python, kept.get("path", [])):
        return  # kept on disk only while the path is as it was when what is installed was read
    try:
        atomic_write(_cache_file(cache_dir, python), json.dumps({"stamp": stamp, "data": kept}))
    except OSError:
        pass  # a cache only


def forget_query(python: str, cache_dir: Path | None = None) -> None:
    with _cache_lock:
        _cache.pop(python, None)
        _stamps.pop(python, None)
    if cache_dir is not None:
        _cache_file(cache_dir, python).unlink(missing_ok=True)


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
    host: str | None = Field(
        None,
        description="Install on that machine over ssh, with its interpreter and pip (a ~/.ssh/config alias, "
        "user@host or ssh://user@host:port): paths are paths there. The check is one round trip.",
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

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        return remote.check_host(value)

    @model_validator(mode="after")
    def _something(self) -> PipSpec:
        if not (self.packages or self.requirements or self.editable):
            raise ValueError("give at least one of `packages`, `requirements` or `editable`")
        if self.host and self.inherit_packages:
            raise ValueError("`inherit_packages` is not available with `host` yet: give the venv what it needs")
        if self.host and self.installer == "uv":
            raise ValueError("`installer: uv` is not available with `host` yet: pip installs there (`auto` or `pip`)")
        return self


class PipStep(StepKind[PipSpec]):
    local_probe = True
    kind = "pip"
    Spec = PipSpec
    cosmetic_fields = frozenset({"installer"})
    outputs = frozenset({"versions", "python", "host"})

    _remote: Any = None

    def remote_host(self) -> str | None:
        return self.spec.host

    @property
    def away(self) -> Any:
        """The install on another machine (`host`), or None."""
        if not self.spec.host:
            return None
        if self._remote is None:
            from steps._support.remote_pip import RemotePip

            self._remote = RemotePip(self)
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
        if self.away:
            return self.away.fingerprint_extra(ctx)
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
        key = _verdict_key(reqs, editables)
        if _known_satisfied(data, key):
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
            problems += _check(req, dists, env, seen, wanted=wanted)
        for path in editables:
            problems += _check_editable(path, dists, env, seen, wanted)
        if not problems:
            _remember_satisfied(python, data, key, ctx.state_dir / "cache")
        return problems

    def describe_changes(self, ctx: StepContext, old_spec: dict[str, Any], changes: list[str]) -> list[str]:
        """The spec changed: say what that means for this environment (`e2b: 2.63.0 installed, wants <2.51`)."""
        if self.away:
            return changes
        python = self.target_python(ctx)
        if "/" in python and not Path(python).exists():
            return changes
        problems = self.unsatisfied(ctx, python)
        return changes + (problems or ["(already satisfied: pip will not run)"])

    def probe(self, ctx: StepContext) -> Probe:
        if self.away:
            return self.away.probe(ctx)
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
        if self.away:
            return self.away.teardown(ctx, dry_run)
        venv = ctx.resolve(self.spec.venv)
        if venv.is_symlink() or not (venv / "pyvenv.cfg").is_file():
            return None
        if dry_run:
            return f"would remove the venv {venv}"
        shutil.rmtree(venv)
        forget_query(str(venv / "bin" / "python"), ctx.state_dir / "cache")
        return f"removed the venv {venv}"

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        if self.away:
            return self.away.apply(ctx)
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
            for item in _merge(wanted):
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
            _raise_failure("uv pip install", result)
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
            _raise_failure("pip install", result)

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
            found = _editable_dist(path, dists)
            if found:
                out[found["name"]] = found["version"]
        return dict(sorted(out.items()))


def _raise_failure(what: str, result: Any) -> None:
    text = "\n".join(result.tail)
    errors = [line.strip() for line in result.tail if line.strip().lower().startswith(("error:", "×"))]
    message = f"exit code {result.returncode}"
    if errors:
        message = errors[-1].removeprefix("error:").removeprefix("×").strip()
    lowered = text.lower()
    markers = ("connection refused", "failed to establish", "name resolution", "timed out", "dns error", "offline")
    if any(m in lowered for m in markers):
        hint = "the package index is unreachable: check the network, `index_url`, or use `find_links`"
    elif any(m in lowered for m in ("no matching distribution", "could not find a version", "not found in the")):
        hint = "check the package name and version, and the index it is on"
    elif "no solution found" in lowered or "resolutionimpossible" in lowered:
        hint = "the requirements conflict: loosen a version or a constraint"
    else:
        hint = ""
    raise StepError(f"{what} failed: {message}", hint=hint, output_tail=text)


def _merge(wanted: list[str]) -> list[str]:
    """One requirement a name: `a>=1` and `a<3` (two packages' needs) become `a<3,>=1`; editables as they are."""
    from packaging.requirements import InvalidRequirement, Requirement

    merged: dict[str, Any] = {}
    out: list[str] = []
    for item in wanted:
        if item.startswith("-e "):
            if item not in out:
                out.append(item)
            continue
        try:
            req = Requirement(item)
        except InvalidRequirement:
            out.append(item)
            continue
        key = canonical(req.name)
        if key in merged and not req.url and not merged[key].url:
            merged[key].specifier &= req.specifier
            merged[key].extras |= req.extras
        elif key not in merged or req.url:
            merged[key] = req
    return out + [str(req) for req in merged.values()]


@functools.lru_cache(maxsize=8192)
def _requirement(line: str) -> Any:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(line)
    except InvalidRequirement:
        return None


def _check(
    req: Any,
    dists: dict[str, Any],
    env: dict[str, str],
    seen: set[str] | None = None,
    needed_by: str = "",
    wanted: list[str] | None = None,
) -> list[str]:
    """What keeps `req` from being satisfied: it, and then — as `pip check` would, but only for what the step
    asks for — its dependencies, theirs, and so on (the extras it asks for included). A package installed with
    --no-deps beside a missing dependency is not satisfied."""
    seen = set() if seen is None else seen
    if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
        return []
    why = f" (needed by {needed_by})" if needed_by else ""
    dist = dists.get(canonical(req.name))
    problem = ""
    if dist is None:
        problem = f"{req.name} is not installed" + (f", wants {req.specifier}" if req.specifier else "") + why
    elif req.specifier and not req.specifier.contains(dist["version"], prereleases=True):
        problem = f"{req.name}: {dist['version']} installed, wants {req.specifier}{why}"
    elif req.url and not needed_by:
        direct = (dist.get("direct_url") or {}).get("url")
        if direct != req.url:
            problem = f"{req.name} is installed from {direct or 'an index'}, wants {req.url}"
    if problem or dist is None:
        if wanted is not None:
            asked = "[" + ",".join(sorted(req.extras)) + "]" if req.extras else ""
            wanted.append(req.name + asked + (f" @ {req.url}" if req.url else str(req.specifier)))
        return [problem]
    provided = {canonical(e) for e in dist.get("extras") or []}
    extras = sorted(e for e in req.extras if canonical(e) in provided)  # pip ignores an undeclared extra
    return _dependencies(dist, extras, dists, env, seen, wanted)


def _dependencies(
    dist: dict[str, Any],
    extras: list[str],
    dists: dict[str, Any],
    env: dict[str, str],
    seen: set[str],
    wanted: list[str] | None = None,
) -> list[str]:
    """The unmet requirements of an installed distribution (with `extras`), transitively; each once."""
    key = canonical(dist["name"]) + "[" + ",".join(extras) + "]"
    if key in seen:
        return []
    seen.add(key)
    problems: list[str] = []
    label = dist["name"] + (f"[{','.join(extras)}]" if extras else "") + f" {dist['version']}"
    for line in dist.get("requires") or []:
        dep = _requirement(line)
        if dep is None:
            continue
        if dep.marker is not None:
            applies = any(dep.marker.evaluate({**env, "extra": e}) for e in ["", *extras])
            if not applies:
                continue
            dep = _requirement(str(dep).split(";")[0].strip())  # the marker held: check it plain
            if dep is None:
                continue
        problems += _check(dep, dists, env, seen, label, wanted)
    return problems


def _editable_dist(path: str, dists: dict[str, Any]) -> dict[str, Any] | None:
    want = Path(path).resolve().as_uri() if "://" not in path else path
    for dist in dists.values():
        direct = dist.get("direct_url") or {}
        if direct.get("url", "").rstrip("/") == want.rstrip("/") and (direct.get("dir_info") or {}).get("editable"):
            return dict(dist)
    return None


def _project_name(path: Path) -> str | None:
    import tomllib

    try:
        data = tomllib.loads((path / "pyproject.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    name = data.get("project", {}).get("name")
    if isinstance(name, str):
        return name
    try:
        for line in (path / "setup.cfg").read_text(encoding="utf-8").splitlines():
            key, sep, value = line.partition("=")
            if sep and key.strip() == "name":
                return value.strip()
    except OSError:
        pass
    return None


def _check_editable(
    path: str, dists: dict[str, Any], env: dict[str, str], seen: set[str], wanted: list[str] | None = None
) -> list[str]:
    found = _editable_dist(path, dists)
    if found:
        return _dependencies(found, [], dists, env, seen, wanted)
    if wanted is not None:
        wanted.append("-e " + path)
    name = _project_name(Path(path)) if "://" not in path else None
    dist = dists.get(canonical(name)) if name else None
    if dist is None:
        return [f"{name or path} is not installed (editable from {path})"]
    direct = dist.get("direct_url") or {}
    source = direct.get("url", "").removeprefix("file://") or "an index"
    kind = "editable from" if (direct.get("dir_info") or {}).get("editable") else "installed from"
    return [f"{dist['name']} is {kind} {source}, wants editable from {path}"]


__all__ = ["PipSpec", "PipStep", "canonical", "forget_query", "query"]
