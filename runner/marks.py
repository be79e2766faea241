"""Where each value of a pipeline file is: its (line, column) by path, so every error names file, line and field."""

from __future__ import annotations

import yaml

from runner.errors import InputError

Path_ = tuple[str | int, ...]
Mark = tuple[int, int]


class MarkedData:
    """Plain data from YAML plus the (line, column) of each value and each mapping key, by path."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.values: dict[Path_, Mark] = {}
        self.keys: dict[Path_, Mark] = {}
        self.count = 0
        self.seen: set[int] = set()  # the YAML nodes met once: meeting one again is an alias's expansion
        self.expanded = 0
        self.constructor = yaml.constructor.SafeConstructor()

    def mark(self, path: Path_, key: bool = False) -> Mark | None:
        """The mark of a path, or of its nearest ancestor that has one."""
        table = self.keys if key else self.values
        probe = path
        while True:
            if probe in table:
                return table[probe]
            if key and probe in self.values:
                return self.values[probe]
            if not probe:
                return None
            probe = probe[:-1]

    def error(self, path: Path_, message: str, *, key: bool = False, field: str | None = None) -> InputError:
        mark = self.mark(path, key=key)
        return InputError(
            message,
            file=self.file,
            line=mark[0] if mark else None,
            column=mark[1] if mark else None,
            field=field if field is not None else dotted(path),
        )


def dotted(path: Path_) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out
