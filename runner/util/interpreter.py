"""The interpreter running runner, under one name however runner was started."""

from __future__ import annotations

import functools
import os
import sys


@functools.cache
def this_python() -> str:
    """`sys.executable`, spelled the same whether runner was started as `python -m runner` (`.venv/bin/python`)
    or through its console script (whose shebang says `.venv/bin/python3`): the first of `python`, `python3`,
    `pythonX.Y` in the same directory that is the same file. A pipeline that renders `{{ facts.python }}` into
    a command or a `python:` field must not see a changed spec because it was started the other way."""
    exe = os.path.abspath(sys.executable) if sys.executable else "python3"
    folder = os.path.dirname(exe)
    names = ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    for name in names:
        candidate = os.path.join(folder, name)
        try:
            if os.path.samefile(candidate, exe):
                return candidate
        except OSError:
            continue
    return exe
