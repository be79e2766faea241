"""wait, capture and secret: readiness with the last answer, captured values, secrets kept 0600 and masked."""

from __future__ import annotations

import http.server
import json
import stat
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import BUSYBOX_IMAGE, Project, free_port


@pytest.fixture
def http_server() -> Iterator[tuple[int, dict[str, int]]]:
    """A local HTTP server whose /health status the test sets."""
    state = {"status": 503}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(state["status"])
            self.end_headers()
            self.wfile.write(b"warming up" if state["status"] != 204 else b"")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], state
    server.shutdown()


def test_wait_times_out_with_last_answer_then_passes_and_is_not_repeated(
    project: Project, http_server: tuple[int, dict[str, int]]
) -> None:
    port, state = http_server
    project.write(
        f"""
        steps:
          - name: health
            wait: {{http: "http://127.0.0.1:{port}/health", status: [204], timeout: 1, interval: 0.2}}
        """
    )
    result = project.run("apply")
    assert result.code == 1
    assert "not ready after 1s" in result.out and "last answer: HTTP 503: warming up" in result.out
    state["status"] = 204
    assert project.run("apply").code == 0
    state["status"] = 500  # a converged apply sends no request, so this does not matter
    assert "ok       health" in project.run("apply").out


def test_wait_tcp_refused(project: Project) -> None:
    port = free_port()
    project.write(f"steps:\n  - name: port\n    wait: {{tcp: '127.0.0.1:{port}', timeout: 0.5, interval: 0.1}}\n")
    result = project.run("apply")
    assert result.code == 1 and "no connection: Connection refused" in result.out


def test_secret_is_stable_kept_0600_masked_and_renewed_by_forget(project: Project) -> None:
    project.write(
        """
        steps:
          - name: key
            secret: {prefix: e2b_, bytes: 16}
          - name: use
            run: "echo key is {{ steps.key.value }}; echo {{ steps.key.value }} > key.txt"
        """
    )
    first = project.run("apply", "-v")
    assert first.code == 0, first.text
    value = (project.path / "key.txt").read_text().strip()
    assert value.startswith("e2b_") and len(value) == 4 + 32
    secrets_file = project.path / ".runner/secrets.json"
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert json.loads(secrets_file.read_text())["key"]["value"] == value
    state_text = (project.path / ".runner/state.json").read_text()
    logs = "".join(p.read_text() for p in (project.path / ".runner/logs").rglob("*.log"))
    for text in (first.out, first.err, state_text, logs):
        assert value not in text
    assert "key is ********" in first.out

    (project.path / "key.txt").unlink()
    project.run("forget", "use")
    assert project.run("apply").code == 0
    assert (project.path / "key.txt").read_text().strip() == value  # stable across applies

    assert project.run("forget", "key").code == 0
    assert project.run("apply").code == 0
    renewed = (project.path / "key.txt").read_text().strip()
    assert renewed != value and renewed.startswith("e2b_")


def test_capture_on_host_and_secret_capture(project: Project) -> None:
    (project.path / "api-key").write_text("e2b_0123456789abcdef0123456789abcdef\n")
    project.write(
        """
        steps:
          - name: version
            capture: {command: "echo '  v1.2.3  '"}
          - name: key
            capture: {command: [cat, api-key], secret: true}
          - name: use
            run: "echo {{ steps.version.value }}:{{ steps.key.value }} > out.txt; echo {{ steps.key.value }}"
        """
    )
    result = project.run("apply", "-v")
    assert result.code == 0, result.text
    assert (project.path / "out.txt").read_text().strip() == "v1.2.3:e2b_0123456789abcdef0123456789abcdef"
    everything = result.text + (project.path / ".runner/state.json").read_text()
    everything += "".join(p.read_text() for p in (project.path / ".runner/logs").rglob("*.log"))
    assert "0123456789abcdef0123456789abcdef" not in everything
    again = project.run("apply")
    assert again.code == 0 and again.out.count("ok ") == 3


def test_capture_failures(project: Project) -> None:
    project.write(
        """
        steps:
          - name: empty
            capture: {command: "true"}
        """
    )
    result = project.run("apply")
    assert result.code == 1 and "printed nothing" in result.out


def test_capture_inside_container(project: Project, docker_client: Any) -> None:
    name = f"rt-{uuid.uuid4().hex[:8]}"
    docker_client.test_names.append(name)
    project.write(
        f"""
        steps:
          - name: aenv
            docker:
              name: {name}
              image: {BUSYBOX_IMAGE}
              command: [sh, -c, "mkdir -p /tmp/s; cat /proc/sys/kernel/random/uuid > /tmp/s/api-key; exec sleep 600"]
          - name: key
            capture:
              container: "{{{{ steps.aenv.container_id }}}}"
              command: [cat, /tmp/s/api-key]
              secret: true
          - name: use
            run: "echo {{{{ steps.key.value }}}} > key.txt"
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    key = (project.path / "key.txt").read_text().strip()
    assert len(key) == 36  # a uuid made inside the container
    assert key not in (project.path / ".runner/state.json").read_text()
    assert key not in result.text
    missing = project.write(
        f"""
        steps:
          - name: key
            capture: {{container: {name}-nope, command: [cat, /x]}}
        """
    )
    assert missing.exists()
    failed = project.run("apply")
    assert failed.code == 1 and f"no container '{name}-nope'" in failed.out


def test_what_a_capture_read_is_shown_unless_secret(project: Project) -> None:
    """A choice made from a captured value (the flagship's SDK pin from aenv_api) is visible in the output."""
    project.write(
        """
        steps:
          - name: api
            capture: {command: "echo v1"}
          - name: token
            capture: {command: "echo s3cr3t-t0ken-value", secret: true}
          - name: pin
            run: {command: "echo {{ 'old' if steps.api.value == 'v1' else 'new' }}"}
        """
    )
    result = project.run("apply")
    assert result.code == 0, result.text
    line = next(x for x in result.out.splitlines() if x.split()[:2] == ["changed", "api"])
    assert line.endswith("= v1"), line
    assert "s3cr3t" not in result.text
    token_line = next(x for x in result.out.splitlines() if x.split()[:2] == ["changed", "token"])
    assert "=" not in token_line
    events = [json.loads(x) for x in project.run("apply", "--force", "api", "--json").out.splitlines()]
    finished = next(e for e in events if e["event"] == "step_finished" and e["step"] == "api")
    assert finished["note"] == "= v1" and finished["reason"] != "= v1"
