"""The .runner/ store: state.json plus its journal, logs, and the lock.

`state.json` is a snapshot (schema-versioned, written atomically: temporary file, fsync, rename). Each step
transition between snapshots is one line appended (and fsynced) to `journal-<generation>.jsonl`, holding that
step's whole new record, so a transition costs one record, not the whole state. Loading replays the journal of
the snapshot's generation over it; a torn last line (a crash mid-append) is ignored. The journal is folded
into a new snapshot when it grows past the number of steps, and when an apply ends — so after any finished
command state.json alone is the whole state, and at any instant snapshot + journal is a consistent one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runner.errors import LockedError, StateError
from runner.util import faults
from runner.util.atomic import atomic_write

SCHEMA_VERSION = 1
BACKUP = "state.json.backup"  # the last snapshot that was written and read back whole
COMPACT_MIN = 64  # journal entries before a snapshot, at the least


def now() -> float:
    return time.time()


def iso(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


class StateStore:
    """Per-step records. Thread-safe: under `-j` several steps finish at once."""

    def __init__(self, state_dir: Path) -> None:
        self.dir = state_dir
        self.path = state_dir / "state.json"
        self.backup = state_dir / BACKUP
        self._lock = threading.Lock()
        self.data: dict[str, Any] = {"schema": SCHEMA_VERSION, "generation": 0, "steps": {}}
        self._journal: Any = None  # the open journal file, appended to between snapshots
        self._entries = 0
        self.skipped: list[str] = []  # what load() found corrupt and left out (said by the engine as a notice)

    @property
    def generation(self) -> int:
        return int(self.data.get("generation", 0))

    def journal_path(self, generation: int | None = None) -> Path:
        return self.dir / f"journal-{self.generation if generation is None else generation}.jsonl"

    def load(self) -> StateStore:
        for _ in range(5):  # a reader without the lock may race a compaction: read until both agree
            self.skipped = []
            data = self._read_snapshot()
            entries = self._replay(data)
            again = self._read_snapshot()
            if again.get("generation", 0) == data.get("generation", 0):
                break
        self.data = data
        self._entries = entries
        return self

    def _read_snapshot(self, again: bool = True) -> dict[str, Any]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            good = read_backup(self.backup)
            if good is not None and again and self.path.exists():
                # a first snapshot written (it, then its backup) between the two reads: read it
                return self._read_snapshot(again=False)
            if good is not None:
                # state.json is never removed once written (replaced whole, compacted, never unlinked): gone
                # beside a good backup, it was taken away, and starting over would run every done step again
                raise StateError(
                    f"{self.path} is missing, but its backup is there ({self.backup}, generation "
                    f"{good.get('generation', 0)}, {len(good['steps'])} records, written "
                    f"{iso(self.backup.stat().st_mtime)}): `runner restore-state` puts it back, and nothing it "
                    f"records as done runs again (or move {self.backup.name} away too, to start over)"
                ) from None
            return {"schema": SCHEMA_VERSION, "generation": 0, "steps": {}}
        except UnicodeDecodeError:
            raise StateError(f"{self.path} is not UTF-8 text; {self._way_back()}") from None
        except OSError as exc:
            raise StateError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            message = f"{self.path} is not valid JSON ({exc.msg} at line {exc.lineno}); {self._way_back()}"
            raise StateError(message) from None
        if not isinstance(data, dict) or not isinstance(data.get("steps"), dict):
            raise StateError(f"{self.path} does not hold runner state; {self._way_back()}")
        schema = data.get("schema")
        if schema != SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema {schema!r}; this runner reads schema {SCHEMA_VERSION}: upgrade runner"
            )
        if not isinstance(data.get("generation", 0), int):
            raise StateError(f"{self.path} has a bad generation; move it away to start over")
        for name in [n for n, record in data["steps"].items() if not isinstance(record, dict)]:
            del data["steps"][name]  # a record of the wrong type: no record (the step is probed and re-run)
            self.skipped.append(f"{self.path.name}: the record of {name[:80]!r}")
        return data

    def _way_back(self) -> str:
        """What to do about a state.json that cannot be read: the backup and the command that restores it."""
        good = read_backup(self.backup)
        if good is None:
            return "move it away to start over (every step will be probed and re-run)"
        when = iso(self.backup.stat().st_mtime)
        return (
            f"the last good snapshot is {self.backup} (generation {good.get('generation', 0)}, written {when}): "
            "`runner restore-state` puts it back, and nothing it records as done runs again "
            "(or move state.json and its backup away, to start over)"
        )

    def _replay(self, data: dict[str, Any]) -> int:
        path = self.dir / f"journal-{data.get('generation', 0)}.jsonl"
        try:
            mode = path.stat().st_mode  # one look: a compaction may remove the file at any moment
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc.strerror}") from None
        if not stat.S_ISREG(mode):
            raise StateError(f"{path} is not a regular file; move it away (the snapshot alone is then the state)")
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return 0  # folded into a newer snapshot meanwhile: load() notices the generation and reads again
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc.strerror}") from None
        count = 0
        lines = raw.split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                name, record = entry["step"], entry["record"]
                if not isinstance(name, str) or not (record is None or isinstance(record, dict)):
                    raise TypeError("not a step transition")
            except (ValueError, KeyError, TypeError):
                # the last line torn by a crash mid-append: that transition never completed; any other bad
                # line is corruption, skipped, and said (the steps it recorded are probed again)
                if number != len(lines):
                    self.skipped.append(f"{path.name} line {number}")
                continue
            if record is None:
                data["steps"].pop(name, None)
            elif isinstance(record, dict):
                data["steps"][name] = record
            count += 1
        return count

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        steps: dict[str, dict[str, Any]] = self.data["steps"]
        return steps

    def record(self, name: str) -> dict[str, Any] | None:
        return self.steps.get(name)

    def update(self, name: str, **fields: Any) -> None:
        with self._lock:
            rec = dict(self.steps.get(name) or {})
            rec.update(fields)
            self._commit(name, rec)

    def replace(self, name: str, record: dict[str, Any] | None) -> None:
        with self._lock:
            self._commit(name, record)

    def _commit(self, name: str, record: dict[str, Any] | None) -> None:
        """Journal the new record durably, then take it: on a failed write the old record stays."""
        line = json.dumps({"step": name, "record": record}, sort_keys=True, separators=(",", ":")) + "\n"
        try:
            if self._journal is None:
                self.dir.mkdir(parents=True, exist_ok=True)
                fd = os.open(self.journal_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
                self._journal = os.fdopen(fd, "ab")
                if self._journal.tell() and not self._ends_with_newline():
                    self._journal.write(b"\n")  # close off a torn line left by a crash
            if faults.hit("journal-torn"):  # a crash in the middle of an append
                self._journal.write(line.encode()[: len(line) // 2])
                self._journal.flush()
                faults.kill()
            self._journal.write(line.encode())
            self._journal.flush()
            os.fsync(self._journal.fileno())
        except OSError as exc:
            self._close_journal()
            raise StateError(
                f"cannot write {self.journal_path()}: {exc.strerror}; the previous state is kept"
            ) from None
        if record is None:
            self.steps.pop(name, None)
        else:
            self.steps[name] = record
        self._entries += 1
        if self._entries > max(COMPACT_MIN, len(self.steps)):
            self._compact()

    def _ends_with_newline(self) -> bool:
        with open(self.journal_path(), "rb") as fh:
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"

    def _close_journal(self) -> None:
        if self._journal is not None:
            with contextlib.suppress(OSError):
                self._journal.close()
            self._journal = None

    def compact(self) -> None:
        """Fold the journal into a new snapshot (when there is anything to fold)."""
        with self._lock:
            if self._entries or self.journal_path().exists():
                self._compact()

    def _compact(self) -> None:
        old = self.generation
        data = {**self.data, "generation": old + 1}
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(self.path, text, crash_point="snapshot")
        except OSError as exc:
            raise StateError(f"cannot write {self.path}: {exc.strerror}; the previous state is kept") from None
        with contextlib.suppress(OSError):  # a copy, not a link: what damages state.json in place spares it
            atomic_write(self.backup, text)
        self.data = data
        self._close_journal()
        self._entries = 0
        for stale in self.dir.glob("journal-*.jsonl"):
            if stale.name != self.journal_path().name:
                with contextlib.suppress(OSError):
                    stale.unlink()


def read_backup(path: Path) -> dict[str, Any] | None:
    """The backup snapshot if it is whole runner state of this schema, else None."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if isinstance(data, dict) and isinstance(data.get("steps"), dict) and data.get("schema") == SCHEMA_VERSION:
        return data
    return None


