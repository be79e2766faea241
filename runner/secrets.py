"""Secret values, masked by value on every path out: console, logs, state, errors."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

MASK = "********"
MIN_SECRET_LENGTH = 4  # shorter values would mask ordinary text


# A name says "secret" when its last word is one of these: E2B_API_KEY, HF_TOKEN, db_password, apiKey (not
# E2B_API_KEY_FILE, key_digest or monkey: a path, a digest and a word).
SECRET_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd", "credential", "credentials"})
_WORDS = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
# scheme://user:password@ and, for http(s), scheme://token@: the userinfo of a URL
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/@:'\"]+)(?::([^\s/@'\"]*))?@")


PART_LENGTH = 8  # a part of a secret this long or longer, rendered into a step, is masked too


def _base64_forms(value: str) -> set[str]:
    """The secret as base64 shows it wherever it sits in the encoded stream (`echo $TOKEN | base64`, a Basic
    auth header): the encoding of its whole 3-byte groups at each of the three alignments, standard and
    URL-safe. The few characters at its edges stay visible; they are not the secret."""
    import base64

    data = value.encode("utf-8")
    forms = set()
    for skip in range(3):
        part = data[skip:]
        part = part[: len(part) // 3 * 3]
        if len(part) >= 6:
            forms.add(base64.b64encode(part).decode("ascii"))
            forms.add(base64.urlsafe_b64encode(part).decode("ascii"))
    return forms


def secret_name(name: str) -> bool:
    words = _WORDS.findall(name)
    return bool(words) and words[-1].lower() in SECRET_WORDS


def _url_secret(m: re.Match[str]) -> str | None:
    """The secret part of a URL's userinfo: its password, or for http(s) a user alone (a token); None else."""
    if m.group(3) is not None:
        return m.group(3)
    return m.group(2) if m.group(1).lower() in ("http://", "https://") else None


def mask_url_credentials(text: str) -> str:
    """`https://user:TOKEN@host` -> `https://user:********@host`; `https://TOKEN@host` -> `https://********@host`
    (a user alone is kept for other schemes: `ssh://git@host`)."""
    if "://" not in text or "@" not in text:
        return text

    def hide(m: re.Match[str]) -> str:
        if _url_secret(m) is None:
            return m.group(0)
        return f"{m.group(1)}{m.group(2)}:{MASK}@" if m.group(3) is not None else f"{m.group(1)}{MASK}@"

    return _URL_CREDENTIALS.sub(hide, text)


