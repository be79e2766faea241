"""The envd data plane of a stand-in sandbox: Connect envelopes (JSON codec) and ``process.Process/Start``, a
server-streaming call whose start/data/end events carry the command's output (e2b's envd protocol).
"""

from __future__ import annotations

import base64
import contextlib
import email.parser
import email.policy
import json
import os
import posixpath
import queue
import signal
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from email.message import Message
from pathlib import Path
from typing import Any

from sandbox_standin.registry import Sandbox, kill_group

Send = Callable[[dict[str, Any]], None]


def envelope(payload: dict[str, Any], flags: int = 0) -> bytes:
    body = json.dumps(payload, separators=(",", ":")).encode()
    return struct.pack(">BI", flags, len(body)) + body


def read_envelope(data: bytes) -> dict[str, Any]:
    if len(data) < 5:
        raise ValueError("the request holds no Connect envelope")
    flags, length = struct.unpack(">BI", data[:5])
    if flags & 0x01:
        raise ValueError("compressed Connect messages are not supported")
    message = json.loads(data[5 : 5 + length] or b"{}")
    if not isinstance(message, dict):
        raise ValueError("the Connect message is not a JSON object")
    return message


def is_uuid(text: str) -> bool:
    """SandboxId::parse_str: sandbox ids are UUIDs."""
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# The users a stand-in sandbox has: e2b's base image's root and user, each with its home. envd looks a name up in
# the VM's passwd (permissions/authenticate.go GetUser); a stand-in sandbox has no passwd of its own, so any other
# name is envd's "invalid username".
USERS = {"root": (0, "/root"), "user": (1000, "/home/user")}


def basic_user(header: str | None) -> str | None:
    """The user an envd call asks for: the name in its `Authorization: Basic base64(name:)` (e2b envd/utils.py
    authentication_header), or None (envd then uses the sandbox's default user: authenticate.go:14-45)."""
    if not header or not header.startswith("Basic "):
        return None
    try:
        return base64.b64decode(header[6:], validate=True).decode().partition(":")[0]
    except ValueError:
        return None


def identity(box: Sandbox, name: str) -> tuple[list[str], dict[str, Any]] | str:
    """How a command runs as `name` here (an argv prefix and Popen arguments), or why it cannot."""
    uid = USERS[name][0]
    root_here = os.geteuid() == 0
    if uid and root_here:  # the uid it drops to must reach the sandbox's directory
        for parent in [box.directory, *box.directory.parents]:
            if parent.exists() and not parent.stat().st_mode & 0o001:
                return (
                    f"sandbox_standin cannot run commands as {name!r} (uid {uid}): it cannot reach {parent} "
                    f"(mode {parent.stat().st_mode & 0o777:o}); give the stand-in a --root that others can traverse"
                )
    if box.network is not None:
        return box.network.argv(uid), {}
    if uid == 0 and not root_here:
        return (
            f"sandbox_standin cannot run commands as root: it runs as uid {os.geteuid()} and could not make a user "
            "namespace (unshare); run it as root, or where unprivileged user namespaces are allowed"
        )
    # without a namespace, as another user than root: this host's root drops to the uid; anyone else is unprivileged
    return [], ({"user": uid, "group": uid, "extra_groups": []} if uid and root_here else {})


def resolve(box: Sandbox, path: str, home: str) -> tuple[str, Path]:
    """A path as envd resolves it (permissions/path.go ExpandAndResolve: `~` and relative paths from the user's
    home), and where that is in the stand-in sandbox's directory. `..` cannot climb out of it."""
    if path == "~" or path.startswith("~/"):
        path = home + path[1:]
    absolute = posixpath.normpath(path if path.startswith("/") else posixpath.join(home, path))
    return absolute, box.directory / absolute.lstrip("/")


