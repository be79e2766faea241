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
    return isinstance(value, str) and any(marker in value for marker in TEMPLATE_MARKERS)


def argv_of(command: str | list[str]) -> list[str]:
    """A command as the kinds run it: a string runs under ``sh -c``, a list is the argv itself."""
    return ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
