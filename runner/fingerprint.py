"""Fingerprints and digests: sha256 of canonical JSON (sorted keys, no spaces)."""

from __future__ import annotations

import difflib
import os
from typing import Any

from runner.causes import Change
from runner.util.hashing import canonical, digest

__all__ = ["FINGERPRINT_VERSION", "canonical", "digest", "spec_changes", "step_fingerprint"]

FINGERPRINT_VERSION = 1


def step_fingerprint(kind: str, spec: Any, extra: dict[str, Any], upstream: dict[str, str]) -> str:
    return digest({"v": FINGERPRINT_VERSION, "kind": kind, "spec": spec, "extra": extra, "upstream": upstream})


def spec_changes(old: Any, new: Any, prefix: str = "") -> list[Change]:
    """Field-level differences as (field, old, new), e.g. ``Change("command", "'a'", "'b'")``."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[Change] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                out.append(Change(path, None, _short(new[key])))
            elif key not in new:
                out.append(Change(path, _short(old[key]), None))
            else:
                out.extend(spec_changes(old[key], new[key], path))
        return out
    if isinstance(old, list) and isinstance(new, list) and old != new:
        return _list_changes(old, new, prefix or "value")
    if old != new:
        before, after = _around(canonical(old), canonical(new))
        return [Change(prefix or "value", before, after)]
    return []


def _list_changes(old: list[Any], new: list[Any], path: str) -> list[Change]:
    """The elements that differ, by index: `command[3]: "8" -> "16"`, `args[2]: added "--n"`; a nested
    element is compared field by field. Lists that share nothing are shown whole, as a value."""
    if len(old) == len(new):
        out: list[Change] = []
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            out.extend(spec_changes(a, b, f"{path}[{i}]"))
        if len(out) <= 4 or len(out) < len(old):
            return out
    matcher = difflib.SequenceMatcher(a=[canonical(x) for x in old], b=[canonical(x) for x in new], autojunk=False)
    opcodes = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    if len(opcodes) > 4 or not any(op[0] == "equal" for op in matcher.get_opcodes()):
        before, after = _around(canonical(old), canonical(new))
        return [Change(path, before, after)]
    out = []
    for tag, i1, i2, j1, j2 in opcodes:
        if tag == "replace" and i2 - i1 == j2 - j1:
            for k in range(i2 - i1):
                out.extend(spec_changes(old[i1 + k], new[j1 + k], f"{path}[{i1 + k}]"))
            continue
        if tag in ("delete", "replace"):
            out.append(Change(f"{path}[{i1}]", note="removed " + " ".join(_short(x) for x in old[i1:i2])))
        if tag in ("insert", "replace"):
            out.append(Change(f"{path}[{j1}]", None, " ".join(_short(x) for x in new[j1:j2])))
    return out


def _around(old: str, new: str, width: int = 60) -> tuple[str, str]:
    """Two long texts cut to where they differ, so the change shows (not their common start, twice)."""
    if len(old) <= width and len(new) <= width:
        return old, new
    same = len(os.path.commonprefix([old, new]))
    start = max(0, same - 20)

    def cut(text: str) -> str:
        piece = text[start : start + width]
        return ("..." if start else "") + piece + ("..." if start + width < len(text) else "")

    return cut(old), cut(new)


def _short(value: Any) -> str:
    text = canonical(value)
    return text if len(text) <= 60 else text[:57] + "..."
