"""Real git repositories for tests: bare repos with commits and tags, a git daemon, a proxy that cuts transfers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path


def git(*args: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


class Upstream:
    """A bare repository with a work tree beside it to make commits from."""

    def __init__(self, root: Path, name: str = "upstream") -> None:
        self.work = root / f"{name}-work"
        self.bare = root / f"{name}.git"
        self.work.mkdir(parents=True)
        git("init", "-q", "-b", "main", cwd=self.work)
        git("init", "-q", "--bare", "-b", "main", str(self.bare))
        git("remote", "add", "origin", str(self.bare), cwd=self.work)

    @property
    def url(self) -> str:
        return f"file://{self.bare}"

    def commit(self, name: str, content: str | bytes, message: str = "") -> str:
        path = self.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        git("add", name, cwd=self.work)
        git("commit", "-q", "-m", message or f"change {name}", cwd=self.work)
        git("push", "-q", "origin", "HEAD:refs/heads/main", "--tags", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work)

    def tag(self, name: str) -> None:
        git("tag", "-a", name, "-m", name, cwd=self.work)
        git("push", "-q", "origin", name, cwd=self.work)


def isolated_git_config(root: Path) -> Path:
    cfg = root / "gitconfig"
    cfg.write_text(
        "[user]\n\tname = runner tests\n\temail = tests@example.invalid\n"
        '[init]\n\tdefaultBranch = main\n[protocol "file"]\n\tallow = always\n'
    )
    return cfg


class GitDaemon:
    """`git daemon` on 127.0.0.1 serving a base path."""

    def __init__(self, base: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [
                "git",
                "daemon",
                "--reuseaddr",
                "--export-all",
                "--listen=127.0.0.1",
                f"--port={self.port}",
                f"--base-path={base}",
                str(base),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its per-connection children are stopped with it (stop)
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("git daemon did not start")

    def url(self, name: str, port: int | None = None) -> str:
        return f"git://127.0.0.1:{port or self.port}/{name}"

    def stop(self) -> None:
        """The daemon and what it forked per connection (a `--serve` child and its upload-pack, which waits for
        ever on a connection a proxy cut)."""
        self.proc.terminate()
        self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)


class CuttingProxy:
    """A TCP proxy that passes `cut_after` bytes of the server's answer and then drops the connection.

    The first `cut_connections` connections are cut; later ones pass through whole (-1: cut them all).
    """

    def __init__(self, target_port: int, cut_after: int, cut_connections: int = -1) -> None:
        self.target_port = target_port
        self.cut_after = cut_after
        self.cut_connections = cut_connections
        self.connections = 0
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            cut = self.cut_connections < 0 or self.connections <= self.cut_connections
            threading.Thread(target=self._serve, args=(client, cut), daemon=True).start()

    def _serve(self, client: socket.socket, cut: bool) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.target_port))

        def pump_up() -> None:
            try:
                while data := client.recv(65536):
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        sent = 0
        try:
            while data := upstream.recv(65536):
                if cut and sent + len(data) > self.cut_after:
                    client.sendall(data[: max(0, self.cut_after - sent)])
                    break
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (client, upstream):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self) -> None:
        self.server.close()


def random_blob(size: int) -> bytes:
    return os.urandom(size)
