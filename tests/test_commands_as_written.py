"""Every runner command printed in the README and in the examples' header comments works as written.

Each is parsed by the real command line parser (a synopsis such as `runner logs STEP [-f] [--run N]` with its
placeholders filled in); the quickstart's header is then run line by line, exactly as written, in a copy of
its directory and in a network namespace of the test's own, as are the `plan` lines of the other examples.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
EXAMPLES = [ROOT / "pipeline.yaml", *sorted((ROOT / "examples").glob("*/pipeline.yaml"))]
PLACEHOLDERS = {"STEP": "data", "FILE": "pipeline.yaml", "N": "1", "K=V": "k=v", "NAME": "data"}
# Brings up the loopback interface of a new network namespace (no `ip` needed), then runs a shell script.
LO_UP = (
    "import fcntl, os, socket, struct, sys\n"
    "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
    "fcntl.ioctl(s, 0x8914, struct.pack('16sh', b'lo', 0x1 | 0x8 | 0x40))\n"
    "os.execvp('sh', ['sh', '-ec', sys.argv[1]])\n"
)


def _joined(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + line.strip()
        else:
            out.append(line.strip())
    return out


def readme_lines() -> list[str]:
    lines: list[str] = []
    inside = False
    for line in README.read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh"
            continue
        if inside:
            lines.append(line)
    return _joined(lines)


def header_lines(path: Path) -> list[str]:
    """The indented command lines of a pipeline file's leading comment block (`#   runner plan ...`)."""
    lines: list[str] = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if re.match(r"#   (runner|python3?|pip|rm|export|eval) ", line):
            lines.append(line[4:])
    return _joined(lines)


def commands(line: str) -> list[list[str]]:
    """The commands of a shell line: comments dropped, split at && and ;."""
    words = shlex.split(line, comments=True)
    out: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", ";"):
            out.append([])
        else:
            out[-1].append(word)
    return [c for c in out if c]


def runner_argv(command: list[str]) -> list[str] | None:
    if command[:1] == ["runner"]:
        return command[1:]
    if command[:3] in (["python", "-m", "runner"], ["python3", "-m", "runner"]):
        return command[3:]
    return None


def fill(argv: list[str]) -> list[str]:
    """A synopsis made concrete: `[--run N]` -> `--run 1`, `text|dot|mermaid` -> `text`, STEP -> a step."""
    out: list[str] = []
    for word in argv:
        word = word.strip("[]")
        if "|" in word:
            word = word.split("|")[0]
        out.append(PLACEHOLDERS.get(word, word))
    return out


def documented() -> list[tuple[str, list[str]]]:
    found = [(f"README.md: {line}", c) for line in readme_lines() for c in commands(line)]
    for path in EXAMPLES:
        found += [(f"{path.relative_to(ROOT)}: {line}", c) for line in header_lines(path) for c in commands(line)]
    return [(where, argv) for where, c in found if (argv := runner_argv(c)) is not None]


def test_the_docs_print_runner_commands() -> None:
    where = {w.split(":")[0] for w, _ in documented()}
    assert where >= {"README.md", "pipeline.yaml", "examples/quickstart/pipeline.yaml"}, where
    assert "examples/multinode/pipeline.yaml" in where


@pytest.mark.parametrize(("where", "argv"), documented(), ids=lambda v: v if isinstance(v, str) else None)
def test_each_documented_command_parses(where: str, argv: list[str]) -> None:
    from runner.cli import _merge_pipeline_options, build_parser

    concrete = fill(argv)
    try:
        args, extra = build_parser().parse_known_args(concrete)
    except SystemExit as exc:
        pytest.fail(f"{where}: exit {exc.code} from the parser")
    assert not extra, f"{where}: unrecognized {extra}"
    assert args.command, where
    _merge_pipeline_options(args)
    if args.command != "schema" and "FILE" not in argv:
        file = ROOT / args.file
        named = {str(p.relative_to(ROOT)) for p in EXAMPLES}
        assert args.file in named, f"{where}: {args.file} is not one of the examples"
        assert file.is_file(), where
    for var_file in args.var_file:
        assert (ROOT / var_file).is_file(), f"{where}: no var file {var_file}"