def restore_backup(state_dir: Path) -> str:
    """Put the backup snapshot back as state.json (the damaged one is kept beside it); refused while an apply
    holds the lock. Returns what was done, in words."""
    backup = state_dir / BACKUP
    good = read_backup(backup)
    if good is None:
        raise StateError(f"{backup} is missing or damaged too: move state.json away to start over")
    current = state_dir / "state.json"
    with pipeline_lock(state_dir, notice=lambda message: None):
        kept = ""
        if current.exists():
            damaged = state_dir / f"state.json.damaged-{time.strftime('%Y%m%d-%H%M%S')}"
            os.replace(current, damaged)
            kept = f"; the damaged one is kept as {damaged.name}"
        atomic_write(current, backup.read_text(encoding="utf-8"))
        for journal in state_dir.glob("journal-*.jsonl"):  # transitions after the backup belong to no snapshot
            if journal.name != f"journal-{good.get('generation', 0)}.jsonl":
                with contextlib.suppress(OSError):
                    journal.unlink()
    steps = len(good["steps"])
    return f"restored {current} from {backup.name} (generation {good.get('generation', 0)}, {steps} records){kept}"


MIN_FREE = 64 * 1024  # bytes the state directory needs to record a run


# What runner keeps in .runner/: none of it may be a symbolic link (a link would make runner write, truncate or
# prune what it points at: a shared folder, another file).
STATE_ENTRIES = ("state.json", BACKUP, "secrets.json", "env.sh", "lock", "logs", "jobs", "cache")