def run_process(box: Sandbox, request: dict[str, Any], headers: Message, send: Send) -> dict[str, str] | None:
    """Runs a StartRequest's command as the user its Authorization asks for (else the sandbox's default), in the
    sandbox's directory, until its Connect-Timeout-Ms (the client's stream deadline, which envd turns into the
    command's: process/start.go:36-44, also for a background command), sending its events; returns the Connect
    error that ends the stream, if any. A client that went away leaves the command running."""
    given = headers.get("Connect-Timeout-Ms", "")
    deadline = time.monotonic() + int(given) / 1000 if given.isdigit() else None
    asked = basic_user(headers.get("Authorization"))
    name = asked if asked is not None else box.user
    if name not in USERS:  # authenticate.go:22-25 (asked), 38-41 (the default)
        said = "invalid username" if asked is not None else "invalid default user"
        return {"code": "unauthenticated", "message": f"{said}: '{name}'"}
    how = identity(box, name)
    if isinstance(how, str):
        return {"code": "permission_denied", "message": how}
    prefix, credentials = how
    home = USERS[name][1]
    spec = request.get("process") or {}
    argv = [str(spec.get("cmd") or "/bin/bash"), *[str(a) for a in spec.get("args") or []]]
    shown, cwd = resolve(box, str(spec.get("cwd") or box.workdir or home), home)
    if not cwd.is_dir():  # handler.go:231-239
        return {"code": "invalid_argument", "message": f"cwd '{shown}' does not exist"}
    env = {  # handler.go:245-262: PATH, HOME, USER, LOGNAME, the sandbox's variables, then the request's
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(box.directory / home.lstrip("/")),
        "USER": name,
        "LOGNAME": name,
        "LANG": "C.UTF-8",
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": box.sandbox_id,
        **box.env_vars,
        **{str(k): str(v) for k, v in (spec.get("envs") or {}).items()},
    }
    try:
        proc = subprocess.Popen(
            [*prefix, *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **credentials,
        )
    except OSError as exc:
        send({"event": {"start": {"pid": 0}}})
        send({"event": {"data": {"stderr": _b64(f"{argv[0]}: {exc.strerror}\n".encode())}}})
        send({"event": {"end": {"exitCode": 127, "exited": True, "status": "exit status 127"}}})
        return None
    box.processes.add(proc)
    try:
        return _pump(proc, deadline, send)
    except BaseException:
        kill_group(proc)
        raise
    finally:
        box.processes.discard(proc)


def send_signal(box: Sandbox, body: bytes) -> tuple[int, bytes]:
    """``process.Process/SendSignal``, a Connect unary call (JSON): SIGTERM or SIGKILL to a command this sandbox
    runs, by pid (process.proto: SendSignalRequest, Signal); an unknown pid is Connect's not_found (HTTP 404),
    which the SDK's kill takes as "not found" (e2b envd/rpc.py kill_process)."""
    try:
        request = json.loads(body or b"{}")
        pid = int(request.get("process", {}).get("pid"))
    except (ValueError, TypeError, AttributeError):
        return 400, json.dumps({"code": "invalid_argument", "message": "a SendSignalRequest with a pid"}).encode()
    named = request.get("signal")
    sig = signal.SIGKILL if named in ("SIGNAL_SIGKILL", 9) else signal.SIGTERM
    for proc in list(box.processes):
        if proc.pid == pid and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)  # its session's group: the command and what it started
            return 200, b"{}"
    return 404, json.dumps({"code": "not_found", "message": f"process with pid {pid} not found"}).encode()


