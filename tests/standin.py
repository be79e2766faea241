"""Start this project's E2B-compatible stand-in server on a free loopback port, for the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import ROOT, free_port


@contextmanager
def standin(root: Path, key: str, *extra: str) -> Iterator[str]:
    """Yields the server's base URL; the server is stopped on exit."""
    port = free_port()
    env = {**os.environ, "AENV_API_KEY": key, "PYTHONPATH": str(ROOT)}
    log = open(root / f"standin-{port}.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sandbox_standin", "--port", str(port), "--root", str(root / f"sb-{port}"), *extra],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as answer:
                    if answer.status == 204:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the stand-in did not come up: {(root / f'standin-{port}.log').read_text()}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
