"""`runner completion bash|zsh|fish`: a shell completion script (commands, their options, step names and the
items of for_each steps); `runner _names` is what the scripts ask for the names, from the pipeline file the
command line names (`-f FILE` / `--file FILE`) or pipeline.yaml."""

from __future__ import annotations

import argparse
import contextlib
import sys

from runner.commands import EXIT_OK, UsageError

# the commands that take a step (or NAME[key]) as their argument
STEP_COMMANDS = ("explain", "forget", "mark-done", "logs", "stop")
ITEM_COMMANDS = ("explain", "mark-done", "logs")

BASH = """\
# runner completion for bash: `eval "$(runner completion bash)"` (or save it under
# ~/.local/share/bash-completion/completions/runner)
_runner_complete() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" command="" file="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -f|--file) [[ -z "$command" || "$command" != logs || "${{COMP_WORDS[i]}}" == --file ]] \\
                && file="${{COMP_WORDS[i+1]}}"; ((i++));;
            -*) ;;
            *) [[ -z "$command" ]] && command="${{COMP_WORDS[i]}}";;
        esac
    done
    if [[ "$prev" == -f || "$prev" == --file || "$prev" == --var-file ]] \\
        && [[ "$command" != logs || "$prev" != -f ]]; then
        COMPREPLY=($(compgen -f -- "$cur")); return
    fi
    if [[ -z "$command" ]]; then
        COMPREPLY=($(compgen -W "{commands}" -- "$cur")); return
    fi
    case "$cur" in
        -*) COMPREPLY=($(compgen -W "$(runner _options "$command" 2>/dev/null)" -- "$cur"));;
        *) case " {step_commands} " in
               *" $command "*) COMPREPLY=($(compgen -W "$(runner _names ${{file:+--file "$file"}} \\
                   --for "$command" 2>/dev/null)" -- "$cur"));;
           esac;;
    esac
}}
complete -o default -F _runner_complete runner
"""

ZSH = """\
#compdef runner
# runner completion for zsh: `eval "$(runner completion zsh)"` (or save it as _runner on your $fpath)
_runner() {{
    local -a words_ names
    local command="" file="" i
    for ((i = 2; i < CURRENT; i++)); do
        case "${{words[i]}}" in
            -f|--file) [[ "$command" != logs || "${{words[i]}}" == --file ]] && file="${{words[i+1]}}"; ((i++));;
            -*) ;;
            *) [[ -z "$command" ]] && command="${{words[i]}}";;
        esac
    done
    if [[ -z "$command" ]]; then
        words_=({commands}); compadd -a words_; return
    fi
    if [[ "${{words[CURRENT]}}" == -* ]]; then
        words_=(${{(f)"$(runner _options "$command" 2>/dev/null)"}}); compadd -a words_; return
    fi
    case " {step_commands} " in
        *" $command "*)
            names=(${{(f)"$(runner _names ${{file:+--file "$file"}} --for "$command" 2>/dev/null)"}})
            compadd -Q -a names;;
        *) _files;;
    esac
}}
if [[ "$funcstack[1]" == "_runner" ]]; then _runner "$@"; else compdef _runner runner; fi
"""

FISH = """\
# runner completion for fish: `runner completion fish | source` (or save it as
# ~/.config/fish/completions/runner.fish)
function __runner_file
    set -l words (commandline -opc)
    set -l command ""
    for i in (seq 2 (count $words))
        switch $words[$i]
            case -f --file
                if test "$command" != logs -o "$words[$i]" = --file
                    set -l next (math $i + 1)
                    if test $next -le (count $words)
                        echo --file $words[$next]
                    end
                end
        end
    end
end
function __runner_names
    runner _names (__runner_file) --for (commandline -opc)[2] 2>/dev/null
end
complete -c runner -f
complete -c runner -n __fish_use_subcommand -a "{commands}"
complete -c runner -n "__fish_seen_subcommand_from {step_commands}" -a "(__runner_names)"
{options}
"""


def run(args: argparse.Namespace) -> int:
    from runner.cli import COMMANDS

    commands = " ".join(c for c in COMMANDS if not c.startswith("_"))
    steps = " ".join(STEP_COMMANDS)
    if args.shell == "bash":
        sys.stdout.write(BASH.format(commands=commands, step_commands=steps))
    elif args.shell == "zsh":
        sys.stdout.write(ZSH.format(commands=commands, step_commands=steps))
    else:
        lines = []
        for command in COMMANDS:
            if command.startswith("_"):
                continue
            for option in options_of(command):
                if option.startswith("--"):
                    lines.append(f"complete -c runner -n '__fish_seen_subcommand_from {command}' -l {option[2:]}")
        sys.stdout.write(FISH.format(commands=commands, step_commands=steps, options="\n".join(lines)))
    return EXIT_OK


def options_of(command: str) -> list[str]:
    """A command's options, as its parser has them."""
    from runner.cli import build_parser

    parser = build_parser()
    for action in parser._subparsers._actions if parser._subparsers else []:  # noqa: SLF001 - argparse's own
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict) and command in choices:
            return sorted(o for a in choices[command]._actions for o in a.option_strings)  # noqa: SLF001
    return []


def run_options(args: argparse.Namespace) -> int:
    from runner.cli import COMMANDS

    if args.of not in COMMANDS:
        raise UsageError(f"no command {args.of!r}")
    print("\n".join(options_of(args.of)))
    return EXIT_OK


def run_names(args: argparse.Namespace) -> int:
    """The step names, and for a command that takes one item the items of each for_each step (rendered where
    they can be, else those it last ran); nothing at all, not an error, when the pipeline does not load: a
    completion never prints a traceback into the user's command line."""
    from runner.commands import open_engine
    from runner.errors import InputError

    try:
        engine, _, pipeline = open_engine(args)
        engine.load_state()
    except (InputError, UsageError, OSError):
        return EXIT_OK
    names = [step.name for step in pipeline.steps]
    if args.for_command in ITEM_COMMANDS:
        for step in pipeline.steps:
            if step.common.for_each is not None:
                with contextlib.suppress(Exception):
                    names += [f"{step.name}[{key}]" for key in engine.item_keys(step.name)]
    print("\n".join(names))
    return EXIT_OK