def _pump(proc: subprocess.Popen[bytes], deadline: float | None, send: Send) -> dict[str, str] | None:
    events: queue.Queue[tuple[str, bytes]] = queue.Queue()

    def reader(stream: Any, name: str) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):
            events.put((name, chunk))
        events.put((name, b""))

    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        threading.Thread(target=reader, args=(stream, name), daemon=True).start()
    send({"event": {"start": {"pid": proc.pid}}})
    open_streams = 2
    timed_out = False
    while open_streams:
        wait = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            name, chunk = events.get(timeout=wait)
        except queue.Empty:
            timed_out = True
            kill_group(proc)
            deadline = None
            continue
        if not chunk:
            open_streams -= 1
            continue
        send({"event": {"data": {name: _b64(chunk)}}})
    code = proc.wait()
    if timed_out:
        return {"code": "deadline_exceeded", "message": "the command ran past its timeout"}
    status = f"exit status {code}" if code >= 0 else f"signal: {signal.Signals(-code).name.lower()[3:]}"
    end = {"exitCode": code if code >= 0 else -1, "exited": code >= 0, "status": status}
    send({"event": {"end": end}})
    return None


# ---- envd's files API (GET/POST /files): e2b's envd, which AgentENV runs in each VM (thirdparty/envd) ----------


class Refused(Exception):
    """envd's answer to a files call it will not serve: an HTTP status and a message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def files_user(box: Sandbox, username: str | None) -> tuple[int, str]:
    """A files call's user (`username`, else the sandbox's default) as uid and home, or envd's refusal
    (download.go:41-47, 63-69; upload.go: an unknown user is 401 "error looking up user")."""
    name = username if username is not None else box.user
    if name not in USERS:
        raise Refused(401, f"error looking up user '{name}': user: unknown user {name}")
    return USERS[name]


def read_file(box: Sandbox, query: dict[str, str]) -> tuple[int, bytes, str]:
    """GET /files?path=&username=: the file's bytes (application/octet-stream), or envd's error JSON."""
    if not query.get("path"):
        return _files_error(400, "path is required")
    try:
        shown, where = resolve(box, query["path"], files_user(box, query.get("username"))[1])
    except Refused as refused:
        return _files_error(refused.status, str(refused))
    if where.is_dir():
        return _files_error(400, f"path '{shown}' is a directory")
    try:
        return 200, where.read_bytes(), "application/octet-stream"
    except FileNotFoundError:
        return _files_error(404, f"path '{shown}' does not exist")
    except OSError as exc:
        return _files_error(500, f"cannot read '{shown}': {exc.strerror}")


def write_files(box: Sandbox, query: dict[str, str], content_type: str, body: bytes) -> tuple[int, bytes, str]:
    """POST /files?path=&username=: a multipart/form-data `file` part (the SDK's default for str and bytes) or an
    application/octet-stream body, written over any file there as the user (its parent directories made); the
    EntryInfo list (path, name, type) as JSON."""
    try:
        uid, home = files_user(box, query.get("username"))
    except Refused as refused:
        return _files_error(refused.status, str(refused))
    uploads: list[tuple[str, bytes]] = []
    if content_type.startswith("multipart/form-data"):
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
            f"Content-Type: {content_type}\r\n\r\n".encode() + body
        )
        for part in message.iter_parts():
            name = part.get_filename() or ""
            data = part.get_payload(decode=True)
            uploads.append((query.get("path") or name, data if isinstance(data, bytes) else b""))
    else:
        uploads.append((query.get("path", ""), body))
    written = []
    for path, data in uploads:
        if not path:
            return _files_error(400, "path is required")
        shown, where = resolve(box, path, home)
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            partial = where.with_name(f".{where.name}.upload")
            partial.write_bytes(data)
            if uid and os.geteuid() == 0:  # the user's file, as envd's (upload.go chowns it)
                os.chown(partial, uid, uid)
            os.replace(partial, where)
        except IsADirectoryError:
            return _files_error(400, f"path '{shown}' is a directory")
        except OSError as exc:
            return _files_error(500, f"cannot write '{shown}': {exc.strerror}")
        written.append({"path": shown, "name": posixpath.basename(shown), "type": "file"})
    return 200, json.dumps(written).encode(), "application/json"


def _files_error(status: int, message: str) -> tuple[int, bytes, str]:
    return status, json.dumps({"code": status, "message": message}).encode(), "application/json"
