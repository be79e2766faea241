"""Tiny packages made by the tests themselves: wheels written as zip files, and editable projects."""

from __future__ import annotations

import base64
import hashlib
import textwrap
import zipfile
from pathlib import Path


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(where: Path, name: str, version: str, requires: list[str] | None = None) -> Path:
    """A pure-Python wheel holding module `<name>` with `VERSION = "<version>"`."""
    where.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    info = f"{module}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    for req in requires or []:
        meta += f"Requires-Dist: {req}\n"
        if "extra ==" in req:
            meta += "Provides-Extra: " + req.split("extra ==")[1].strip().strip("'\"") + "\n"
    files = {
        f"{module}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{info}/METADATA": meta.encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: runner-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = where / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return path


BACKEND = '''
"""A tiny PEP 517 / PEP 660 build backend, so editable installs need no setuptools, wheel or index."""
import base64, hashlib, os, zipfile

NAME, VERSION = {name!r}, {version!r}
MODULE = NAME.replace("-", "_")
HERE = os.path.dirname(os.path.abspath(__file__))


def _wheel(directory, files):
    info = f"{{MODULE}}-{{VERSION}}.dist-info"
    files = dict(files)
    files[f"{{info}}/METADATA"] = f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n".encode()
    files[f"{{info}}/WHEEL"] = b"Wheel-Version: 1.0\\nGenerator: tiny\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    lines = []
    for n, d in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
        lines.append(f"{{n}},sha256={{h}},{{len(d)}}")
    lines.append(f"{{info}}/RECORD,,")
    files[f"{{info}}/RECORD"] = ("\\n".join(lines) + "\\n").encode()
    name = f"{{MODULE}}-{{VERSION}}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    return name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.path.join(HERE, MODULE, "__init__.py"), "rb") as fh:
        return _wheel(wheel_directory, {{f"{{MODULE}}/__init__.py": fh.read()}})


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory, {{f"__editable__.{{MODULE}}.pth": (HERE + "\\n").encode()}})
'''


def make_project(where: Path, name: str, version: str = "0.1.0", marker: str = "") -> Path:
    """A project for editable installs, with its own in-tree build backend (no index, no setuptools)."""
    module = name.replace("-", "_")
    (where / module).mkdir(parents=True, exist_ok=True)
    (where / module / "__init__.py").write_text(f'SOURCE = "{where}"\n{marker}\n')
    (where / "tiny_backend.py").write_text(BACKEND.format(name=name, version=version))
    (where / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = []
            build-backend = "tiny_backend"
            backend-path = ["."]

            [project]
            name = "{name}"
            version = "{version}"
            """
        )
    )
    return where
