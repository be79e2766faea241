"""Secret values, masked by value on every path out: console, logs, state, errors."""

from __future__ import annotations

import threading

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
