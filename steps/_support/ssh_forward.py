"""Connections made from another machine over the run's ssh master, for what runs here: a TCP connection made
there (`ssh -W`, a readiness wait on that machine's own 127.0.0.1) and a local socket forwarded to a socket or
port there (`ssh -O forward`, its Docker Engine). No tool is needed on the host; the master is ssh.py's."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time

from steps._support.ssh import base_argv, connect, control_dir, display, local_env
from steps.base import StepError


def forward(target: str, address: str, port: int, timeout: float) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    """A connection to address:port made from `target` (`ssh -W` over the master): a local socket whose other end
    is that connection, and the ssh process carrying it (the caller closes both). No tool is needed on the host.

    The master confirms the remote side's connect before it answers the mux request, and the client then logs
    "master session id" (openssh-portable mux.c:1083 registers mux_stdio_confirm on the channel's open
    confirmation; mux.c:2277 logs it; mux.c:2288 is the failure): that line is how a refused port is told from an
    open one. StepError when the host could not connect, with what ssh said."""
    import select
    import socket

    connect(target)
    mine, theirs = socket.socketpair()
    argv = [*base_argv(target), "-o", "ControlMaster=no", "-v", "-W", f"{address}:{port}", "--", target]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=theirs.fileno(),
            stdout=theirs.fileno(),
            stderr=subprocess.PIPE,
            env=local_env(),
            start_new_session=True,
        )
    finally:
        theirs.close()
    assert proc.stderr is not None
    said: list[str] = []
    buffer = b""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if not ready:
            break
        chunk = os.read(proc.stderr.fileno(), 4096)
        if not chunk:
            break
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if "master session id" in line:
                threading.Thread(target=_drain, args=(proc,), daemon=True).start()
                return mine, proc
            if line and not line.startswith("debug"):
                said.append(line)
    mine.close()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    proc.wait()
    text = said[-1] if said else "no answer"
    if "refused" in text.lower() or "failed" in text.lower():
        text = f"{display(target)} could not connect to it ({text})"
    raise StepError(text)


_FORWARDS: dict[tuple[str, str], str] = {}
_FORWARDS_LOCK = threading.Lock()


def forward_socket(target: str, endpoint: str) -> str:
    """A local unix socket whose connections the master carries to `endpoint` on the host (a socket path there,
    or host:port as the host reaches it): `ssh -O forward -L` on the run's master, so it costs no connection of
    its own and lives as long as the master. The socket is in the control directory (this user's, 0700). A
    forward the master already holds (an earlier run's, within ControlPersist) is answered as made."""
    import hashlib

    connect(target)
    with _FORWARDS_LOCK:
        known = _FORWARDS.get((target, endpoint))
        if known is not None:
            return known
        digest = hashlib.sha256(f"{target}\0{endpoint}".encode()).hexdigest()[:16]
        path = os.path.join(control_dir(), f"{digest}.fwd")
        argv = [*base_argv(target), "-O", "forward", "-L", f"{path}:{endpoint}", "--", target]
        for attempt in range(2):
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, env=local_env(), timeout=30)
            if done.returncode == 0:
                break
            if attempt == 0 and os.path.exists(path):  # a dead master's file, under a master that keeps files
                with contextlib.suppress(OSError):
                    os.unlink(path)
                continue
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            raise StepError(
                f"cannot forward {endpoint} from {display(target)} over ssh: {said[-1] if said else 'no reason given'}",
                hint=f"check that `ssh {display(target)} true` works and that its sshd allows forwarding",
            )
        _FORWARDS[(target, endpoint)] = path
        return path


def _drain(proc: subprocess.Popen[bytes]) -> None:
    """Read what a forward's ssh still says (so it never blocks on a full pipe) until it ends."""
    assert proc.stderr is not None
    with contextlib.suppress(OSError, ValueError):
        while proc.stderr.read(4096):
            pass