def check_no_links(state_dir: Path) -> None:
    """Refuse a .runner/ whose entries (or the files in jobs/) are symbolic links; `.runner` itself may be one
    (state kept on another disk)."""
    candidates = [state_dir / name for name in STATE_ENTRIES]
    with contextlib.suppress(OSError):
        candidates += [p for p in state_dir.glob("journal-*.jsonl")]
    jobs = state_dir / "jobs"
    if jobs.is_dir() and not jobs.is_symlink():
        with contextlib.suppress(OSError):
            candidates += list(jobs.iterdir())
    for path in candidates:
        if path.is_symlink():
            try:
                target = os.readlink(path)
            except OSError:
                target = "?"
            raise StateError(
                f"{path} is a symbolic link (to {target}): runner never writes, truncates or prunes through a "
                "link in its state directory; remove the link (and move what it should keep there by hand)"
            )


def check_writable(state_dir: Path) -> None:
    """Before any step runs: can we record what happens? A read-only or full .runner/ is said up front (a link
    inside it already was, by pipeline_lock). Cheap on the converged path: a permission check and a statvfs."""
    try:
        (state_dir / "logs").mkdir(parents=True, exist_ok=True)
        if not os.access(state_dir, os.W_OK) or not os.access(state_dir / "logs", os.W_OK):
            raise OSError(errno.EACCES, "read-only or not writable")
        free = os.statvfs(state_dir)
        if free.f_bavail * free.f_frsize < MIN_FREE:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        raise StateError(
            f"cannot write to {state_dir}: {exc.strerror}; nothing was run and the previous state is kept"
        ) from None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def pipeline_lock(state_dir: Path, notice: Any = print) -> Iterator[None]:
    """One apply per pipeline at a time. flock is released by the kernel when its holder dies."""
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StateError(f"cannot create {state_dir}: {exc.strerror}") from None
    check_no_links(state_dir)  # before the lock is opened (and written): a link there is refused by name
    path = state_dir / "lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise StateError(f"cannot open the lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
            since = iso(holder.get("since")) if isinstance(holder.get("since"), (int, float)) else "?"
            raise LockedError(f"another apply holds the lock on this pipeline: {who}, since {since} ({path})") from None
        previous = _read_holder(fd)
        pid = previous.get("pid")
        if isinstance(pid, int) and previous.get("host") == socket.gethostname() and not _alive(pid):
            notice(
                f"notice: took over the lock left by pid {pid} (no longer running), since {iso(previous.get('since'))}"
            )
        try:
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": now()}).encode())
        except OSError as exc:
            raise StateError(
                f"cannot write the lock {path}: {exc.strerror}; nothing was run and the previous state is kept"
            ) from None
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        data = json.loads(raw.decode() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def lock_holder(state_dir: Path) -> dict[str, Any] | None:
    """Who holds the lock now (for plan/status, which never take it), or None."""
    path = state_dir / "lock"
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd) or {"pid": "?"}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
