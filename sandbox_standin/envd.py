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


def run_process(box: Sandbox, request: dict[str, Any], deadline: float | None, send: Send) -> dict[str, str] | None:
    """Runs a StartRequest's command in the sandbox's directory, sending its events; returns the Connect error
    that ends the stream, if any. The command's process group dies with the call if anything goes wrong (the
    client went away, say)."""
    spec = request.get("process") or {}
    argv = [str(spec.get("cmd") or "/bin/bash"), *[str(a) for a in spec.get("args") or []]]
    cwd = box.directory / str(spec.get("cwd") or box.workdir).lstrip("/")
    cwd.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(box.directory),
        "LANG": "C.UTF-8",
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": box.sandbox_id,
        **box.env_vars,
        **{str(k): str(v) for k, v in (spec.get("envs") or {}).items()},
    }
    try:
        proc = subprocess.Popen(
            [*box.network.prefix, *argv] if box.network is not None else argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
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


def sandbox_path(box: Sandbox, path: str, username: str | None) -> tuple[str, Path]:
    """A path as envd resolves it (FilesApi.md: relative to the user's home, `~/file.txt`), and where that is
    in the stand-in sandbox's directory. `..` cannot climb out of it."""
    user = username or "user"
    home = "/root" if user == "root" else f"/home/{user}"
    absolute = posixpath.normpath(path if path.startswith("/") else posixpath.join(home, path))
    return absolute, box.directory / absolute.lstrip("/")


def read_file(box: Sandbox, query: dict[str, str]) -> tuple[int, bytes, str]:
    """GET /files?path=&username=: the file's bytes (application/octet-stream), or envd's error JSON."""
    if not query.get("path"):
        return _files_error(400, "path is required")
    shown, where = sandbox_path(box, query["path"], query.get("username"))
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
    application/octet-stream body, written over any file there, its parent directories made; the EntryInfo
    list (path, name, type) as JSON."""
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
        shown, where = sandbox_path(box, path, query.get("username"))
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
            partial = where.with_name(f".{where.name}.upload")
            partial.write_bytes(data)
            os.replace(partial, where)
        except IsADirectoryError:
            return _files_error(400, f"path '{shown}' is a directory")
        except OSError as exc:
            return _files_error(500, f"cannot write '{shown}': {exc.strerror}")
        written.append({"path": shown, "name": posixpath.basename(shown), "type": "file"})
    return 200, json.dumps(written).encode(), "application/json"


def _files_error(status: int, message: str) -> tuple[int, bytes, str]:
    return status, json.dumps({"code": status, "message": message}).encode(), "application/json"
