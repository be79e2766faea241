"""A pip step on another machine (`pip: {host: ...}`): installs with that machine's interpreter, checked here.

The probe is one round trip: that machine's interpreter lists what it has installed (the very script the local
kind runs, standard library only), the editable projects' absolute paths and the requirements files' text come
back with it, and the check — requirements, their dependencies, markers, editables — is made here by the same
code as a local step's. Apply creates the venv there when missing (`python -m venv`), runs `python -m pip
install` there with its output streamed, and checks again. Paths (venv, requirements, editable, constraints,
find_links) are paths there; relative ones are from the login directory.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from steps._support import remote, ssh
from steps.base import Probe, StepContext, StepError

FILE_BEGIN = "RUNNER-FILE-BEGIN"
FILE_END = "RUNNER-FILE-END"
QUERY_MARK = "RUNNER-QUERY"


def _path_word(path: str) -> str:
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (ssh.quote(path[1:]) if len(path) > 1 else "")
    return ssh.quote(path)


class RemotePip:
    def __init__(self, step: Any, host: str) -> None:
        self.step = step
        self.host = host  # the step's `host:`
        self._seen: dict[str, Any] | None = None

    def python(self) -> str:
        spec = self.step.spec
        return f"{spec.venv.rstrip('/')}/bin/python" if spec.venv else (spec.python or "python3")

    # ---- one round trip ---------------------------------------------------------------------------------

    def look(self, ctx: StepContext) -> dict[str, Any]:
        """{python: found or None, data: the interpreter's listing, files: {path: text}, editables: {path: abs}}"""
        if self._seen is not None:
            return self._seen
        from steps._support.python_env import QUERY

        spec = self.step.spec
        py = _path_word(self.python())
        lines = [f"_py={py}"]
        for index, path in enumerate(spec.editable):
            lines.append(f'echo "EDIT {index} $(cd {_path_word(path)} 2>/dev/null && pwd -P)"')
        for index, path in enumerate(spec.requirements + spec.constraints):
            word = _path_word(path)
            lines.append(f'echo "{FILE_BEGIN} {index}"; cat -- {word} 2>/dev/null || echo "RUNNER-NOFILE"')
            lines.append(f'echo; echo "{FILE_END} {index}"')
        lines.append('if [ -x "$_py" ] || command -v "$_py" >/dev/null 2>&1; then :; else echo NOPY; exit 0; fi')
        lines.append('echo "PY $(command -v "$_py")"')
        lines.append(f'echo "{QUERY_MARK}"; exec "$_py" -I -c {ssh.quote(QUERY)}')
        code, out = ssh.quick(self.host, "\n".join(lines) + "\n", timeout=ctx.timeout or 120)
        seen: dict[str, Any] = {"python": None, "data": None, "files": {}, "editables": {}, "missing_files": []}
        head, _, listing = out.partition(f"{QUERY_MARK}\n")
        files = spec.requirements + spec.constraints
        current: int | None = None
        body: list[str] = []
        for line in head.splitlines():
            if current is not None:
                if line == f"{FILE_END} {current}":
                    text = "\n".join(body[:-1] if body and body[-1] == "" else body)
                    if text.strip() == "RUNNER-NOFILE":
                        seen["missing_files"].append(files[current])
                    else:
                        seen["files"][files[current]] = text
                    current, body = None, []
                else:
                    body.append(line)
                continue
            word, _, rest = line.partition(" ")
            if word == "PY":
                seen["python"] = rest.strip()
            elif word == "EDIT":
                at, _, absolute = rest.partition(" ")
                seen["editables"][spec.editable[int(at)]] = absolute.strip()
            elif word == FILE_BEGIN:
                current = int(rest)
        if seen["python"] is None:  # NOPY: no interpreter (yet) there
            self._seen = seen
            return seen
        if code != 0 or not listing.strip():
            raise StepError(
                f"{self.python()} on {self.host} failed to list its packages (exit {code})",
                hint=f"check that `{self.python()}` there is a working Python 3.8+",
                output_tail=ctx.mask(out[-1500:]),
            )
        try:
            seen["data"] = json.loads(listing)
        except ValueError:
            raise StepError(f"{self.python()} on {self.host} gave an unreadable package list") from None
        self._seen = seen
        return seen

    def fingerprint_extra(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.step.spec
        if not (spec.requirements or spec.constraints):
            return {}
        seen = self.look(ctx)
        if seen["missing_files"]:  # as a local one fails, and before a venv is made or pip is asked; plan agrees
            raise StepError(
                f"requirements file {seen['missing_files'][0]} is missing on {self.host}",
                hint=f"the requirements and constraints paths of a pip step with `host:` are read on {self.host}",
            )
        return {
            "remote_files": {
                path: hashlib.sha256(text.encode()).hexdigest() for path, text in sorted(seen["files"].items())
            }
        }

    def unsatisfied(self, ctx: StepContext, wanted: list[str] | None = None) -> list[str]:
        from packaging.requirements import InvalidRequirement, Requirement

        from steps._support.python_env import check, check_editable

        spec = self.step.spec
        seen = self.look(ctx)
        problems: list[str] = [f"requirements file {p} is missing on {self.host}" for p in seen["missing_files"]]
        data = seen["data"] or {"dists": {}, "env": {}}
        reqs = self._lines(seen)
        checked: set[str] = set()
        for line in reqs:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            problems += check(req, data["dists"], data["env"], checked, wanted=wanted)
        for path in spec.editable:
            absolute = seen["editables"].get(path)
            if not absolute:
                problems.append(f"{path} does not exist on {self.host}")
                continue
            problems += check_editable("file://" + absolute, data["dists"], data["env"], checked, wanted)
        return problems

    def probe(self, ctx: StepContext) -> Probe:
        seen = self.look(ctx)
        if seen["python"] is None:
            what = f"{self.python()} does not exist on {self.host}"
            return Probe.missing(what + (" (no venv yet)" if self.step.spec.venv else ""))
        problems = self.unsatisfied(ctx)
        if problems:
            return Probe.drift("; ".join(problems), tuple(problems))
        return Probe.ok(f"satisfied on {self.host}")

    # ---- apply ----------------------------------------------------------------------------------------------

    def apply(self, ctx: StepContext) -> dict[str, Any]:
        spec = self.step.spec
        made_venv = False
        if spec.venv:
            seen = self.look(ctx)
            if seen["python"] is None:
                base = spec.python or "python3"
                ctx.on_output(f"$ {base} -m venv {spec.venv}")
                result = remote.run(ctx, self.host, f"{_path_word(base)} -m venv -- {_path_word(spec.venv)}")
                if result.returncode != 0:
                    raise remote.failure(self.host, result.returncode, f"{base} -m venv {spec.venv}", result.tail)
                made_venv = True
                self._seen = None
        seen = self.look(ctx)
        if seen["python"] is None:
            raise StepError(
                f"no interpreter {self.python()!r} on {self.host}",
                hint="give `python:` as a full path there, or install Python 3 there",
            )
        wanted: list[str] = []
        problems = self.unsatisfied(ctx, wanted)
        ctx.changed = made_venv or bool(problems)
        if not problems:
            ctx.on_output("every requirement is already satisfied: nothing installed")
            return self._outputs(ctx)
        ctx.on_output("to install: " + "; ".join(problems))
        words = [_path_word(self.python()), "-m", "pip", "install", "--disable-pip-version-check"]
        words += [ssh.quote(w) for w in self._index_args()]
        if spec.pre:
            words.append("--pre")
        words += [ssh.quote(w) for w in spec.extra_args]
        words += [ssh.quote(p) for p in spec.packages]
        for path in spec.requirements:
            words += ["-r", _path_word(path)]
        for path in spec.editable:
            words += ["-e", _path_word(path)]
        command = " ".join(words)
        result = remote.run(ctx, self.host, command, env={"PIP_NO_INPUT": "1"})
        if result.returncode != 0:
            from steps._support.python_env import raise_failure

            raise_failure(f"pip install on {self.host}", result)
        self._seen = None
        left = self.unsatisfied(ctx)
        if left:
            raise StepError(
                f"the install finished but the environment on {self.host} still does not satisfy the spec: "
                + "; ".join(left),
                hint="a conflicting constraint or a package that installs under another name",
            )
        return self._outputs(ctx)

    def _index_args(self) -> list[str]:
        spec = self.step.spec
        argv: list[str] = []
        if spec.index_url:
            argv += ["--index-url", spec.index_url]
        for url in spec.extra_index_urls:
            argv += ["--extra-index-url", url]
        for link in spec.find_links:
            argv += ["--find-links", link]
        if spec.no_index:
            argv.append("--no-index")
        if spec.no_build_isolation:
            argv.append("--no-build-isolation")
        for path in spec.constraints:
            argv += ["-c", path]
        return argv

    def _lines(self, seen: dict[str, Any]) -> list[str]:
        """The requirement lines: `packages`, then those of the requirements files as read there (options such as
        `-r` and `--index-url` left out)."""
        reqs = list(self.step.spec.packages)
        for path in self.step.spec.requirements:
            for raw in seen["files"].get(path, "").splitlines():
                line = raw.split(" #", 1)[0].strip()
                if line and not line.startswith(("#", "-")):
                    reqs.append(line)
        return reqs

    def _outputs(self, ctx: StepContext) -> dict[str, Any]:
        from packaging.requirements import InvalidRequirement, Requirement

        from steps._support.python_env import canonical, editable_dist

        seen = self.look(ctx)
        dists = (seen["data"] or {}).get("dists", {})
        out: dict[str, str] = {}
        for line in self._lines(seen):
            try:
                name = canonical(Requirement(line).name)
            except InvalidRequirement:
                continue
            if name in dists:
                out[dists[name]["name"]] = dists[name]["version"]
        for absolute in seen["editables"].values():
            found = editable_dist("file://" + absolute, dists) if absolute else None
            if found:
                out[found["name"]] = found["version"]
        return {"versions": dict(sorted(out.items())), "python": seen["python"] or self.python(), "host": self.host}

    def teardown(self, ctx: StepContext, dry_run: bool) -> str | None:
        spec = self.step.spec
        if not spec.venv:
            return None
        venv = _path_word(spec.venv)
        code, out = ssh.quick(self.host, f"[ -f {venv}/pyvenv.cfg ] && [ ! -L {venv} ] && echo VENV; :")
        if "VENV" not in out:
            return None
        if dry_run:
            return f"would remove the venv {spec.venv} on {self.host}"
        ssh.quick(self.host, f"rm -rf -- {venv}")
        return f"removed the venv {spec.venv} on {self.host}"
