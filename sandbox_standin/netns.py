"""A network of its own for each sandbox, as each AgentENV sandbox is a VM with its own address: a sandbox's
`0.0.0.0:8000` is its own, so every sandbox of a rollout can serve its env server on the same port, and no
sandbox reaches another's ports or this host's loopback services.

Each sandbox gets a holder process in a new network namespace (`unshare --net`; a user namespace too when this
is not root, where the kernel allows it). The holder brings `lo` up and relays connections: for each one the
stand-in makes a socket pair, hands one end to the holder over their control socket (SCM_RIGHTS) with a port,
and the holder joins it to 127.0.0.1:port inside. A sandbox's commands join the namespace with `nsenter`.
Where neither works (no util-linux, user namespaces disabled), sandboxes share this host's network, as before
(the stand-in says so once), and the proxy only forwards to a port whose listener the sandbox started.

    python -m sandbox_standin.netns FD     # the holder, run by Network.start inside `unshare`
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

READY_TIMEOUT = 5.0


class Network:
    """One sandbox's namespace: its holder, the argv prefix that runs a command inside, and connections in."""

    def __init__(self, proc: subprocess.Popen[bytes], control: socket.socket, nsenter: str, unshare: str) -> None:
        self.proc, self.control, self.nsenter, self.unshare = proc, control, nsenter, unshare
        self.userns = os.geteuid() != 0  # root of a user namespace of its own (this host's uid mapped to 0)
        self.lock = threading.Lock()

    def argv(self, uid: int) -> list[str]:
        """The prefix that runs a command inside as `uid`: root (this host's, or the user namespace's), or an
        unprivileged uid: nsenter's --setuid/--setgid where this host is root, else a nested user namespace
        that maps only `uid` (to this host's uid: no capability over the sandbox's network or this host)."""
        pid = str(self.proc.pid)
        if not self.userns:
            ids = [f"--setuid={uid}", f"--setgid={uid}"] if uid else []
            return [self.nsenter, "-t", pid, "-n", *ids, "--"]
        inner = [self.unshare, "--user", f"--map-user={uid}", f"--map-group={uid}", "--"] if uid else []
        return [self.nsenter, "-t", pid, "-U", "-n", "--preserve-credentials", "--", *inner]

    @classmethod
    def start(cls, directory: Path) -> Network | None:
        """The sandbox's namespace, or None where this host cannot make one."""
        unshare, nsenter = shutil.which("unshare"), shutil.which("nsenter")
        if not unshare or not nsenter:
            return None
        user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [unshare, *user, "--net", sys.executable, "-m", "sandbox_standin.netns", str(theirs.fileno())]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
        try:
            proc = subprocess.Popen(
                argv,
                cwd=directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
            )
        except OSError:
            ours.close()
            return None
        finally:
            theirs.close()
        ours.settimeout(READY_TIMEOUT)
        try:
            ready = ours.recv(1) == b"+"
        except OSError:
            ready = False
        if not ready:
            ours.close()
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
            return None
        ours.settimeout(None)
        return cls(proc, ours, nsenter, unshare)

    def connect(self, port: int, timeout: float = 5.0) -> socket.socket:
        """A connection to port `port` inside; ConnectionRefusedError when nothing listens there."""
        mine, given = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with self.lock:
                socket.send_fds(self.control, [str(port).encode()], [given.fileno()])
        except OSError:
            mine.close()
            raise
        finally:
            given.close()
        mine.settimeout(timeout)
        try:
            if mine.recv(1) != b"+":
                raise ConnectionRefusedError(f"nothing listens on port {port}")
        except BaseException:
            mine.close()
            raise
        return mine

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait()
        self.control.close()


# ---- the holder, inside the namespace ---------------------------------------------------------------------


def _loopback_up() -> None:
    """`ip link set lo up`, by ioctl (SIOCGIFFLAGS / SIOCSIFFLAGS with IFF_UP), so no iproute2 is needed."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, 0x8913, request))[1]
        fcntl.ioctl(sock, 0x8914, struct.pack("16sH14x", b"lo", flags | 0x1))


def pipe(a: socket.socket, b: socket.socket, join_timeout: float | None = None) -> None:
    """Bytes both ways until either side closes."""

    def copy(source: socket.socket, target: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                target.sendall(chunk)
        except OSError:
            pass
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    back = threading.Thread(target=copy, args=(b, a), daemon=True)
    back.start()
    copy(a, b)
    back.join(timeout=join_timeout)


def _relay(client: socket.socket, port: int) -> None:
    try:
        try:
            inside = socket.create_connection(("127.0.0.1", port), timeout=5.0)
        except OSError:
            client.sendall(b"-")
            return
        inside.settimeout(None)
        client.sendall(b"+")
        pipe(client, inside)
        inside.close()
    finally:
        client.close()


def main(fd: str) -> int:
    # no PR_SET_PDEATHSIG: it fires when the stand-in's thread that started this ends; the control socket's end
    # of file (the stand-in gone, or the sandbox killed) ends it instead
    control = socket.socket(fileno=int(fd))
    _loopback_up()
    control.sendall(b"+")
    while True:
        message, fds, _flags, _address = socket.recv_fds(control, 16, 1)
        if not message:  # the stand-in closed its end: the sandbox is gone
            return 0
        for given in fds:
            try:
                port = int(message)
            except ValueError:
                os.close(given)
                continue
            client = socket.socket(fileno=given)
            threading.Thread(target=_relay, args=(client, port), daemon=True).start()


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
