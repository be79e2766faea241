"""A PEP 517 / PEP 660 build backend in a few lines, so that installing this package needs no index.

The package is this directory itself (upstream's package-dir maps tbench2_env to "."), so an editable install
cannot be a plain .pth of a parent directory: it installs a small finder that maps the name to this directory,
as setuptools' editable finders do.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

NAME, VERSION = "openenv-tbench2_env", "0.1.0"
DIST = NAME.replace("-", "_")
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "tbench2_env"


def _wheel(directory: str, files: dict[str, bytes]) -> str:
    info = f"{DIST}-{VERSION}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tiny_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/top_level.txt"] = f"{PACKAGE}\n".encode()
    lines = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},sha256={digest},{len(data)}")
    lines.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()
    wheel = f"{DIST}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(directory, wheel), "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def get_requires_for_build_wheel(config_settings: object = None) -> list[str]:
    return []


def get_requires_for_build_editable(config_settings: object = None) -> list[str]:
    return []


FINDER = """import importlib.machinery, importlib.util, os, sys

class _Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name != {package!r}:
            return None
        return importlib.util.spec_from_file_location(
            name, os.path.join({root!r}, "__init__.py"), submodule_search_locations=[{root!r}])

def install():
    if _Finder not in sys.meta_path:
        sys.meta_path.append(_Finder)
"""


def build_wheel(wheel_directory: str, config_settings: object = None, metadata_directory: object = None) -> str:
    files: dict[str, bytes] = {}
    for sub in ("", "server"):
        folder = os.path.join(HERE, sub)
        for name in sorted(os.listdir(folder)):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as handle:
                    files["/".join(p for p in (PACKAGE, sub, name) if p)] = handle.read()
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: object = None, metadata_directory: object = None) -> str:
    finder = f"__editable___{DIST}_finder"
    return _wheel(
        wheel_directory,
        {
            f"{finder}.py": FINDER.format(package=PACKAGE, root=HERE).encode(),
            f"__editable__.{DIST}.pth": f"import {finder}; {finder}.install()\n".encode(),
        },
    )
