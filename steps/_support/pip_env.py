"""What a pip step sees of its interpreter, as a fact (steps/_support/facts.py) asked of the step's machine.

Here it is read in-process: the interpreter's listing through python_env.query (asked once per run and kept on
disk while nothing on its path changed, with the verdicts found for it), the requirements files (and those they
name with `-r`) and the content digest of what goes into the fingerprint. There it is one round trip: one
script lists what that machine's interpreter has installed (python_env.QUERY, standard library only), the
editable projects' absolute paths and the requirements files' text. The pip kind checks either with the same code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.util.datatype import datatype, field
from runner.util.interpreter import this_python
from steps._support import ssh
from steps._support.files import content_digest
from steps._support.python_env import QUERY, query
from steps.base import StepContext, StepError

FILE_BEGIN = "RUNNER-FILE-BEGIN"
FILE_END = "RUNNER-FILE-END"
QUERY_MARK = "RUNNER-QUERY"


@datatype
class Env:
    """A pip step's interpreter and inputs as its machine has them."""

    python: str  # the interpreter installed into (a venv's bin/python), as the machine names it
    exists: bool  # it is there
    # requirements and constraints files: path as written -> text, and those not there; here also the files they
    # name with `-r` (by absolute path)
    files: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    # editable path as written -> what python_env.check_editable takes (a path here, file:// there), None: not there
    editables: dict[str, str | None] = field(default_factory=dict)
    fingerprint: dict[str, Any] = field(default_factory=dict)  # what of them goes into the step's fingerprint
    cache: Path | None = None  # where a verdict is kept beside the listing (this machine)
    error: StepError | None = None  # a file named with `-r` that cannot be read: the check raises it
    keys: dict[str, str] = field(default_factory=dict)  # a requirements path as written -> its key in `files`
    here: bool = False  # read on this machine (paths in the files are this machine's)
    _data: dict[str, Any] | None = None
    _load: Callable[[], dict[str, Any]] | None = None

    def data(self) -> dict[str, Any]:
        """What the interpreter has installed (dists, its marker environment, prefix, path)."""
        if self._data is None:
            self._data = self._load() if self._load is not None else {"dists": {}, "env": {}}
        return self._data


