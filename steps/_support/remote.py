"""What the kinds share to run on another machine (`host:`): the field, the command, the environment sent, the
checks of `creates`/`inputs` there in one round trip, and errors that name the host. The transport is ssh.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runner.util.datatype import replace
from runner.util.text import argv_of, one_line
from steps._support import ssh
from steps._support.facts import FactQuery, Facts
from steps._support.process import Completed, run_process
from steps.base import StepContext, StepError, Unreachable

HOST_DESCRIPTION = (
    "Run it on another machine over ssh: a ~/.ssh/config alias, user@host or ssh://user@host:port (the docker "
    "kind's spelling). Relative paths are then that machine's, from the login directory (or `cwd`); exported "
    "variables go along on stdin, never on a command line. Default: this machine."
)


def check_host(value: Any) -> Any:
    """The `host` field's validator (a template is checked once rendered)."""
    return ssh.check_target(value) if isinstance(value, str) else value


def body_of(command: str | list[str]) -> str:
    """The shell text of a step's command: a string as it is (it runs under sh -c), a list as one exec of argv."""
    if isinstance(command, str):
        return command
    return "exec " + join(argv_of(command))


def join(words: Sequence[str]) -> str:
    return " ".join(ssh.quote(w) for w in words)


def variables(ctx: StepContext, extra: Mapping[str, str]) -> dict[str, str]:
    """What a remote command gets besides its own login environment: what env steps exported, the step's own
    `env`, and the step's process tag. Not this machine's whole environment: PATH and HOME are the host's."""
    out = {**ctx.exported, **extra}
    if ctx.process_tag:
        from runner.util import sweep

        out[sweep.VARIABLE] = ctx.process_tag
    return out


