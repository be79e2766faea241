"""A real OpenSSH server on loopback for the tests: installed if missing (as root under CI), started with a host key
and a client key made for the test, and the client configuration (aliases, known_hosts) that lets runner's `ssh`
in. Shared by the remote-step tests and the docker-over-ssh tests; the remote-step fixture is session-wide."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"


def ensure_sshd() -> None:
    if os.path.exists(SSHD):
        return
    if os.geteuid() == 0 and (os.environ.get("CI") == "true" or os.environ.get("RUNNER_SSH_INSTALL") == "1"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        if subprocess.run(
            ["apt-get", "install", "-y", "-q", "openssh-server"], env=env, capture_output=True
        ).returncode:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            subprocess.run(["apt-get", "install", "-y", "-q", "openssh-server"], env=env, capture_output=True)
    if not os.path.exists(SSHD):
        if os.environ.get("CI") == "true":
            pytest.fail("no sshd and it could not be installed (apt-get install openssh-server)")
        pytest.skip("no OpenSSH server (apt-get install openssh-server, or RUNNER_SSH_INSTALL=1 as root)")


@dataclass
class Sshd:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    host_key: list[str] = field(default_factory=list)  # [type, base64] of the server's public key

    def accepted(self) -> int:
        """Connections the server has let in so far (one "Accepted publickey" line each)."""
        return self.log.read_text(errors="replace").count("Accepted publickey")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def start_sshd(root: Path, port: int, listen: list[str], extra: str = "") -> Sshd:
    """sshd on `listen` addresses (loopback only) and `port`, letting in root/the test user with root/client_key."""
    ensure_sshd()
    for name in ("host_key", "client_key"):
        if not (root / name).exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    shutil.copy(root / "client_key.pub", root / "authorized_keys")
    addresses = "".join(f"ListenAddress {a}\n" for a in listen)
    (root / "sshd_config").write_text(
        f"""Port {port}
{addresses}HostKey {root}/host_key
PidFile {root}/sshd.pid
AuthorizedKeysFile {root}/authorized_keys
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
{extra}"""
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    log = root / "sshd.log"
    proc = subprocess.Popen([SSHD, "-D", "-E", str(log), "-f", str(root / "sshd_config")])
    host_key = (root / "host_key.pub").read_text().split()[:2]
    return Sshd(root, port, proc, log, host_key)


def wait_until_in(argv: list[str], server: Sshd) -> None:
    deadline = time.monotonic() + 20
    probe = None
    while time.monotonic() < deadline:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        if probe.returncode == 0:
            return
        time.sleep(0.2)
    server.stop()
    said = probe.stderr if probe else ""
    pytest.fail(f"sshd did not let the test in: {said}\n{server.log.read_text(errors='replace')}")