def path_word(path: str) -> str:
    """A path as a shell word there: `~/` is that machine's home."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (ssh.quote(path[1:]) if len(path) > 1 else "")
    return ssh.quote(path)


@datatype
class PipFact:
    python: str | None  # the step's `python:`
    venv: str | None
    requirements: list[str]
    constraints: list[str]
    editable: list[str]
    where: str = ""  # " on HOST" for another machine: the end of its messages

    # ---- this machine -------------------------------------------------------------------------------------

    def base(self, ctx: StepContext) -> str:
        """The interpreter a venv is made with, or installed into without one (here: found on PATH)."""
        name = self.python or "python3"
        if "/" in name:
            return str(ctx.resolve(name))
        found = shutil.which(name, path=ctx.env.get("PATH"))
        if found:
            return found
        if self.python is None:
            return this_python()
        raise StepError(f"no interpreter {name!r} on PATH", hint="give `python:` as a full path")

    def here(self, ctx: StepContext) -> Env:
        python = str(ctx.resolve(self.venv) / "bin" / "python") if self.venv else self.base(ctx)
        # a path that carries a secret is not kept on disk (the cache file holds the interpreter's paths in clear):
        # such an interpreter is asked once per run instead
        cache = ctx.state_dir / "cache" if ctx.mask(python) == python else None
        env = Env(python, "/" not in python or Path(python).exists(), cache=cache, here=True)
        env._load = lambda: query(python, ctx.env, cache)
        files = [ctx.resolve(p) for p in self.requirements + self.constraints]
        for path in self.requirements:
            env.keys[path] = str(ctx.resolve(path))
            try:
                self._read(ctx.resolve(path), env, 0)
            except StepError as exc:
                env.error = exc
        for path in self.constraints:
            try:
                env.files[str(ctx.resolve(path))] = ctx.resolve(path).read_text(encoding="utf-8")
            except OSError:
                env.missing.append(path)
        for path in self.editable:
            root = ctx.resolve(path)
            env.editables[path] = str(root)
            files += [root / n for n in ("pyproject.toml", "setup.cfg", "setup.py") if (root / n).exists()]
        files += [Path(p) for p in env.files if Path(p) not in files]
        env.fingerprint = {"files": content_digest(files, ctx)} if files else {}
        return env

    def _read(self, path: Path, env: Env, depth: int) -> None:
        """A requirements file and those it names with `-r`, by absolute path (what the kind's parse looks up)."""
        if depth > 10 or str(path) in env.files:
            return
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise StepError(f"cannot read requirements file {path}: {exc.strerror}") from None
        env.files[str(path)] = text
        for raw in text.splitlines():
            line = raw.split(" #", 1)[0].strip()
            if line.startswith(("-r ", "--requirement ")):
                self._read((path.parent / line.split(None, 1)[1]).resolve(), env, depth + 1)

    # ---- another machine: one script ----------------------------------------------------------------------

    def target(self) -> str:
        return f"{self.venv.rstrip('/')}/bin/python" if self.venv else (self.python or "python3")

    def script(self) -> str:
        lines = [f"_py={path_word(self.target())}"]
        for index, path in enumerate(self.editable):
            lines.append(f'echo "EDIT {index} $(cd {path_word(path)} 2>/dev/null && pwd -P)"')
        for index, path in enumerate(self.requirements + self.constraints):
            word = path_word(path)
            lines.append(f'echo "{FILE_BEGIN} {index}"; cat -- {word} 2>/dev/null || echo "RUNNER-NOFILE"')
            lines.append(f'echo; echo "{FILE_END} {index}"')
        lines.append('if [ -x "$_py" ] || command -v "$_py" >/dev/null 2>&1; then :; else echo NOPY; exit 0; fi')
        lines.append('echo "PY $(command -v "$_py")"')
        lines.append(f'echo "{QUERY_MARK}"; exec "$_py" -I -c {ssh.quote(QUERY)}')
        return "\n".join(lines)

    def parse(self, code: int, out: str) -> Env:
        env = Env(self.target(), False)
        head, _, listing = out.partition(f"{QUERY_MARK}\n")
        files = self.requirements + self.constraints
        current: int | None = None
        body: list[str] = []
        for line in head.splitlines():
            if current is not None:
                if line == f"{FILE_END} {current}":
                    text = "\n".join(body[:-1] if body and body[-1] == "" else body)
                    if text.strip() == "RUNNER-NOFILE":
                        env.missing.append(files[current])
                    else:
                        env.files[files[current]] = text
                    current, body = None, []
                else:
                    body.append(line)
                continue
            word, _, rest = line.partition(" ")
            if word == "PY":
                env.python, env.exists = rest.strip(), True
            elif word == "EDIT":
                at, _, absolute = rest.partition(" ")
                env.editables[self.editable[int(at)]] = ("file://" + absolute.strip()) if absolute.strip() else None
            elif word == FILE_BEGIN:
                current = int(rest)
        if self.requirements or self.constraints:
            digests = {p: hashlib.sha256(t.encode()).hexdigest() for p, t in sorted(env.files.items())}
            env.fingerprint = {"remote_files": digests}
        if not env.exists:  # NOPY: no interpreter (yet) there
            return env
        if code != 0 or not listing.strip():
            raise StepError(
                f"{self.target()}{self.where} failed to list its packages (exit {code})",
                hint=f"check that `{self.target()}` there is a working Python 3.8+",
                output_tail=out[-1500:],
            )
        try:
            env._data = json.loads(listing)
        except ValueError:
            raise StepError(f"{self.target()}{self.where} gave an unreadable package list") from None
        return env
