"""``python -m sandbox_standin``: the key (as AgentENV resolves it), loopback only, serve until SIGTERM."""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sandbox_standin.registry import Registry
from sandbox_standin.server import NOT_A_SANDBOX, StandinServer


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


API_KEY_CHARS = re.compile(r"[A-Za-z0-9._~-]{32,256}")


class BadKey(ValueError):
    """A key AgentENV would refuse at start (src/api_key.rs ApiKey::new)."""


def load_key(key_file: Path) -> str:
    """AENV_API_KEY if set, else the key file, else a new key written there (0600), as src/api_key.rs resolves it:
    the key must be 32-256 URL-safe characters, and a generated one is ``e2b_`` + 64 hex digits (32 random bytes).
    """
    key = os.environ.get("AENV_API_KEY", "").strip()
    if not key and key_file.is_file():
        key = key_file.read_text(encoding="utf-8").strip()
    if key:
        if not API_KEY_CHARS.fullmatch(key):
            raise BadKey("API key must contain between 32 and 256 URL-safe characters")
        return key
    key = "e2b_" + secrets.token_hex(32)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
    return key


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_standin",
        description="An E2B-compatible stand-in for the AgentENV API, for rehearsals and tests. NOT a sandbox: "
        "commands run on this host.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="a loopback address (others are refused)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--root", default=".sandbox-standin", help="scratch directories live here")
    parser.add_argument("--key-file", help="where the key is kept (default ROOT/secrets/api-key)")
    parser.add_argument(
        "--templates",
        default="",
        help="comma-separated template names that exist at start, as if made earlier with `aenv pull` "
        "(default: none, as a freshly started AgentENV)",
    )
    parser.add_argument("--v1-only", action="store_true", help="answer 405 on POST /v2/sandboxes (pre-PR #306)")
    parser.add_argument(
        "--ready-after",
        type=float,
        default=0.0,
        help="start listening only after this many seconds (AgentENV's first start fetches its runtime first)",
    )
    parser.add_argument(
        "--proxy-domains",
        default=os.environ.get("AENV_SANDBOX_PROXY_DOMAINS", ""),
        help="comma-separated domains: a request for {port}-{sandboxID}.{domain} goes to that port in that sandbox, "
        "and sandboxes report the first as their domain (as AgentENV's AENV_SANDBOX_PROXY_DOMAINS)",
    )
    parser.add_argument("--build-seconds", type=float, default=0.0, help="how long a template build takes")
    parser.add_argument("--verbose", action="store_true", help="log every request")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        parser.error(f"--host {args.host} is not a loopback address: this stand-in runs commands on this host")
    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    try:
        key = load_key(Path(args.key_file).resolve() if args.key_file else root / "secrets" / "api-key")
    except BadKey as exc:
        print(f"sandbox_standin: invalid AENV_API_KEY: {exc}", file=sys.stderr)
        return 1
    registry = Registry(
        root, {t.strip() for t in args.templates.split(",") if t.strip()}, build_seconds=args.build_seconds
    )
    if args.ready_after > 0:
        print(f"sandbox_standin: preparing; listening in {args.ready_after:g}s", file=sys.stderr, flush=True)
        time.sleep(args.ready_after)
    try:
        server = StandinServer(
            (args.host, args.port),
            registry,
            key,
            v1_only=args.v1_only,
            verbose=args.verbose,
            proxy_domains=args.proxy_domains.split(","),
        )
    except OSError as exc:
        print(f"sandbox_standin: cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    user = os.environ.get("USER") or str(os.getuid())
    print(NOT_A_SANDBOX.format(user=user, root=root), file=sys.stderr, flush=True)
    print(f"sandbox_standin: listening on http://{args.host}:{server.server_port}", file=sys.stderr, flush=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        for sandbox_id in list(registry.sandboxes):
            registry.kill(sandbox_id)
        server.server_close()
    return 0