def run(
    ctx: StepContext,
    target: str,
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
    """Run a step's command on the host, its output streamed to the step's log as a local one's is. The command
    stops when runner stops it (timeout, Ctrl-C) or dies: the script's stdin is the line that holds it."""
    ssh.connect(target)
    sent = {k: v for k, v in variables(ctx, env or {}).items() if k not in drop}
    script = ssh.guarded(body_of(command), sent, cwd, stop_signal, grace)
    remote, data = ssh.payload(script)
    runner_ctx = replace(ctx, log_path=None, on_output=lambda line: None) if quiet else ctx
    try:
        result = run_process(
            ssh.command_argv(target, remote), runner_ctx, env=ssh.local_env(), stdin=data, on_transient=on_transient
        )
    except StepError as exc:  # timed out or interrupted: the connection was cut, and with it the command there
        if not exc.message.startswith("command "):
            raise
        raise StepError(
            f"{exc.message} on {ssh.display(target)} (stopped there too)",
            hint=exc.hint,
            output_tail=exc.output_tail,
        ) from None
    if result.returncode == ssh.NO_DIRECTORY and cwd:
        raise StepError(f"working directory does not exist on {ssh.display(target)}: {cwd}")
    if result.returncode == 255:
        answered(target)  # 255 is also ssh's own exit when the connection fails: the host must still answer
    return result


def answered(target: str) -> None:
    """Unreachable unless the host answers a round trip now (a command's 255 is then its own)."""
    code, out = ssh.quick(target, "echo runner-answered", timeout=ssh.CONNECT_TIMEOUT)
    if code != 0 or "runner-answered" not in out:
        raise Unreachable(
            f"cannot reach {ssh.display(target)} over ssh: the connection ended with the command (exit 255)",
            hint=f"check that {ssh.display(target)} is up; the command there may or may not have run",
        )


def failure(target: str, code: int, command: str | list[str], tail: Sequence[str], what: str = "command") -> StepError:
    """A remote command's non-zero exit, with what to check for the codes that say something."""
    host = ssh.display(target)
    hint = ""
    if code == 127:
        hint = ssh.missing_command_hint(target)
    elif code == 126:
        hint = f"a program was found on {host} but could not be run (exit 126): check its permissions"
    elif code == 255:
        hint = f"255 is also what ssh exits with when the connection to {host} fails: check the output"
    return StepError(
        f"{what} exited with code {code} on {host}: {one_line(command)}", hint=hint, output_tail="\n".join(tail)
    )


def glob_word(pattern: str) -> str:
    """A path pattern as a shell word that globs (* ? [...]) and expands a leading ~/, nothing else."""
    out = []
    rest = pattern
    if rest == "~" or rest.startswith("~/"):
        out.append('"$HOME"')
        rest = rest[1:]
    for ch in rest:
        if ch.isalnum() or ch in "*?[]/._-":
            out.append(ch)
        else:
            out.append("\\" + ch)
    return "".join(out)


def match_lines(pattern: str) -> str:
    """A shell command that prints, one per line, the existing paths a pattern names on the host, globbing as
    Python's glob(recursive=True) does here: `**` is any number of directories when the host has bash (globstar);
    under a plain sh it means `*`. A path with a newline in its name is not told apart."""
    loop = f'for _m in {glob_word(pattern)}; do if [ -e "$_m" ] || [ -L "$_m" ]; then printf "%s\\n" "$_m"; fi; done'
    if "**" not in pattern:
        return f"{{ {loop}; }}"
    quoted = ssh.quote(loop)
    return f"{{ if command -v bash >/dev/null 2>&1; then bash -O globstar -c {quoted}; else {loop}; fi; }}"


def any_match(pattern: str) -> str:
    """A shell condition: the pattern names at least one existing path on the host."""
    return f'[ -n "$({match_lines(pattern)} | head -n 1)" ]'


def observe(
    target: str, cwd: str | None, creates: Sequence[str], inputs: Sequence[str]
) -> tuple[str | None, dict[str, Any]]:
    """One round trip: the first `creates` pattern that matches nothing there (or None), and the content digests
    of the `inputs` files there (sha256sum of every file each pattern names, directories walked)."""
    lines = []
    if cwd:
        lines.append(f"cd {ssh.quote(cwd)} 2>/dev/null || {{ echo 'X'; exit 0; }}")
    for index, pattern in enumerate(creates):
        lines.append(f'_f=0; {any_match(pattern)} && _f=1; echo "C{index} $_f"')
    for index, pattern in enumerate(inputs):
        lines.append(
            f'{match_lines(pattern)} | while IFS= read -r _p; do find "$_p" -type f -exec sha256sum -- {{}} + ; '
            f'done | LC_ALL=C sort -k2 | sed "s/^/I{index} /"'
        )
    code, out = ssh.quick(target, "\n".join(lines) + "\n")
    if out.startswith("X"):
        return (f"{cwd} does not exist on {ssh.display(target)}" if creates else None), {"cwd_missing": cwd}
    found = {}
    digests: dict[str, list[str]] = {str(i): [] for i in range(len(inputs))}
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        if head.startswith("C"):
            found[head[1:]] = rest.strip() == "1"
        elif head.startswith("I"):
            digests.setdefault(head[1:], []).append(rest)
    missing = next((p for i, p in enumerate(creates) if not found.get(str(i), False)), None)
    return missing, {inputs[int(k)]: v for k, v in digests.items() if k.isdigit() and int(k) < len(inputs)}


def sweep(target: str, tag: str) -> list[tuple[int, str]]:
    """Stop, on the host, every process carrying the step's tag in its environment (what a failed, interrupted or
    crashed run of the step left there outside its process group: a setsid'd child, a daemon), TERM then KILL
    after 2 s, as runner/util/sweep.py does here. Returns (pid, command) of what was found; nothing when the
    host cannot be reached (said by the step's own error)."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", tag):
        return []
    script = f"""_t=RUNNER_STEP_TAG={tag}
_found=
for _e in /proc/[0-9]*/environ; do
  _p=${{_e#/proc/}}; _p=${{_p%/environ}}
  [ "$_p" = "$$" ] && continue
  if tr '\\0' '\\n' < "$_e" 2>/dev/null | grep -qx "$_t"; then
    _found="$_found $_p"; echo "P $_p $(tr '\\0' ' ' < /proc/$_p/cmdline 2>/dev/null | cut -c1-200)"
  fi
done
[ -n "$_found" ] || exit 0
kill -TERM $_found 2>/dev/null; sleep 2; kill -KILL $_found 2>/dev/null; :
"""
    try:
        _, out = ssh.quick(target, script, timeout=60)
    except StepError:
        return []
    found = []
    for line in out.splitlines():
        head, _, rest = line.partition(" ")
        pid, _, command = rest.partition(" ")
        if head == "P" and pid.isdigit():
            found.append((int(pid), command.strip()))
    return found


def facts(ctx: StepContext, target: str, query: FactQuery) -> Facts:
    """A preflight's facts on the host: its files, kernel, PATH, /proc/sys and the variables a command there gets,
    read by one script (one round trip); a `contains` of more than one line reads the file at the end."""
    q = ssh.quote
    lines = [ssh.exports(variables(ctx, {}))]
    for index, pattern in enumerate(query.paths):
        lines.append(f'{any_match(pattern)} || echo "P{index}"')
    if query.kernel:
        lines.append('echo "K $(uname -r)"')
    last = ""  # one file's text, for a `contains` of more than one line (at most one such check)
    multi: int | None = None
    for index, (file, text) in enumerate(query.contains):
        where = glob_word(file) if file.startswith("~") else q(file)
        if "\n" in text and multi is None:
            multi = index
            last = f"if [ -r {where} ]; then echo B; head -c 16777216 {where}; else echo R{index}; fi"
        else:
            grep = f"grep -qF -- {q(text)} {where}"
            lines.append(f"if [ -r {where} ]; then {grep} || echo N{index}; else echo R{index}; fi")
    for index, name in enumerate(query.env):
        ok = f'[ -n "${{{name}:-}}" ]' if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else "false"
        lines.append(f"{ok} || echo E{index}")
    for index, program in enumerate(query.programs):
        lines.append(f"command -v {q(program)} >/dev/null 2>&1 || echo G{index}")
    for index, key in enumerate(query.sysctl):
        path = "/proc/sys/" + key.replace(".", "/")
        lines.append(f'if [ -r {path} ]; then echo "S{index} $(cat {path})"; else echo "S{index} -"; fi')
    if last:
        lines.append(last)
    found = Facts(contains=["" for _ in query.contains], sysctl={k: None for k in query.sysctl})
    if len(lines) == 1:
        return found
    _, out = ssh.quick(target, "\n".join(lines) + "\n")
    head, marker, body = out.partition("B\n")
    for line in (head if marker else out).splitlines():
        tag, _, rest = line.partition(" ")
        kind, number = tag[:1], tag[1:]
        if kind == "K" and not number:
            found.kernel = rest.strip()
        elif not number.isdigit():
            continue
        elif kind == "P":
            found.missing_paths.append(query.paths[int(number)])
        elif kind == "N":
            found.contains[int(number)] = "absent"
        elif kind == "R":
            found.contains[int(number)] = "unreadable:"
        elif kind == "E":
            found.unset.append(query.env[int(number)])
        elif kind == "G":
            found.not_found.append(query.programs[int(number)])
        elif kind == "S":
            found.sysctl[query.sysctl[int(number)]] = None if rest == "-" else rest.strip()
    if marker and multi is not None and query.contains[multi][1] not in body:
        found.contains[multi] = "absent"
    return found
