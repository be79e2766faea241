"""Canonical JSON and its sha256: what every fingerprint and digest is made of (kinds and engine alike)."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def digest(data: Any) -> str:
    return hashlib.sha256(canonical(data).encode("utf-8")).hexdigest()
