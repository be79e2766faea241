"""Fingerprints and digests: sha256 of canonical JSON (sorted keys, no spaces)."""

from __future__ import annotations

from typing import Any

from steps._support.hashing import canonical, digest

__all__ = ["FINGERPRINT_VERSION", "canonical", "digest", "spec_changes", "step_fingerprint"]

FINGERPRINT_VERSION = 1


def step_fingerprint(kind: str, spec: Any, extra: dict[str, Any], upstream: dict[str, str]) -> str:
    return digest({"v": FINGERPRINT_VERSION, "kind": kind, "spec": spec, "extra": extra, "upstream": upstream})


def spec_changes(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Field-level differences, e.g. ``command: 'a' -> 'b'``."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                out.append(f"{path}: added {_short(new[key])}")
            elif key not in new:
                out.append(f"{path}: removed")
            else:
                out.extend(spec_changes(old[key], new[key], path))
        return out
    if old != new:
        return [f"{prefix or 'value'}: {_short(old)} -> {_short(new)}"]
    return []


def _short(value: Any) -> str:
    text = canonical(value)
    return text if len(text) <= 60 else text[:57] + "..."
