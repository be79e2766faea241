"""uv for the pip kind: where its binary is, and pip's own configuration said to it.

uv reads neither pip.conf nor the PIP_* variables (it has its own, uv.toml and UV_*), so an install that
switched to uv on a machine whose pip is pointed at a mirror, a wheel directory or a constraints file would
resolve against PyPI instead. `pip_settings` reads what `pip install` would read — the same files in the same
order, `[global]` then `[install]`, then the PIP_* variables (pip 23.2's `configuration.py`
`get_configuration_files` / `iter_config_files`, `OVERRIDE_ORDER`; `cli/parser.py`
`_get_ordered_configuration_items`) — and `uv_arguments` turns it into uv's flags and variables. A setting it
cannot say to uv is reported, and the pip kind then installs with pip, so either way the install means the
same.
"""

from __future__ import annotations

import configparser
import functools
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path

# pip settings that change nothing about what gets installed (output, prompts, pip's own cache and checks)
_HARMLESS = frozenset(
    {
        "disable-pip-version-check",
        "no-input",
        "progress-bar",
        "root-user-action",
        "quiet",
        "verbose",
        "no-color",
        "cache-dir",
        "no-cache-dir",
        "require-virtualenv",
        "no-warn-script-location",
        "no-python-version-warning",
        "retries",
        "log",
        "exists-action",
        "use-feature",
        "use-deprecated",
        "isolated",
        "python",
        "config-file",
        "config_file",  # PIP_CONFIG_FILE names the file, it is not a setting
    }
)
_TRUE = {"1", "true", "yes", "on", "y", "t"}


def _config_files(env: Mapping[str, str], prefix: str) -> list[Path]:
    """pip's configuration files for an interpreter whose sys.prefix is `prefix`, lowest priority first."""
    chosen = env.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:
        return []  # pip: "Skipping loading configuration files due to PIP_CONFIG_FILE being os.devnull"
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    xdg_dirs = env.get("XDG_CONFIG_DIRS") or "/etc/xdg"
    files = [Path(d) / "pip" / "pip.conf" for d in xdg_dirs.split(os.pathsep) if d] + [Path("/etc/pip.conf")]
    if not (chosen and os.path.exists(chosen)):
        user = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
        files += [home / ".pip" / "pip.conf", user / "pip" / "pip.conf"]
    files.append(Path(prefix) / "pip.conf")
    if chosen:
        files.append(Path(chosen))
    return files


def pip_settings(env: Mapping[str, str], prefix: str) -> dict[str, str]:
    """What `pip install` would take from its configuration: key (pip's long option name) -> raw value."""
    settings: dict[str, str] = {}
    for path in _config_files(env, prefix):
        parser = configparser.RawConfigParser()
        try:
            with path.open(encoding="utf-8") as handle:
                parser.read_file(handle)
        except (OSError, configparser.Error, UnicodeDecodeError):
            continue
        for section in ("global", "install"):
            if parser.has_section(section):
                for key, value in parser.items(section):
                    if value:
                        settings[key.replace("_", "-").lower()] = value
    for name, value in env.items():
        if name.startswith("PIP_") and value and name not in ("PIP_VERSION", "PIP_HELP", "PIP_CONFIG_FILE"):
            settings[name[4:].replace("_", "-").lower()] = value
    return settings


def uv_arguments(settings: Mapping[str, str], *, has_index: bool) -> tuple[list[str], dict[str, str], list[str]]:
    """(uv flags, variables for uv's environment, the settings uv cannot be told) for pip's `settings`.
    `has_index`: the step gives its own `index_url`, which wins over the configured one as on pip's command line."""
    args: list[str] = []
    variables: dict[str, str] = {}
    left: list[str] = []
    for key, value in settings.items():
        words = value.split()
        if key in _HARMLESS:
            continue
        if key == "index-url":
            if not has_index:
                args += ["--index-url", value.strip()]
        elif key == "extra-index-url":
            for url in words:
                args += ["--extra-index-url", url]
        elif key == "find-links":
            for link in words:
                args += ["--find-links", link]
        elif key in ("constraint", "constraints"):
            for path in words:
                args += ["--constraint", path]
        elif key == "no-index":
            if value.strip().lower() in _TRUE:
                args.append("--no-index")
        elif key == "pre":
            if value.strip().lower() in _TRUE:
                args += ["--prerelease", "allow"]
        elif key == "trusted-host":
            for host in words:
                args += ["--allow-insecure-host", host]
        elif key in ("only-binary", "no-binary"):
            for item in words:
                args += [f"--{key}", item]
        elif key == "cert":
            variables["SSL_CERT_FILE"] = value.strip()
        elif key == "client-cert":
            variables["SSL_CLIENT_CERT"] = value.strip()
        elif key in ("timeout", "default-timeout"):
            variables["UV_HTTP_TIMEOUT"] = value.strip()
        elif key == "proxy":
            variables["HTTPS_PROXY"] = variables["HTTP_PROXY"] = value.strip()
        else:
            left.append(key)
    return args, variables, sorted(left)


@functools.cache
def _packaged_uv() -> str | None:
    try:
        from uv import find_uv_bin  # the `uv` package installed beside runner (a project dependency)
    except ImportError:
        return None
    try:
        found = find_uv_bin()
    except (FileNotFoundError, OSError):
        return None
    return found if os.access(found, os.X_OK) else None


def find_uv(env: Mapping[str, str]) -> str | None:
    """The uv binary: `uv` on the step's PATH (the user's own, with its uv.toml), else the one the `uv` package
    beside runner brings."""
    return shutil.which("uv", path=env.get("PATH")) or _packaged_uv()


__all__ = ["find_uv", "pip_settings", "uv_arguments"]


def choose_uv(
    installer: str, env: Mapping[str, str], extra_args: bool, unsaid: list[str] | None, say: Callable[[str], None]
) -> str | None:
    """The uv binary a pip step installs with (`installer` auto or uv), or None for pip, and why in `say`:
    `extra_args` are pip's, and `unsaid` is what of pip's configuration uv cannot be told."""
    from steps.base import StepError

    uv = find_uv(env)
    if uv is None:
        if installer == "uv":
            raise StepError(
                "installer: uv, but there is no uv: neither the `uv` package beside runner nor `uv` on PATH",
                hint="pip install uv (a dependency of runner), or drop `installer: uv` to fall back to pip",
                field="installer",
            )
        say("no uv found (pip install uv): installing with pip")
        return None
    if installer == "auto":
        if extra_args:
            say("extra_args are pip's arguments: installing with pip")
            return None
        if unsaid:
            say(f"pip's configuration sets {', '.join(unsaid)}, which uv is not told: installing with pip")
            return None
    return uv