class Masker:
    def __init__(self, not_secret: frozenset[str] = frozenset()) -> None:
        self._values: list[str] = []  # longest first
        self._known: set[str] = set()  # the same values, to tell a new one at once
        self._lock = threading.Lock()
        self.not_secret = not_secret

    def scan(self, data: object, name: str = "") -> None:
        """Learn the secrets that data shows by their names (a value under `E2B_API_KEY`, a URL's password),
        except under the names the pipeline lists in `not_secret`."""
        if isinstance(data, dict):
            for key, value in data.items():
                self.scan(value, str(key))
        elif isinstance(data, list):
            for value in data:
                self.scan(value, name)
        elif isinstance(data, (str, int, float)) and not isinstance(data, bool):
            text = str(data)
            if name and name not in self.not_secret and secret_name(name):
                self.add(text)
            if "://" in text and "@" in text:
                for m in _URL_CREDENTIALS.finditer(text):
                    secret = _url_secret(m)
                    if secret is not None:
                        self.add(secret)

    def add(self, value: str) -> None:
        """A secret, and the forms it is commonly printed in: each line of a multi-line one (a PEM key echoed
        line by line), upper and lower case, JSON-escaped, URL-encoded."""
        import urllib.parse

        forms = {value, value.upper(), value.lower(), json.dumps(value)[1:-1], urllib.parse.quote(value, safe="")}
        forms.add(urllib.parse.quote_plus(value))
        forms.update(_base64_forms(value))
        if "\n" in value:
            forms.update(line.strip() for line in value.splitlines())
        forms = {f for f in forms if len(f) >= MIN_SECRET_LENGTH}
        with self._lock:
            fresh = forms - self._known
            if fresh:
                self._known |= fresh
                self._values.extend(fresh)
                self._values.sort(key=len, reverse=True)  # longest first: no partial leftovers

    def add_part(self, text: str) -> None:
        """A rendered template expression: masked from now on if it is a part of a secret (a slice,
        `token[:12]`, in any case) of PART_LENGTH characters or more."""
        if len(text) < PART_LENGTH or not self._values:
            return
        folded = text.lower()
        with self._lock:
            values = list(self._values)  # each secret's lower-case form is among them
        if any(folded in value for value in values):
            self.add(text)

    def add_data(self, value: object) -> list[str]:
        """Every string inside a secret of any shape (a mapping, a list, a number); returns the parts too short
        to mask (shorter than MIN_SECRET_LENGTH), for a warning."""
        if isinstance(value, dict):
            return [short for v in value.values() for short in self.add_data(v)]
        if isinstance(value, list):
            return [short for v in value for short in self.add_data(v)]
        if value is None or isinstance(value, bool):
            return []
        text = str(value)
        self.add(text)
        return [text] if len(text) < MIN_SECRET_LENGTH else []

    def __bool__(self) -> bool:
        return bool(self._values)

    def safe_cut(self, text: str, at: int) -> int:
        """Where `text` may be cut, at `at` or before, so that no secret (nor a URL's credentials) is split
        between the parts: output with no end of line is masked and passed on in parts."""
        for _ in range(8):  # a cut moved left may land in another secret: look again
            moved = at
            for value in self._values:
                start = text.find(value, max(0, at - len(value) + 1), at + len(value) - 1)
                if 0 <= start < at < start + len(value):
                    moved = min(moved, start)
            scheme = text.rfind("://", max(0, at - 2048), at)
            if (
                scheme >= 0
                and not any(c.isspace() or c == "@" for c in text[scheme:at])
                and "@" in text[at : at + 2048]
            ):
                moved = min(moved, max(0, scheme - 32))
            if moved == at:
                return at
            at = moved
        return at

    def safe_end(self, text: str) -> int:
        """How much of text may be shown now when more may follow it: up to where its last MIN_SECRET_LENGTH or
        more characters could be the start of a secret (and no secret split, as safe_cut)."""
        with self._lock:
            values = list(self._values)
        end = len(text)
        for value in values:
            for k in range(min(len(value) - 1, len(text)), MIN_SECRET_LENGTH - 1, -1):
                if value.startswith(text[len(text) - k :]):
                    end = min(end, len(text) - k)
                    break
        return self.safe_cut(text, end)

    def mask(self, text: str) -> str:
        for value in self._values:
            if value in text:
                text = text.replace(value, MASK)
        return mask_url_credentials(text)

    def mask_data(self, data: object) -> object:
        """Mask every string inside nested dicts and lists."""
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
        self._ephemeral: str | None = None

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

    DIGEST_ENTRY = "(runner)"  # not a step name (those are letters, digits, - and _): runner's own secrets

    def keyed_digest(self, text: str) -> str:
        """An HMAC-SHA256 of a secret, keyed with a random key kept only here (0600; ensure_digest_key makes it):
        a digest that state.json may hold without letting a hand-picked key be guessed from it."""
        import hashlib
        import hmac
        import secrets as random_source

        with self._lock:
            key = self.data.get(self.DIGEST_ENTRY, {}).get("digest_key")
            if not key:  # not made yet (apply makes it, under the lock): one for this process only
                key = self._ephemeral = self._ephemeral or random_source.token_hex(32)
        return "hmac-sha256:" + hmac.new(bytes.fromhex(key), text.encode(), hashlib.sha256).hexdigest()[:32]

    def ensure_digest_key(self) -> None:
        """Make the key of keyed_digest if there is none (apply does, holding the pipeline's lock)."""
        import secrets as random_source

        if not self.get(self.DIGEST_ENTRY).get("digest_key"):
            self.put(self.DIGEST_ENTRY, {**self.get(self.DIGEST_ENTRY), "digest_key": random_source.token_hex(32)})

    def values(self) -> list[str]:
        return [value for entry in self.data.values() for value in entry.values()]

    def get(self, name: str) -> dict[str, str]:
        return dict(self.data.get(name, {}))

    def put(self, name: str, values: dict[str, str] | None) -> None:
        from runner.errors import StateError
        from runner.util.atomic import atomic_write

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
