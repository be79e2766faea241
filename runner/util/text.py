"""Small rules of the pipeline's language that the engine and several kinds share."""

from __future__ import annotations

from typing import Any

# How a rendered string says yes or no (`when:`, `assert: that:`, the `bool` filter).
TRUE_WORDS = frozenset({"true", "yes", "1", "on"})
FALSE_WORDS = frozenset({"false", "no", "0", "off", "", "none"})
# What makes a string a Jinja template rather than plain text.
TEMPLATE_MARKERS = ("{{", "{%", "{#")


def is_template(value: Any) -> bool:
    """Whether a value is a string that needs rendering (checked again once rendered)."""
    return isinstance(value, str) and "{" in value and ("{{" in value or "{%" in value or "{#" in value)


def argv_of(command: str | list[str]) -> list[str]:
    """A command as the kinds run it: a string runs under ``sh -c``, a list is the argv itself."""
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)


def one_line(command: str | list[str]) -> str:
    """A command as an error line names it: a script of several lines by its first line and its length, so the
    message is not lost below it (`test -f x ... (3 lines)`); the log keeps the whole."""
    import shlex

    text = command if isinstance(command, str) else shlex.join(command)
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return text.strip()
    return f"{lines[0].strip()} ... ({len(lines)} lines)"


# Control characters a terminal would act on (ESC starts colour, cursor and title sequences; C1 0x9b is a CSI
# by itself on some terminals; BEL, backspace, a lone carriage return): shown as `\xNN` instead.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))}


def printable(text: str) -> str:
    """Text safe to print on a terminal: newlines and tabs stay, every other control character (escape
    sequences from a step's output or a hostile name) is shown as `\\xNN`."""
    if text.isprintable():
        return text
    return text.translate(_CONTROLS)
