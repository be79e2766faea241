"""A PEP 517 / PEP 660 build backend in a few lines, so that installing this package needs no index."""

from __future__ import annotations

import base64
import hashlib
import os
import zipfile

NAME, VERSION = "openenv-tbench2-env", "0.2.0"
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


def build_wheel(wheel_directory: str, config_settings: object = None, metadata_directory: object = None) -> str:
    files: dict[str, bytes] = {}
    for root, _dirs, names in os.walk(os.path.join(HERE, PACKAGE)):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, "rb") as handle:
                    files[os.path.relpath(path, HERE)] = handle.read()
    return _wheel(wheel_directory, files)


def build_editable(wheel_directory: str, config_settings: object = None, metadata_directory: object = None) -> str:
    return _wheel(wheel_directory, {f"__editable__.{DIST}.pth": (HERE + "\n").encode()})
