"""Secret values, masked by value on every path out: console, logs, state, errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path

MASK = "********"
MIN_SECRET_LENGTH = 4  # shorter values would mask ordinary text


class Masker:
    def __init__(self) -> None:
        self._values: list[str] = []
        self._lock = threading.Lock()

    def add(self, value: str) -> None:
        if len(value) < MIN_SECRET_LENGTH:
            return
        with self._lock:
            if value not in self._values:
                self._values.append(value)
                self._values.sort(key=len, reverse=True)  # longest first: no partial leftovers

    def __bool__(self) -> bool:
        return bool(self._values)

    def mask(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return text

    def mask_data(self, data: object) -> object:
        """Mask every string inside nested dicts and lists."""
        if not self._values:
            return data
        if isinstance(data, str):
            return self.mask(data)
        if isinstance(data, dict):
            return {k: self.mask_data(v) for k, v in data.items()}
        if isinstance(data, list):
            return [self.mask_data(v) for v in data]
        return data


class SecretStore:
    """`.runner/secrets.json`, mode 0600: the secret outputs of steps ({step: {key: value}}).

    state.json only ever holds masked values; a converged run reads the real ones from here, so a generated
    key stays the same across applies and a captured one is not fetched again.
    """

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "secrets.json"
        self._lock = threading.Lock()
        self.data: dict[str, dict[str, str]] = {}

    def load(self) -> SecretStore:
        from runner.errors import StateError

        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return self
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            raise StateError(f"{self.path} is not valid JSON; move it away (generated secrets will change)") from None
        if isinstance(data, dict):
            self.data = {str(k): {str(a): str(b) for a, b in v.items()} for k, v in data.items() if isinstance(v, dict)}
        return self

    def values(self) -> list[str]:
        return [value for entry in self.data.values() for value in entry.values()]

    def get(self, name: str) -> dict[str, str]:
        return dict(self.data.get(name, {}))

    def put(self, name: str, values: dict[str, str] | None) -> None:
        from runner.errors import StateError
        from steps._support.files import atomic_write

        with self._lock:
            if values:
                self.data[name] = dict(values)
            elif name in self.data:
                del self.data[name]
            else:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write(
                    self.path,
                    json.dumps(self.data, indent=1, sort_keys=True) + "\n",
                    mode=0o600,
                    crash_point="snapshot",
                )
            except OSError as exc:
                raise StateError(f"cannot write {self.path}: {exc.strerror}; the previous secrets are kept") from None
