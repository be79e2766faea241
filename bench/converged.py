"""Benchmarks of the hot path, side by side with Ansible and pyinfra, on this machine.

    python bench/converged.py [--rounds 7] [--dir /tmp/runner-bench] [--no-ansible] [--no-pyinfra]

It builds its own fixtures (git bundles, a wheel, a venv, a throttled git server), installs Ansible and pyinfra
into virtual environments of their own (from the package index; `--no-ansible` / `--no-pyinfra` skip a side),
converges every side, then times them alternately and prints a table of medians, minima, maxima and ratios:

- converged `apply` of the quickstart pipeline, and `runner --help`;
- converged runner vs converged `ansible-playbook` and `pyinfra @local` doing the same work: three local git
  clones, two pip installs into a venv, a command with `creates`, and a Docker container when an engine is
  reachable (and community.docker is there);
- what a converged quickstart run imports (no e2b, no module of an unused kind);
- plan (fresh, and converged) and converged apply of a generated pipeline of 500 and 1000 `run` steps, and the
  bytes a 1000-step apply writes;
- `-j 3` against `-j 1` over three clones from a git daemon behind a throttling proxy.
Timing assertions do not belong in tests: this prints figures, and says which targets they meet.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "examples" / "quickstart"
BUSYBOX = "runner-test/busybox:1"
PY = sys.executable


def sh(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None, expect: int | None = 0) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    elapsed = time.perf_counter() - start
    if expect is not None and proc.returncode != expect:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return elapsed


def runner_argv(*args: str) -> list[str]:
    return [PY, "-m", "runner", *args]


# ---- fixtures -------------------------------------------------------------------------------------------


def make_wheel(where: Path, name: str = "benchpkg", version: str = "1.0") -> None:
    where.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f'VERSION = "{version}"\n'.encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    lines = []
    for n, d in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b"=").decode()
        lines.append(f"{n},sha256={h},{len(d)}")
    files[f"{info}/RECORD"] = ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(where / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)


def docker_available() -> str | None:
    """DOCKER_HOST of an engine that has the test image, or None."""
    try:
        host = subprocess.run([str(ROOT / ".ci" / "docker-up")], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    address = host.stdout.strip().splitlines()[-1] if host.returncode == 0 and host.stdout.strip() else ""
    if not address:
        return None
    try:
        import docker

        client = docker.DockerClient(base_url=address)
        client.images.get(BUSYBOX)
    except Exception:
        return None
    return address


def equivalent_work(work: Path, docker_host: str | None) -> tuple[Path, Path, Path]:
    """The same work for each side: (pipeline.yaml, playbook.yml, pyinfra's deploy.py)."""
    wheels = work / "wheels"
    make_wheel(wheels)
    side = {"runner": work / "runner-side", "ansible": work / "ansible-side", "pyinfra": work / "pyinfra-side"}
    for path in side.values():
        shutil.rmtree(path, ignore_errors=True)  # fresh fixtures on every bench run
        path.mkdir(parents=True)
    bundles = work / "repos"  # bare repos made from the quickstart's bundles (Ansible cannot clone a bundle)
    for name in ("miles", "OpenEnv", "terminal-bench-2"):
        if not (bundles / f"{name}.git").exists():
            sh(
                [
                    "git",
                    "clone",
                    "-q",
                    "--bare",
                    str(QUICKSTART / "repos" / f"{name}.bundle"),
                    str(bundles / f"{name}.git"),
                ]
            )
    container = {"runner": "bench-runner-side", "ansible": "bench-ansible-side", "pyinfra": "bench-pyinfra-side"}
    docker_step = (
        f"""
  - name: box
    needs: []
    docker:
      name: {container["runner"]}
      image: {BUSYBOX}
      pull: never
      command: [sleep, "3600"]
      host: {docker_host}
"""
        if docker_host
        else ""
    )
    pipeline = side["runner"] / "pipeline.yaml"
    pipeline.write_text(
        textwrap.dedent(
            f"""
            name: bench
            steps:
              - name: miles
                needs: []
                git: {{url: {bundles}/miles.git, dest: miles, ref: main}}
              - name: openenv
                needs: []
                git: {{url: {bundles}/OpenEnv.git, dest: OpenEnv, ref: main}}
              - name: tb2
                needs: []
                git: {{url: {bundles}/terminal-bench-2.git, dest: terminal-bench-2, ref: main}}
              - name: env-editable
                needs: [openenv]
                pip:
                  venv: venv
                  python: {PY}
                  editable: ["{{{{ steps.openenv.path }}}}/envs/tbench2_env"]
              - name: env-wheel
                needs: [env-editable]
                pip: {{venv: venv, python: {PY}, packages: [benchpkg], no_index: true, find_links: [{wheels}]}}
              - name: data
                needs: []
                run: {{command: "echo data > data.txt", creates: [data.txt]}}
            """
        ).lstrip()
        + docker_step
    )
    docker_task = (
        f"""
    - name: box
      community.docker.docker_container:
        name: {container["ansible"]}
        image: {BUSYBOX}
        command: [sleep, "3600"]
        docker_host: {docker_host}
        state: started
        pull: never
"""
        if docker_host
        else ""
    )
    a = side["ansible"]
    playbook = a / "playbook.yml"
    playbook.write_text(
        textwrap.dedent(
            f"""
            - hosts: localhost
              connection: local
              gather_facts: false
              tasks:
                - name: miles
                  ansible.builtin.git: {{repo: "{bundles}/miles.git", dest: "{a}/miles", version: main}}
                - name: openenv
                  ansible.builtin.git: {{repo: "{bundles}/OpenEnv.git", dest: "{a}/OpenEnv", version: main}}
                - name: tb2
                  ansible.builtin.git:
                    repo: "{bundles}/terminal-bench-2.git"
                    dest: "{a}/terminal-bench-2"
                    version: main
                - name: env-editable
                  ansible.builtin.pip:
                    name: "{a}/OpenEnv/envs/tbench2_env"
                    editable: true
                    virtualenv: "{a}/venv"
                    virtualenv_command: "{PY} -m venv"
                - name: env-wheel
                  ansible.builtin.pip:
                    name: benchpkg
                    virtualenv: "{a}/venv"
                    extra_args: "--no-index --find-links {wheels}"
                - name: data
                  ansible.builtin.command:
                    cmd: "sh -c 'echo data > data.txt'"
                    chdir: "{a}"
                    creates: "{a}/data.txt"
            """
        ).lstrip()
        + docker_task.lstrip("\n")
    )
    p = side["pyinfra"]
    deploy = p / "deploy.py"
    docker_op = (
        f"docker.container(name='box', container={container['pyinfra']!r}, image={BUSYBOX!r}, command='sleep 3600')\n"
        if docker_host
        else ""
    )
    # pyinfra has no idempotent editable install (pip.packages compares `pip freeze` name==version lines, which an
    # editable install does not print), so the editable install is guarded by a fact, as a pyinfra user would.
    deploy.write_text(
        textwrap.dedent(
            f"""
            from pyinfra import host
            from pyinfra.facts.files import File
            from pyinfra.facts.server import Command
            from pyinfra.operations import docker, git, pip, server

            git.repo(name="miles", src="{bundles}/miles.git", dest="{p}/miles", branch="main")
            git.repo(name="openenv", src="{bundles}/OpenEnv.git", dest="{p}/OpenEnv", branch="main")
            git.repo(name="tb2", src="{bundles}/terminal-bench-2.git", dest="{p}/terminal-bench-2", branch="main")
            pip.venv(name="venv", path="{p}/venv", python="{PY}")
            probe = "{p}/venv/bin/pip show -q openenv-tbench2_env >/dev/null 2>&1 && echo yes || echo no"
            if host.get_fact(Command, command=probe) != "yes":
                server.shell(name="env-editable", commands=["{p}/venv/bin/pip install -e {p}/OpenEnv/envs/tbench2_env"])
            pip.packages(
                name="env-wheel",
                packages=["benchpkg"],
                virtualenv="{p}/venv",
                extra_install_args="--no-index --find-links {wheels}",
            )
            if not host.get_fact(File, path="{p}/data.txt"):
                server.shell(name="data", commands=["cd {p} && echo data > data.txt"])
            """
        ).lstrip()
        + docker_op
    )
    return pipeline, playbook, deploy


def install_tool(work: Path, label: str, venv_name: str, program: str, packages: list[str]) -> Path | None:
    """`program` from a venv of its own under `work`, with `packages` installed from the package index once."""
    venv = work / venv_name
    binary = venv / "bin" / program
    if binary.exists():
        return binary
    print(f"installing {label} into {venv} (from the package index) ...", flush=True)
    sh([PY, "-m", "venv", str(venv)])
    proc = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *packages], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"could not install {label}:", proc.stderr[-500:], flush=True)
        return None
    return binary