def _namespace() -> None:
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"]).returncode != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("needs `unshare -n` (a network namespace of the test's own)")
        pytest.skip("needs `unshare -n` (a network namespace of the test's own)")


def _shell_env(tmp_path: Path, make: bool = True) -> dict[str, str]:
    """`runner` and `python` on PATH mean this checkout, as they do after the README's `pip install -e`."""
    bin_dir = tmp_path / "bin"
    if make:
        bin_dir.mkdir()
        shim = bin_dir / "runner"
        shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m runner "$@"\n')
        shim.chmod(0o755)
        # a script, not a link: a venv's python linked from outside its venv would run as the base interpreter
        python = bin_dir / "python"
        python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
        python.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(ROOT)
    env["PIP_NO_INDEX"] = "1"
    for name in ("RUNNER_VAR_FILE", "RUNNER_DEBUG", "DOCKER_HOST"):
        env.pop(name, None)
    env["DOCKER_HOST"] = f"unix://{tmp_path}/no-docker.sock"
    return env


def _in_namespace(script: str, cwd: Path, shim: bool = True) -> subprocess.CompletedProcess[str]:
    """A shell script in a network namespace of its own (loopback up), with `runner` meaning this checkout."""
    return subprocess.run(
        ["unshare", "-n", sys.executable, "-c", LO_UP, script],
        cwd=cwd,
        env=_shell_env(cwd, make=shim),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_quickstart_header_runs_as_written(tmp_path: Path) -> None:
    """Line for line, in its own network namespace (so the fixed port is free and nothing leaves loopback)."""
    _namespace()
    example = tmp_path / "examples" / "quickstart"
    shutil.copytree(
        ROOT / "examples" / "quickstart", example, ignore=shutil.ignore_patterns(".work", ".runner", "__pycache__")
    )
    lines = [line for line in header_lines(example / "pipeline.yaml") if not line.startswith("pip install")]
    assert len(lines) >= 5, lines
    script = "\n".join(f"echo '>>> {i}'\n{line}" for i, line in enumerate(lines))
    script += "\necho '>>> end'\n"
    try:
        done = _in_namespace(script, tmp_path)
    finally:  # whatever happened, the sandbox server it started does not outlive the test
        subprocess.run(
            [sys.executable, "-m", "runner", "down"],
            cwd=example,
            env=_shell_env(tmp_path, make=False),
            capture_output=True,
            timeout=120,
        )
    text = done.stdout + done.stderr
    assert done.returncode == 0 and ">>> end" in done.stdout, text
    parts = re.split(r">>> \d+\n", done.stdout)[1:]
    by_line = dict(zip(lines, parts, strict=False))
    applies = [p for line, p in by_line.items() if " apply " in f" {line} "]
    assert "changed=0" not in applies[0] and "failed=0" in applies[0], text
    assert "changed=0 failed=0" in applies[1], text  # again: nothing runs
    assert re.search(r"changed\s+rollout", applies[2]) and "changed=1 " in applies[2], text
    assert "Traceback" not in text and "usage:" not in text


@pytest.mark.parametrize("path", [p for p in EXAMPLES if "quickstart" not in str(p)], ids=lambda p: p.parent.name)
def test_the_plan_lines_of_the_other_examples_run(path: Path, tmp_path: Path) -> None:
    """`runner plan` of the flagship and the multinode recipe, as their headers print it (var exports too), in
    a namespace of the test's own: a plan (pending or failing steps: exit 2), never a usage error."""
    _namespace()
    if path.parent == ROOT:
        shutil.copy(path, tmp_path / "pipeline.yaml")
    else:
        ignore = shutil.ignore_patterns(".work", ".runner", "__pycache__")
        shutil.copytree(path.parent, tmp_path / path.parent.relative_to(ROOT), ignore=ignore)
    lines = header_lines(path)
    keep = [line for line in lines if line.startswith("export ")]
    plans = [line for line in lines if re.match(r"runner (-f \S+ )?plan\b", line)]
    assert plans, lines
    for index, line in enumerate(plans):
        script = "\n".join([*keep, *(shlex.join(c) for c in commands(line))])
        done = _in_namespace(script + " || test $? -eq 2", tmp_path, shim=index == 0)
        text = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}\n{text}"
        assert "plan:" in done.stdout, text
        assert "usage:" not in text and "Traceback" not in text and "internal error" not in text, text
