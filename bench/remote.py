"""Steps on another machine: a converged run of 20 remote steps on one host, its wall time and the connections
it opens, beside what one ssh round trip costs on this machine.

    python bench/remote.py [--rounds 7] [--dir /tmp/runner-bench-remote] [--base REV]

It starts its own OpenSSH server on 127.0.0.1 (a key and known_hosts made for it; tests/sshd.py does that for the
tests too), writes an ssh_config naming it `benchhost`, and a pipeline of 20 steps there: 10 `run` with
`creates`, 6 `assert` (path, program, kernel, sysctl, a file's content), 2 `git` clones and 2 `pip` installs into
venvs (from a local wheel). It converges them, then times converged applies:

- with no master connection left (a fresh control directory): one connection set-up, then every probe a channel;
- within ControlPersist of the previous run (the edit-and-apply loop): no set-up at all;
- both with -j 1 and -j 4;
and, as floors, `ssh benchhost true` through a master and with a fresh connection, and a converged run of the
same 20 steps with no `host:` (this machine). Connections are counted from the server's own log. With `--base REV`,
it times the same converged runs for this tree and for REV (a git worktree under --dir) alternately, in one run
against one server, and prints the medians side by side with the ratio this / base. Probes go to one
shell per host ("the agent", a channel on the master): a probe costs a round trip, not a session. Prints a table.

Where a Docker Engine runs here (the tests' `.ci/docker-up` finds or starts one), it also times a converged run of
a container on that machine's engine over ssh beside an assert there (the engine's socket forwarded on the same
master), and the same container on this machine's engine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from converged import Table, make_wheel, sh  # noqa: E402 - the bench's shared helpers
from sshd import start_sshd  # noqa: E402 - the tests' real sshd, on loopback

PY = sys.executable


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pipeline(work: Path, host: str | None, side: str = "") -> str:
    there = work / side / ("there" if host else "here")
    on = f"host: {host}, " if host else ""
    steps = []
    for i in range(10):
        steps.append(
            f"  - {{name: make{i}, needs: [], run: {{{on}command: 'mkdir -p {there} && touch {there}/f{i}', "
            f"creates: ['{there}/f{i}']}}}}"
        )
    checks = [
        "path: /etc/hostname",
        "program: [sh, git]",
        "kernel: '3.0'",
        "sysctl: {kernel.pid_max: 300}",
        "file: /etc/os-release, contains: ID",
        "path: /proc/self",
    ]
    for i, check in enumerate(checks):
        steps.append(f"  - {{name: check{i}, needs: [], assert: {{{on}{check}}}}}")
    for i in range(2):
        steps.append(
            f"  - {{name: clone{i}, needs: [], git: {{{on}url: '{work / 'repo.git'}', dest: '{there}/clone{i}'}}}}"
        )
    for i in range(2):
        steps.append(
            f"  - {{name: venv{i}, needs: [], pip: {{{on}python: '{PY}', venv: '{there}/venv{i}', "
            f"packages: [benchpkg], find_links: ['{work / 'wheels'}'], no_index: true}}}}"
        )
    return "name: remote-bench\nsteps:\n" + "\n".join(steps) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default="/tmp/runner-bench-remote")
    parser.add_argument("--base", help="a revision to time side by side with this tree (as bench/compare.py)")
    args = parser.parse_args()
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = Path(tempfile.mkdtemp(prefix="rbsshd-"))  # short: control socket paths have a length limit
    port = free_port()
    server = start_sshd(root, port, ["127.0.0.1"], "AcceptEnv DOCKER_HOST\n")  # the engine, for the docker rows
    try:
        if args.base:
            return compare(work, root, port, server, args.rounds, args.base)
        return run(work, root, port, server, args.rounds)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def setup(work: Path, root: Path, port: int, server: object) -> tuple[Path, dict[str, str]]:
    """benchhost in an ssh_config, the environment the runs get, a wheel and a git repository to use."""
    user = os.environ.get("USER") or "root"
    kind, key = server.host_key  # type: ignore[attr-defined]
    (root / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {key}\n")
    config = root / "ssh_config"
    config.write_text(
        f"Host benchhost\n  HostName 127.0.0.1\n  User {user}\n  Port {port}\n  IdentityFile {root}/client_key\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {root}/known_hosts\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # a user's machine keeps bytecode
    env["RUNNER_SSH_CONFIG"] = str(config)
    env["PYTHONPATH"] = str(ROOT)
    for _ in range(100):
        if subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", "benchhost", "true"]).returncode == 0:
            break
        time.sleep(0.1)
    make_wheel(work / "wheels")
    src = work / "src"
    sh(["git", "init", "-q", "-b", "main", str(src)])
    (src / "f").write_text("x\n")
    git_env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "b"}
    git_env["GIT_COMMITTER_EMAIL"] = "b@b"
    sh(["git", "-C", str(src), "add", "f"], env=git_env)
    sh(["git", "-C", str(src), "commit", "-qm", "one"], env=git_env)
    sh(["git", "clone", "-q", "--bare", str(src), str(work / "repo.git")])
    return config, env


def run(work: Path, root: Path, port: int, server: object, rounds: int) -> int:
    config, env = setup(work, root, port, server)
    remote_dir = work / "remote"
    local_dir = work / "local"
    for d, host in ((remote_dir, "benchhost"), (local_dir, None)):
        d.mkdir()
        (d / "pipeline.yaml").write_text(pipeline(work, host))

    def control() -> str:
        return tempfile.mkdtemp(prefix="rbc-")

    def apply(where: Path, jobs: str, control_dir: str) -> tuple[float, int, str]:
        before = server.accepted()  # type: ignore[attr-defined]
        start = time.perf_counter()
        proc = subprocess.run(
            [PY, "-m", "runner", "apply", "-j", jobs],
            cwd=where,
            env={**env, "RUNNER_SSH_CONTROL_DIR": control_dir},
            capture_output=True,
            text=True,
        )
        took = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"apply failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        return took, server.accepted() - before, proc.stdout  # type: ignore[attr-defined]

    warm = control()
    took, opened, out = apply(remote_dir, "4", warm)
    print(f"first apply of 20 remote steps (-j 4): {took:.2f}s, {opened} connection(s) opened")
    apply(local_dir, "4", warm)

    table = Table()
    counts: dict[str, list[int]] = {}
    for jobs in ("1", "4"):
        cold_t, cold_n, warm_t, warm_n, local_t = [], [], [], [], []
        for _ in range(rounds):
            fresh = control()
            t, n, out = apply(remote_dir, jobs, fresh)
            assert "changed=0" in out, out
            cold_t.append(t)
            cold_n.append(n)
            t, n, out = apply(remote_dir, jobs, fresh)
            warm_t.append(t)
            warm_n.append(n)
            subprocess.run(
                ["ssh", "-F", str(config), "-o", f"ControlPath={fresh}/%C", "-O", "exit", "benchhost"],
                capture_output=True,
            )
            shutil.rmtree(fresh, ignore_errors=True)
            local_t.append(apply(local_dir, jobs, warm)[0])
        table.add(f"converged, 20 remote steps, -j {jobs}, no master yet", cold_t, f"connections {_counts(cold_n)}")
        kept = f"converged, 20 remote steps, -j {jobs}, master kept (ControlPersist)"
        table.add(kept, warm_t, f"connections {_counts(warm_n)}")
        table.add(f"converged, the same 20 steps on this machine, -j {jobs}", local_t)
        counts[jobs] = cold_n

    mux = []
    fresh_conn = []
    master = ["-o", f"ControlPath={warm}/%C"]
    for _ in range(rounds):
        start = time.perf_counter()
        subprocess.run(["ssh", "-F", str(config), *master, "-o", "ControlMaster=no", "benchhost", "true"], check=True)
        mux.append(time.perf_counter() - start)
        start = time.perf_counter()
        subprocess.run(
            ["ssh", "-F", str(config), "-o", "ControlPath=none", "-o", "BatchMode=yes", "benchhost", "true"],
            check=True,
        )
        fresh_conn.append(time.perf_counter() - start)
    docker_rows(work, config, env, server, table, rounds)
    table.add("floor: `ssh benchhost true` through the master (one round trip)", mux)
    table.add("floor: `ssh benchhost true` with a connection of its own", fresh_conn)
    subprocess.run(["ssh", "-F", str(config), *master, "-O", "exit", "benchhost"], capture_output=True)
    table.print()
    one = statistics.median(mux)
    kept = table.median("converged, 20 remote steps, -j 1, master kept (ControlPersist)")
    here = table.median("converged, the same 20 steps on this machine, -j 1")
    print()
    print(f"a converged run of 20 remote steps opens {_counts(counts['1'])} connection(s) to its host (target: 1).")
    print(
        f"With -j 1 and the master kept, the 20 probes add {kept - here:.2f}s to the same run on this machine, "
        f"{(kept - here) / 20 * 1000:.0f} ms a step: one session for the host's agent ({one * 1000:.0f} ms here, "
        "what this machine's sshd and login shell take to start a command), then each probe one write and one "
        "read on it, plus the probes' own work there (pip's lists its interpreter's packages with Python)."
    )
    return 0


def compare(work: Path, root: Path, port: int, server: object, rounds: int, base: str) -> int:
    """This tree and `base`, alternately: converged runs of the 20 remote steps (no master yet, and with the
    master kept), -j 1 and -j 4, and the same steps on this machine; medians side by side."""
    config, env = setup(work, root, port, server)
    tree = work / "base-tree"
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=True)
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), base], cwd=ROOT, check=True, capture_output=True)
    revision = sh(["git", "-C", str(ROOT), "rev-parse", "--short", base]).strip()
    sides = {"base": tree, "this": ROOT}
    dirs: dict[tuple[str, str], Path] = {}
    for label in sides:
        for where, host in (("remote", "benchhost"), ("local", None)):
            d = work / label / where
            d.mkdir(parents=True)
            (d / "pipeline.yaml").write_text(pipeline(work, host, label))
            dirs[(label, where)] = d

    def apply(label: str, where: str, jobs: str, control_dir: str, converged: bool = True) -> float:
        start = time.perf_counter()
        proc = subprocess.run(
            [PY, "-m", "runner", "apply", "-j", jobs],
            cwd=dirs[(label, where)],
            env={**env, "PYTHONPATH": str(sides[label]), "RUNNER_SSH_CONTROL_DIR": control_dir},
            capture_output=True,
            text=True,
        )
        took = time.perf_counter() - start
        if proc.returncode != 0 or (converged and "changed=0" not in proc.stdout):
            raise SystemExit(f"{label}: apply failed or changed something:\n{proc.stdout[-3000:]}\n{proc.stderr}")
        return took

    warm = tempfile.mkdtemp(prefix="rbc-")
    try:
        for label in sides:
            for where in ("remote", "local"):
                apply(label, where, "4", warm, converged=False)
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(rounds):
            for jobs in ("1", "4"):
                for label in sides:
                    fresh = tempfile.mkdtemp(prefix="rbc-")
                    samples.setdefault((f"-j {jobs}, no master yet", label), []).append(
                        apply(label, "remote", jobs, fresh)
                    )
                    samples.setdefault((f"-j {jobs}, master kept", label), []).append(
                        apply(label, "remote", jobs, fresh)
                    )
                    subprocess.run(
                        ["ssh", "-F", str(config), "-o", f"ControlPath={fresh}/%C", "-O", "exit", "benchhost"],
                        capture_output=True,
                    )
                    shutil.rmtree(fresh, ignore_errors=True)
                    samples.setdefault((f"-j {jobs}, on this machine", label), []).append(
                        apply(label, "local", jobs, warm)
                    )
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(warm, ignore_errors=True)
    print(f"base: {base} ({revision}); this: the working tree; {rounds} rounds, alternating; medians")
    print(f"{'converged, the 20 steps':42} {'base':>8} {'this':>8} {'this/base':>10}")
    for name in dict.fromkeys(n for n, _ in samples):
        was = statistics.median(samples[(name, "base")])
        now = statistics.median(samples[(name, "this")])
        print(f"{name:42} {was:7.3f}s {now:7.3f}s {now / was:9.2f}x")
    return 0


def docker_rows(work: Path, config: Path, env: dict[str, str], server: object, table: Table, rounds: int) -> None:
    """A container on benchhost's engine (over ssh) with an assert there, converged: its wall time and the
    connections it opens; and the same container on this machine's engine. Left out, said why, with no engine."""
    up = subprocess.run([str(ROOT / ".ci" / "docker-up")], capture_output=True, text=True, timeout=600)
    engine = up.stdout.strip().splitlines()[-1] if up.returncode == 0 and up.stdout.strip() else ""
    if not engine:
        print(f"(no docker rows: no Docker Engine here: {up.stderr.strip()[-200:]})")
        return
    import docker
    from conftest import BUSYBOX_IMAGE, ensure_busybox_image

    client = docker.DockerClient(base_url=engine, timeout=60)
    ensure_busybox_image(client)
    with config.open("a") as out:  # benchhost's sessions find the engine where this machine's docker does
        out.write(f"  SetEnv DOCKER_HOST={engine}\n")
    names = {"remote": "runner-bench-ssh-box", "local": "runner-bench-local-box"}
    for where, name in names.items():
        on = "host: benchhost, " if where == "remote" else ""
        d = work / f"docker-{where}"
        d.mkdir()
        (d / "pipeline.yaml").write_text(
            "name: docker-bench\nsteps:\n"
            f"  - {{name: kvm, assert: {{{on}path: /proc/self}}}}\n"
            f"  - {{name: box, docker: {{{on}name: {name}, image: '{BUSYBOX_IMAGE}', pull: never, "
            "command: [sleep, '3600']}}\n"
        )
    denv = {**env, "DOCKER_HOST": engine}

    def apply(d: Path, converged: bool = True) -> tuple[float, int]:
        """A converged apply with no master left (a fresh control directory): its time, connections opened."""
        fresh = tempfile.mkdtemp(prefix="rbd-")
        before = server.accepted()  # type: ignore[attr-defined]
        start = time.perf_counter()
        proc = subprocess.run(
            [PY, "-m", "runner", "apply"],
            cwd=d,
            env={**denv, "RUNNER_SSH_CONTROL_DIR": fresh},
            capture_output=True,
            text=True,
        )
        took = time.perf_counter() - start
        opened = server.accepted() - before  # type: ignore[attr-defined]
        subprocess.run(
            ["ssh", "-F", str(config), "-o", f"ControlPath={fresh}/%C", "-O", "exit", "benchhost"],
            capture_output=True,
        )
        shutil.rmtree(fresh, ignore_errors=True)
        if proc.returncode != 0:
            raise SystemExit(f"docker apply failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
        if converged and "changed=0" not in proc.stdout:
            raise SystemExit(f"a converged run changed something:\n{proc.stdout[-3000:]}")
        return took, opened

    try:
        for where in names:
            d = work / f"docker-{where}"
            apply(d, converged=False)  # the first: creates the container
            runs = [apply(d) for _ in range(rounds)]
            if where == "remote":
                label = "converged, a container on benchhost's engine + an assert, no master"
                table.add(label, [t for t, _ in runs], f"connections {_counts([n for _, n in runs])}")
            else:
                table.add("converged, the same container on this machine's engine", [t for t, _ in runs])
    finally:
        for name in names.values():
            try:
                client.containers.get(name).remove(force=True)
            except docker.errors.NotFound:
                pass
        client.close()


def _counts(values: list[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}-{high}"


if __name__ == "__main__":
    raise SystemExit(main())
