"""The envd data plane of a stand-in sandbox: Connect envelopes (JSON codec) and ``process.Process/Start``, a
server-streaming call whose start/data/end events carry the command's output (e2b's envd protocol).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import signal
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
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
            argv,
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
