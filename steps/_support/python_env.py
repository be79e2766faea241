"""What a Python environment has installed: the interpreter query (one script run in the target interpreter,
shared by every step on it in a run and kept on disk while nothing on its path changed), and the requirement
checks against what it found. steps/_support/pip_env.py asks it of a machine (here in-process, there the same
query in one script) and the pip kind checks what comes back with the checks here.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from runner.util.atomic import atomic_write
from steps.base import StepError

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


def verdict_key(reqs: list[str], editables: list[str]) -> str:
    return hashlib.sha256(json.dumps([reqs, editables]).encode()).hexdigest()[:32]


def known_satisfied(data: dict[str, Any], key: str) -> bool:
    return key in (data.get("satisfied") or ())


def remember_satisfied(python: str, data: dict[str, Any], key: str, cache_dir: Path | None) -> None:
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


def raise_failure(what: str, result: Any) -> None:
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


def merge(wanted: list[str]) -> list[str]:
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
def requirement(line: str) -> Any:
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        return Requirement(line)
    except InvalidRequirement:
        return None


def check(
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
    return dependencies(dist, extras, dists, env, seen, wanted)


def dependencies(
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
        dep = requirement(line)
        if dep is None:
            continue
        if dep.marker is not None:
            applies = any(dep.marker.evaluate({**env, "extra": e}) for e in ["", *extras])
            if not applies:
                continue
            dep = requirement(str(dep).split(";")[0].strip())  # the marker held: check it plain
            if dep is None:
                continue
        problems += check(dep, dists, env, seen, label, wanted)
    return problems


def editable_dist(path: str, dists: dict[str, Any]) -> dict[str, Any] | None:
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


def check_editable(
    path: str, dists: dict[str, Any], env: dict[str, str], seen: set[str], wanted: list[str] | None = None
) -> list[str]:
    found = editable_dist(path, dists)
    if found:
        return dependencies(found, [], dists, env, seen, wanted)
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


INHERIT_PTH = "_runner_inherit.pth"


def inherit_files(root: Path) -> list[Path]:
    """A venv's .pth files that name its base interpreter's site-packages (pip's `inherit_packages`)."""
    return sorted(root.glob(f"lib/python*/site-packages/{INHERIT_PTH}"))


def write_inherit(root: Path, base: str, say: Callable[[str], None]) -> None:
    """The venv at `root` sees the packages of `base` (its site-packages in a .pth file, after its own), or, with
    no `base`, no longer does."""
    targets = sorted(root.glob("lib/python*/site-packages"))
    if not base:
        for target in targets:
            (target / INHERIT_PTH).unlink(missing_ok=True)
        return
    ask = "import json, site, sys; print(json.dumps(site.getsitepackages()))"
    try:
        done = subprocess.run([base, "-I", "-c", ask], capture_output=True, text=True, timeout=60)
        dirs = [d for d in json.loads(done.stdout) if isinstance(d, str)]
    except (OSError, ValueError, subprocess.TimeoutExpired) as exc:
        raise StepError(f"cannot read the site-packages of {base}: {exc}") from None
    own = {os.path.realpath(t) for t in targets}
    lines = [d for d in dirs if os.path.realpath(d) not in own]
    for target in targets:
        (target / INHERIT_PTH).write_text("".join(f"{d}\n" for d in lines), encoding="utf-8")
    say(f"the venv inherits the packages of {base}")