# ---- measurements ---------------------------------------------------------------------------------------


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, list[float], str]] = []

    def add(self, name: str, samples: list[float], note: str = "") -> None:
        self.rows.append((name, samples, note))
        med = statistics.median(samples)
        print(f"  {name:<68} median {med:8.3f}s  {note}", flush=True)

    def median(self, name: str) -> float:
        return next(statistics.median(s) for n, s, _ in self.rows if n == name)

    def print(self) -> None:
        print()
        print(f"| {'measurement':<68} | {'median':>8} | {'min':>8} | {'max':>8} | note")
        print(f"|{'-' * 70}|{'-' * 10}|{'-' * 10}|{'-' * 10}|------")
        for name, samples, note in self.rows:
            print(
                f"| {name:<68} | {statistics.median(samples):8.3f} | {min(samples):8.3f} | {max(samples):8.3f} | {note}"
            )


def alternate(rounds: int, sides: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            samples[name].append(run())
    return samples


def quickstart_copy(work: Path) -> tuple[Path, list[str]]:
    target = work / "quickstart"
    if target.exists():
        subprocess.run(runner_argv("stop", "sandbox_server"), cwd=target, capture_output=True)
        shutil.rmtree(target)
    shutil.copytree(QUICKSTART, target, ignore=shutil.ignore_patterns(".work", ".runner", "__pycache__"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return target, ["--var", f"port={port}"]


def imports_of(args: list[str], cwd: Path) -> set[str]:
    """The modules a runner run has imported when it exits."""
    code = (
        "import atexit, json, runpy, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
        "sys.argv = ['runner', *sys.argv[1:]]\n"
        "runpy.run_module('runner', run_name='__main__')\n"
    )
    proc = subprocess.run([PY, "-c", code, *args], cwd=cwd, capture_output=True, text=True)
    return set(json.loads(proc.stderr.strip().splitlines()[-1]))


def generated(work: Path, count: int) -> Path:
    where = work / f"gen-{count}"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    lines = ["name: generated", "steps:"]
    for i in range(count):
        needs = "[]" if i % 10 == 0 else f"[s{i - 1}]"
        lines += [f"  - name: s{i}", f"    needs: {needs}", f'    run: {{command: ["true"], creates: [{i}.out]}}']
    (where / "pipeline.yaml").write_text("\n".join(lines) + "\n")
    for i in range(count):
        (where / f"{i}.out").write_text("")
    return where


def written_bytes(argv: list[str], cwd: Path) -> int:
    """Bytes the runner process wrote (wchar of /proc/self/io, read as it exits)."""
    code = (
        "import atexit, os, runpy, sys\n"
        "atexit.register(lambda: os.write(2, b'WCHAR=' + open('/proc/self/io').read().split('wchar: ')[1]"
        ".split()[0].encode() + b'\\n'))\n"
        f"sys.argv = {['runner', *argv]!r}\n"
        "runpy.run_module('runner', run_name='__main__')\n"
    )
    proc = subprocess.run([PY, "-c", code], cwd=cwd, capture_output=True, text=True)
    for line in proc.stderr.splitlines():
        if line.startswith("WCHAR="):
            return int(line[6:])
    raise SystemExit(f"no byte count: {proc.stderr[-500:]}")


class Throttle:
    """A TCP proxy that passes at most `rate` bytes a second per connection, each way."""

    def __init__(self, target: int, rate: int) -> None:
        self.target, self.rate = target, rate
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        chunk = max(1024, self.rate // 20)
        try:
            while True:
                data = src.recv(chunk)
                if not data:
                    break
                dst.sendall(data)
                time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def slow_clones(work: Path, rounds: int, table: Table) -> None:
    base = work / "daemon"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    for name in ("a", "b", "c"):
        src = work / f"src-{name}"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        (src / "blob.bin").write_bytes(os.urandom(1_500_000))  # incompressible: the proxy sets the pace
        sh(["git", "init", "-q", "-b", "main", str(src)])
        sh(["git", "-C", str(src), "add", "-A"])
        sh(["git", "-C", str(src), "-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "blob"])
        sh(["git", "clone", "-q", "--bare", str(src), str(base / f"{name}.git")])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            f"--base-path={base}",
            f"--port={port}",
            "--listen=127.0.0.1",
            str(base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    time.sleep(0.5)
    proxy = Throttle(port, rate=1_500_000)
    where = work / "clones"
    try:

        def run(jobs: str) -> float:
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            steps = "\n".join(
                f"  - name: {n}\n    needs: []\n    git: {{url: 'git://127.0.0.1:{proxy.port}/{n}.git', dest: {n}}}"
                for n in ("a", "b", "c")
            )
            (where / "pipeline.yaml").write_text(f"name: clones\nsteps:\n{steps}\n")
            return timed(runner_argv("apply", "-j", jobs), where)

        samples = alternate(rounds, {"1": lambda: run("1"), "3": lambda: run("3")})
        table.add("3 throttled clones, -j 1", samples["1"])
        ratio = statistics.median(samples["3"]) / statistics.median(samples["1"])
        table.add("3 throttled clones, -j 3", samples["3"], f"{ratio:.2f} of -j 1 (target <= 0.45)")
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        proxy.sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dir", default="/tmp/runner-bench")
    parser.add_argument("--no-ansible", action="store_true")
    parser.add_argument("--no-pyinfra", action="store_true")
    args = parser.parse_args()
    work = Path(args.dir)
    work.mkdir(parents=True, exist_ok=True)
    table = Table()
    # Python writes bytecode on a user's machine; an environment that forbids it (this CI image sets
    # PYTHONDONTWRITEBYTECODE=1) makes every run recompile what it imports. Every side runs without it.
    dropped = os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"runner benchmarks on {os.cpu_count()} cores, {args.rounds} rounds each, in {work}; python {PY}")
    if dropped is not None:
        print("  PYTHONDONTWRITEBYTECODE was set: unset for every timed run (bytecode written, as on a user's machine)")

    # -- runner --help, and the converged quickstart --------------------------------------------------
    timed(runner_argv("--help"), ROOT)
    table.add("runner --help", [timed(runner_argv("--help"), ROOT) for _ in range(args.rounds)], "target <= 0.15 s")
    qs, port = quickstart_copy(work)
    try:
        timed(runner_argv("apply", *port), qs)
        timed(runner_argv("apply", *port), qs)
        samples = [timed(runner_argv("apply", *port), qs) for _ in range(args.rounds)]
        table.add("converged apply, examples/quickstart (13 steps)", samples, "target <= 0.18 s")
        names = imports_of(["apply", *port], qs)
        e2b = sorted(n for n in names if n == "e2b" or n.startswith("e2b."))
        unused = sorted(
            n for n in names if n in ("steps.docker", "docker", "steps.capture", "steps._support.docker_engine")
        )
        print(f"  converged quickstart imports e2b: {e2b or 'no'}; unused kinds: {unused or 'none'}")
        floor = [timed([PY, "-c", "pass"], qs) for _ in range(args.rounds)]
        table.add("floor: python -c pass", floor, "the interpreter's own start")
        libraries = "import pydantic, yaml, jinja2; from pydantic import BaseModel"
        table.add(
            "floor: python -c 'import pydantic, yaml, jinja2'",
            [timed([PY, "-c", libraries], qs) for _ in range(args.rounds)],
            "what runner is built on, imported and nothing else",
        )
    finally:
        subprocess.run(runner_argv("stop", "sandbox_server", *port), cwd=qs, capture_output=True)

    # -- side by side with Ansible and pyinfra --------------------------------------------------------
    docker_host = docker_available()
    print(f"  docker engine with {BUSYBOX}: {docker_host or 'none (the container task is left out on every side)'}")
    pipeline, playbook, deploy = equivalent_work(work, docker_host)
    runner_env = dict(os.environ)
    ansible_packages = ["ansible", "docker", "requests"] if docker_host else ["ansible-core"]
    ansible = None
    if not args.no_ansible:
        ansible = install_tool(work, "Ansible", "ansible-venv", "ansible-playbook", ansible_packages)
    pyinfra = None if args.no_pyinfra else install_tool(work, "pyinfra", "pyinfra-venv", "pyinfra", ["pyinfra"])
    timed(runner_argv("apply", "-f", str(pipeline)), pipeline.parent)
    timed(runner_argv("apply", "-f", str(pipeline)), pipeline.parent)
    sides: dict[str, Callable[[], float]] = {
        "runner": lambda: timed(runner_argv("apply", "-f", str(pipeline)), pipeline.parent, runner_env),
    }
    if ansible is not None:
        ansible_env = {
            **os.environ,
            "ANSIBLE_PYTHON_INTERPRETER": str(ansible.parent / "python"),
            "ANSIBLE_LOCALHOST_WARNING": "false",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
            "ANSIBLE_NOCOLOR": "1",
        }
        if docker_host:
            ansible_env["DOCKER_HOST"] = docker_host
        play = [str(ansible), "-i", "localhost,", str(playbook)]
        timed(play, playbook.parent, ansible_env)
        timed(play, playbook.parent, ansible_env)
        sides["ansible"] = lambda: timed(play, playbook.parent, ansible_env)
    if pyinfra is not None:
        pyinfra_env = {**os.environ, **({"DOCKER_HOST": docker_host} if docker_host else {})}
        deploy_argv = [str(pyinfra), "-y", "@local", str(deploy)]
        timed(deploy_argv, deploy.parent, pyinfra_env)
        timed(deploy_argv, deploy.parent, pyinfra_env)
        sides["pyinfra"] = lambda: timed(deploy_argv, deploy.parent, pyinfra_env)
    samples = alternate(args.rounds, sides)
    what = "3 clones, 2 pip, 1 creates" + (", 1 container" if docker_host else "")
    table.add(f"converged runner apply ({what})", samples["runner"])
    for other, label, target in (("ansible", "ansible-playbook", "25x"), ("pyinfra", "pyinfra @local", "")):
        if other in samples:
            ratio = statistics.median(samples[other]) / statistics.median(samples["runner"])
            goal = f" (target >= {target})" if target else ""
            table.add(f"converged {label} ({what})", samples[other], f"runner is {ratio:.1f}x faster{goal}")

    # -- scale ----------------------------------------------------------------------------------------
    for count in (500, 1000):
        gen = generated(work, count)
        if f"plan: {count} step(s) to run" not in sh(runner_argv("plan"), gen, check=False):
            raise SystemExit(f"the generated {count}-step pipeline does not plan")
        table.add(
            f"plan, {count} run steps, no state",
            [timed(runner_argv("plan"), gen, expect=2) for _ in range(3)],
            "target <= 1.5 s" if count == 500 else "",
        )
        timed(runner_argv("apply"), gen)
        table.add(f"plan, {count} run steps, converged", [timed(runner_argv("plan"), gen) for _ in range(3)])
        table.add(
            f"apply, {count} run steps, converged",
            [timed(runner_argv("apply"), gen) for _ in range(args.rounds)],
            "target <= 1.0 s" if count == 1000 else "",
        )
    ratio = table.median("plan, 1000 run steps, no state") / table.median("plan, 500 run steps, no state")
    print(f"  plan 1000 / plan 500 = {ratio:.2f} (target <= 2.2)")
    ratio = table.median("apply, 1000 run steps, converged") / table.median("apply, 500 run steps, converged")
    print(f"  converged apply 1000 / 500 = {ratio:.2f} (target <= 2.2)")
    gen = generated(work, 1000)
    wrote = written_bytes(["apply"], gen)
    state_size = (gen / ".runner" / "state.json").stat().st_size
    print(
        f"  a 1000-step apply wrote {wrote / 1e6:.1f} MB in all (logs included); state.json is "
        f"{state_size / 1e6:.2f} MB (rewriting it per transition would be {2000 * state_size / 1e9:.1f} GB)"
    )

    # -- parallel clones ------------------------------------------------------------------------------
    slow_clones(work, max(3, args.rounds // 2), table)

    if docker_host:
        import docker

        client = docker.DockerClient(base_url=docker_host)
        for name in ("bench-runner-side", "bench-ansible-side", "bench-pyinfra-side"):
            try:
                client.containers.get(name).remove(force=True)
            except Exception:
                pass
    table.print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
