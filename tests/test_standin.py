"""The stand-in answers as AgentENV does, path by path (each behaviour is cited in docs/upstream.md).

Raw HTTP, no SDK: these pin the server's answers themselves, so that a test passing through the e2b SDK
against the stand-in says something about a real AgentENV.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from standin import standin

KEY = "e2b_" + "a1b2c3" * 7


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def call(
    url: str, method: str, path: str, body: Any = None, key: str | None = KEY, headers: dict[str, str] | None = None
) -> Answer:
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=10)
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent["X-API-Key"] = key
    payload = json.dumps(body).encode() if body is not None else None
    connection.request(method, path, body=payload, headers=sent)
    response = connection.getresponse()
    answer = Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    connection.close()
    return answer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standin(tmp_path_factory.mktemp("standin"), KEY) as url:
        yield url


@pytest.fixture(scope="module")
def old_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standin(tmp_path_factory.mktemp("standin-v1"), KEY, "--v1-only") as url:
        yield url


def build(url: str, name: str, image: str = "ubuntu:22.04") -> str:
    """What `aenv pull IMAGE --name NAME` does (crates/aenv/src/commands/pull.rs): request, start, poll."""
    requested = call(url, "POST", "/v3/templates", {"name": name})
    assert requested.status == 202, requested.body
    ident = requested.json()["templateID"]
    assert requested.json()["buildID"] == ident  # AgentENV compatibility mode: one id for both
    started = call(url, "POST", f"/v2/templates/{ident}/builds/{ident}", {"fromImage": image})
    assert started.status == 202, started.body
    for _ in range(100):
        status = call(url, "GET", f"/templates/{ident}/builds/{ident}/status").json()["status"]
        if status == "ready":
            return ident
        time.sleep(0.05)
    raise AssertionError(f"the build of {name} did not finish")


def test_health_is_204_without_a_key(server: str) -> None:
    answer = call(server, "GET", "/health", key=None)
    assert answer.status == 204 and answer.body == b""


@pytest.mark.parametrize(
    "headers",
    [{}, {"X-API-Key": "e2b_wrong"}],
    ids=["no-key", "wrong-key"],
)
def test_every_other_path_needs_the_key_and_a_401_has_an_empty_body(server: str, headers: dict[str, str]) -> None:
    # auth.rs checks the key before routing: an unknown path without a key is a 401 too, not a 404
    for method, path in [("GET", "/sandboxes"), ("POST", "/v2/sandboxes"), ("GET", "/no/such/route")]:
        answer = call(server, method, path, {} if method == "POST" else None, key=None, headers=headers)
        assert answer.status == 401 and answer.body == b"", (method, path, answer.status)


def test_a_doubled_key_header_is_refused(server: str) -> None:
    # single_header(): exactly one X-API-Key; http.client sends both values when given a list via putheader
    where = urlsplit(server)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=10)
    connection.putrequest("GET", "/sandboxes")
    connection.putheader("X-API-Key", KEY)
    connection.putheader("X-API-Key", KEY)
    connection.endheaders()
    assert connection.getresponse().status == 401
    connection.close()


def test_a_fresh_server_has_no_templates_and_refuses_an_unknown_one(server: str) -> None:
    assert call(server, "GET", "/templates").json() == []
    missing = call(server, "POST", "/v2/sandboxes", {"templateID": "base"})
    assert missing.status == 400 and missing.json()["message"] == "template base not found"
    alias = call(server, "GET", "/templates/aliases/base")
    assert alias.status == 404 and alias.json()["message"] == "template alias not found: base"


def test_an_unknown_route_is_a_404_naming_it(server: str) -> None:
    answer = call(server, "GET", "/v9/nothing")
    assert answer.status == 404 and answer.json()["message"] == "route not found: GET /v9/nothing"


def test_a_template_is_made_as_aenv_pull_makes_it_then_sandboxes_start_from_it(server: str) -> None:
    assert call(server, "POST", "/v3/templates", {}).json()["message"] == "template name must be provided"
    bad = call(server, "POST", "/v3/templates", {"name": "no.dots"})
    assert bad.status == 400 and "ASCII letters, digits, hyphens, and underscores" in bad.json()["message"]

    requested = call(server, "POST", "/v3/templates", {"name": "pulled"}).json()
    ident = requested["templateID"]
    # until its build is ready, the name does not resolve
    assert call(server, "GET", "/templates/aliases/pulled").status == 404
    mismatch = call(server, "POST", f"/v2/templates/{ident}/builds/other", {"fromImage": "ubuntu:22.04"})
    assert mismatch.status == 400
    assert mismatch.json()["message"] == "templateID and buildID must match in AgentENV compatibility mode"
    assert call(server, "GET", f"/templates/{ident}/builds/other/status").status == 404

    build(server, "made", "ubuntu:22.04")
    alias = call(server, "GET", "/templates/aliases/made")
    assert alias.status == 200 and alias.json()["templateID"]
    assert "made" in [t["aliases"][0] for t in call(server, "GET", "/templates").json()]

    created = call(server, "POST", "/v2/sandboxes", {"templateID": "made", "timeout": 60})
    assert created.status == 201, created.body
    sandbox_id = created.json()["sandboxID"]
    assert "envdAccessToken" not in created.json()  # no `secure` asked for (e2b >= 2.51 sends none)
    listed = [box["sandboxID"] for box in call(server, "GET", "/v2/sandboxes").json()]
    assert sandbox_id in listed
    assert call(server, "DELETE", f"/sandboxes/{sandbox_id}").status == 204
    gone = call(server, "DELETE", f"/sandboxes/{sandbox_id}")
    assert gone.status == 404 and gone.json()["message"] == f"sandbox {sandbox_id} not found"


def test_set_timeout_and_refreshes_move_the_end_as_agentenv_does(server: str) -> None:
    """POST /sandboxes/{id}/timeout sets the end from now, shorter too; /refreshes only ever extends it, by at
    most 3600 s; both 204, an unknown sandbox 404 (sandbox.rs:1186-1309, openapi.yml:633-651); and the e2b SDK's
    own set_timeout (Miles' keepalive) goes through."""
    from datetime import datetime

    build(server, "kept", "ubuntu:22.04")
    sandbox_id = call(server, "POST", "/sandboxes", {"templateID": "kept", "timeout": 60}).json()["sandboxID"]

    def left() -> float:
        end = call(server, "GET", f"/sandboxes/{sandbox_id}").json()["endAt"]
        return datetime.fromisoformat(end.replace("Z", "+00:00")).timestamp() - time.time()

    assert 55 < left() <= 60
    assert call(server, "POST", f"/sandboxes/{sandbox_id}/timeout", {"timeout": 20}).status == 204
    assert 15 < left() <= 20  # shorter: set_timeout overwrites
    assert call(server, "POST", f"/sandboxes/{sandbox_id}/refreshes", {"duration": 5}).status == 204
    assert 15 < left() <= 20  # a refresh never shortens
    assert call(server, "POST", f"/sandboxes/{sandbox_id}/refreshes", {"duration": 120}).status == 204
    assert 115 < left() <= 120
    for path, body in (("timeout", {}), ("timeout", {"timeout": -1}), ("refreshes", {"duration": 3601})):
        refused = call(server, "POST", f"/sandboxes/{sandbox_id}/{path}", body)
        assert refused.status == 400, (path, body, refused.body)
    assert 115 < left() <= 120  # nothing refused moved it
    unknown = call(server, "POST", "/sandboxes/00000000-0000-4000-8000-000000000000/timeout", {"timeout": 5})
    assert unknown.status == 404 and "not found" in unknown.json()["message"]

    import e2b

    where = urlsplit(server)
    config = {"api_key": KEY, "api_url": server, "domain": f"{where.hostname}:{where.port}"}
    e2b.Sandbox.set_timeout(sandbox_id, 30, **config)  # type: ignore[call-arg]
    assert 25 < left() <= 30
    assert call(server, "DELETE", f"/sandboxes/{sandbox_id}").status == 204


def _wait_built(url: str, ident: str) -> dict[str, Any]:
    for _ in range(200):
        status = call(url, "GET", f"/templates/{ident}/builds/{ident}/status").json()
        if status["status"] in ("ready", "error"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"the build of {ident} did not end")


def _output_of(url: str, sandbox_id: str, script: str) -> str:
    """A command run in the sandbox through envd, without a cwd (its template's WORKDIR); its stdout."""
    import base64

    connection, stream = _start_in(url, sandbox_id, ["/bin/sh", "-c", script])
    data = stream.read()
    connection.close()
    out, at = b"", 0
    while at + 5 <= len(data):
        length = int.from_bytes(data[at + 1 : at + 5], "big")
        event = json.loads(data[at + 5 : at + 5 + length] or b"{}").get("event", {})
        out += base64.b64decode(event.get("data", {}).get("stdout", ""))
        at += 5 + length
    return out.decode()


def test_build_steps_run_in_the_templates_root_and_its_sandboxes_start_from_it(server: str) -> None:
    requested = call(server, "POST", "/v3/templates", {"name": "layered", "cpuCount": 4, "memoryMB": 2048})
    ident = requested.json()["templateID"]
    steps = [
        {"type": "ENV", "args": ["GREETING", "hello", "OTHER", "x"]},
        {"type": "WORKDIR", "args": ["/app"]},
        {"type": "RUN", "args": ["echo $GREETING > made.txt && pwd > where.txt"]},
        {"type": "USER", "args": ["root"]},
        {"type": "WORKDIR", "args": ["sub/../sub"]},
        {"type": "RUN", "args": ["touch here"]},
    ]
    started = call(
        server, "POST", f"/v2/templates/{ident}/builds/{ident}", {"fromImage": "ubuntu:22.04", "steps": steps}
    )
    assert started.status == 202, started.body
    assert _wait_built(server, ident)["status"] == "ready"
    box = call(server, "POST", "/sandboxes", {"templateID": "layered", "envVars": {"OTHER": "mine"}}).json()
    try:
        said = _output_of(server, box["sandboxID"], "cat ../made.txt; ls; echo $GREETING $OTHER; cat ../where.txt")
        lines = said.splitlines()
        assert lines[:3] == ["hello", "here", "hello mine"], said  # files, WORKDIR /app/sub, ENV (envVars win)
        assert lines[3].endswith(f"/templates/{ident}/app")  # the RUN ran in the template's own root
        described = call(server, "GET", f"/sandboxes/{box['sandboxID']}").json()
        assert (described["cpuCount"], described["memoryMB"]) == (4, 2048)  # what it was built with
    finally:
        call(server, "DELETE", f"/sandboxes/{box['sandboxID']}")

    # a template from that one starts from its root and its context
    child = call(server, "POST", "/v3/templates", {"name": "layered-child"}).json()["templateID"]
    body = {
        "fromTemplate": "layered",
        "steps": [{"type": "RUN", "args": ["test -f here && echo $GREETING > child.txt"]}],
    }
    assert call(server, "POST", f"/v2/templates/{child}/builds/{child}", body).status == 202
    assert _wait_built(server, child)["status"] == "ready"
    box = call(server, "POST", "/sandboxes", {"templateID": "layered-child"}).json()
    assert _output_of(server, box["sandboxID"], "cat child.txt").strip() == "hello"
    assert call(server, "DELETE", f"/sandboxes/{box['sandboxID']}").status == 204


def test_a_failing_build_step_is_the_builds_error_with_the_step(server: str) -> None:
    ident = call(server, "POST", "/v3/templates", {"name": "broken-layer"}).json()["templateID"]
    steps = [{"type": "RUN", "args": ["echo out; echo boom >&2; exit 3"]}, {"type": "RUN", "args": ["touch never"]}]
    call(server, "POST", f"/v2/templates/{ident}/builds/{ident}", {"fromImage": "ubuntu:22.04", "steps": steps})
    status = _wait_built(server, ident)
    assert status["status"] == "error"
    assert status["reason"] == {
        "message": "build step failed: command exited with status 3; stderr: boom",
        "step": "RUN echo out; echo boom >&2; exit 3",
    }
    assert call(server, "POST", "/v2/sandboxes", {"templateID": "broken-layer"}).status == 400


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"steps": [{"type": "COPY", "args": ["a", "b"]}]}, "COPY template steps are not supported yet"),
        ({"steps": [{"type": "RUN", "args": []}]}, "RUN template step requires a command argument"),
        ({"steps": [{"type": "ENV", "args": ["K"]}]}, "ENV template step requires key/value arguments"),
        ({"steps": [{"type": "RUN", "args": ["x"], "filesHash": "abc"}]}, "filesHash/COPY support is not implemented"),
        ({"steps": [{"type": "HEALTHCHECK", "args": ["x"]}]}, "template step type HEALTHCHECK is not supported"),
        ({"fromImage": "ubuntu", "fromTemplate": "layered"}, "cannot specify both fromImage and fromTemplate"),
    ],
)
def test_a_build_agentenv_refuses_is_a_400_before_it_starts(server: str, body: dict[str, Any], message: str) -> None:
    ident = call(server, "POST", "/v3/templates", {"name": "refused"}).json()["templateID"]
    refused = call(server, "POST", f"/v2/templates/{ident}/builds/{ident}", body)
    assert refused.status == 400 and message in refused.json()["message"], refused.body


def test_template_resources_and_names_are_checked_as_agentenv_checks_them(server: str) -> None:
    zero = call(server, "POST", "/v3/templates", {"name": "tiny", "memoryMB": 0})
    assert zero.status == 400 and zero.json()["message"] == "cpuCount and memoryMB must be greater than 0"
    tagged = call(server, "POST", "/v3/templates", {"name": "tpl:v1"})
    assert tagged.status == 400 and tagged.json()["message"] == "template name tags are not supported yet"
    tags = call(server, "POST", "/v3/templates", {"name": "tpl", "tags": ["v1"]})
    assert tags.status == 400 and tags.json()["message"] == "template tags are not supported yet"


def test_before_pr_306_v2_sandboxes_is_get_only(old_server: str) -> None:
    build(old_server, "old")
    post = call(old_server, "POST", "/v2/sandboxes", {"templateID": "old"})
    assert post.status == 405 and post.body == b"" and "GET" in post.headers["allow"]
    assert call(old_server, "GET", "/v2/sandboxes").status == 200
    assert call(old_server, "POST", "/sandboxes", {"templateID": "old"}).status == 201


def test_the_data_plane_routes_by_header_and_a_secure_sandbox_needs_its_token(server: str, tmp_path: Path) -> None:
    build(server, "secure-box")
    created = call(server, "POST", "/sandboxes", {"templateID": "secure-box", "secure": True}).json()
    sandbox_id, token = created["sandboxID"], created["envdAccessToken"]
    route = {"E2b-Sandbox-Id": sandbox_id}
    # a route that does not parse passes auth only with the API key, then gets the proxy's 400 (auth.rs, proxy.rs)
    assert call(server, "POST", "/process.Process/Start", {}, key=None, headers=route).status == 401
    no_port = call(server, "POST", "/process.Process/Start", {}, headers=route)
    assert no_port.status == 400 and no_port.json()["message"] == "missing target port routing header"
    bad_id = call(server, "POST", "/process.Process/Start", {}, headers={"E2b-Sandbox-Id": "nope"})
    assert bad_id.status == 400 and bad_id.json()["message"] == "invalid sandbox routing header"
    routed = {**route, "E2b-Sandbox-Port": "49983"}
    assert call(server, "POST", "/process.Process/Start", {}, key=None, headers=routed).status == 401  # no token
    unknown = {"E2b-Sandbox-Id": "00000000-0000-4000-8000-000000000000", "E2b-Sandbox-Port": "49983"}
    missing = call(server, "POST", "/process.Process/Start", {}, key=None, headers=unknown)
    assert missing.status == 404 and missing.json()["message"] == "sandbox not found"

    # with the token, the Connect stream runs the command
    request = json.dumps({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi"]}}).encode()
    envelope = b"\x00" + len(request).to_bytes(4, "big") + request
    where = urlsplit(server)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=10)
    connection.request(
        "POST",
        "/process.Process/Start",
        body=envelope,
        headers={**routed, "X-Access-Token": token, "Content-Type": "application/connect+json"},
    )
    response = connection.getresponse()
    data = response.read()
    connection.close()
    assert response.status == 200 and b"aGkK" in data  # "hi\n", base64 in a data event
    assert call(server, "DELETE", f"/sandboxes/{sandbox_id}").status == 204


def test_a_key_agentenv_would_refuse_stops_the_server_at_start(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "AENV_API_KEY": "e2b_short", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "sandbox_standin", "--port", "0", "--root", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "API key must contain between 32 and 256 URL-safe characters" in result.stderr
    # with no key given, one is generated as AgentENV generates it: e2b_ and 64 hex digits, in a 0600 file
    from sandbox_standin.cli import load_key

    generated = load_key(tmp_path / "secrets" / "api-key")
    assert generated.startswith("e2b_") and len(generated) == 4 + 64
    assert oct((tmp_path / "secrets" / "api-key").stat().st_mode & 0o777) == "0o600"


ECHO_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Echo(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_POST = do_GET
    def log_message(self, *args):
        pass

HTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"""


@pytest.fixture(scope="module")
def domain_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with standin(tmp_path_factory.mktemp("standin-domain"), KEY, "--proxy-domains", "Sandbox.Test") as url:
        yield url


def _start_in(url: str, sandbox_id: str, argv: list[str]) -> tuple[http.client.HTTPConnection, Any]:
    """A command started in the sandbox through envd, its stream left open as the SDK's background=True does."""
    request = json.dumps({"process": {"cmd": argv[0], "args": argv[1:]}}).encode()
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=30)
    routed = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": "49983", "Content-Type": "application/connect+json"}
    connection.request("POST", "/process.Process/Start", b"\x00" + len(request).to_bytes(4, "big") + request, routed)
    return connection, connection.getresponse()


def test_a_host_under_the_proxy_domain_reaches_that_port_in_that_sandbox(domain_server: str, tmp_path: Path) -> None:
    from conftest import free_port

    build(domain_server, "proxied-box")
    created = call(domain_server, "POST", "/sandboxes", {"templateID": "proxied-box"})
    assert created.status == 201
    sandbox_id = created.json()["sandboxID"]
    assert created.json()["domain"] == "sandbox.test" and created.json()["trafficAccessToken"] is None
    assert call(domain_server, "GET", f"/sandboxes/{sandbox_id}").json()["domain"] == "sandbox.test"
    port = free_port()
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    connection, stream = _start_in(domain_server, sandbox_id, [sys.executable, str(tmp_path / "echo.py"), str(port)])
    try:
        host = f"{port}-{sandbox_id}.sandbox.test"
        deadline = time.monotonic() + 20
        while call(domain_server, "GET", "/x", key=None, headers={"Host": host}).status == 502:
            assert time.monotonic() < deadline, "the server in the sandbox did not come up"
            time.sleep(0.1)
        # by Host, no API key needed (public traffic); the hop's own headers stay behind, x-forwarded-* are added
        answer = call(domain_server, "GET", "/health?q=1", key=KEY, headers={"Host": host.upper() + ":80"})
        assert answer.status == 200, answer.body  # /health under a proxy host is the sandbox's, not the server's
        seen = answer.json()
        assert seen["path"] == "/health?q=1" and seen["headers"]["host"] == f"127.0.0.1:{port}"
        assert seen["headers"]["x-forwarded-host"] == host.upper() + ":80"
        assert seen["headers"]["x-forwarded-uri"] == "/health?q=1" and seen["headers"]["x-forwarded-method"] == "GET"
        assert "x-api-key" not in seen["headers"]
        # as a forward proxy (absolute form), which is how a client without DNS for the domain reaches it
        absolute = call(domain_server, "GET", f"http://{host}/via-proxy", key=None, headers={"Host": host})
        assert absolute.status == 200 and absolute.json()["path"] == "/via-proxy"
        # the /proxy prefix with the routing headers, prefix stripped
        routed = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
        prefixed = call(domain_server, "GET", "/proxy/under", key=None, headers=routed)
        assert prefixed.status == 200 and prefixed.json()["path"] == "/under"

        # a port nothing in the sandbox listens on (here: the stand-in's own) is a 502, never another listener
        own = urlsplit(domain_server).port
        assert (
            call(domain_server, "GET", "/", key=None, headers={"Host": f"{own}-{sandbox_id}.sandbox.test"}).status
            == 502
        )
        # a host under the domain that does not parse: 401 without the key, its 400 with it (auth.rs, proxy.rs)
        bad = {"Host": f"0-{sandbox_id}.sandbox.test"}
        assert call(domain_server, "GET", "/", key=None, headers=bad).status == 401
        refused = call(domain_server, "GET", "/", headers=bad)
        assert refused.status == 400 and refused.json()["message"] == "invalid sandbox data-plane host: port is invalid"
        nobody = {"Host": f"{port}-00000000-0000-4000-8000-000000000000.sandbox.test"}
        assert call(domain_server, "GET", "/", key=None, headers=nobody).json()["message"] == "sandbox not found"
        # the bare domain, or another host, is the control plane
        assert call(domain_server, "GET", "/sandboxes", headers={"Host": "sandbox.test"}).status == 200
        assert call(domain_server, "GET", "/health", key=None, headers={"Host": "sandbox.test"}).status == 204
    finally:
        assert call(domain_server, "DELETE", f"/sandboxes/{sandbox_id}").status == 204
        connection.close()
    assert (
        call(domain_server, "GET", "/", key=None, headers={"Host": f"{port}-{sandbox_id}.sandbox.test"}).status == 404
    )


def test_without_proxy_domains_a_sandbox_has_no_domain_and_hosts_are_not_routed(server: str) -> None:
    build(server, "plain-box")
    created = call(server, "POST", "/sandboxes", {"templateID": "plain-box"}).json()
    assert created["domain"] is None
    assert (
        call(server, "GET", "/health", key=None, headers={"Host": f"8000-{created['sandboxID']}.e2b.app"}).status == 204
    )
    refused = call(server, "POST", "/sandboxes", {"templateID": "plain-box", "network": {"allowPublicTraffic": False}})
    assert refused.status == 400 and "allowPublicTraffic" in refused.json()["message"]
    assert call(server, "DELETE", f"/sandboxes/{created['sandboxID']}").status == 204


WS_ECHO_SERVER = """
import base64, hashlib, socket, sys

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
listener = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    conn, _ = listener.accept()
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += conn.recv(4096)
    head, _, rest = data.partition(b"\\r\\n\\r\\n")
    lines = head.decode().split("\\r\\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if headers.get("upgrade", "").lower() != "websocket":
        conn.sendall(b"HTTP/1.1 426 Upgrade Required\\r\\nContent-Length: 0\\r\\n\\r\\n")
        conn.close()
        continue
    accept = base64.b64encode(hashlib.sha1((headers["sec-websocket-key"] + GUID).encode()).digest()).decode()
    proto = headers.get("x-forwarded-proto")
    conn.sendall(f"HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
                 f"Sec-WebSocket-Accept: {accept}\\r\\nX-Seen-Proto: {proto}\\r\\n\\r\\n".encode())
    while len(rest) < 6:
        rest += conn.recv(4096)
    length = rest[1] & 0x7F
    while len(rest) < 6 + length:
        rest += conn.recv(4096)
    mask, payload = rest[2:6], rest[6:6 + length]
    text = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    reply = b"echo:" + text
    conn.sendall(bytes([0x81, len(reply)]) + reply)
    conn.close()
"""


def test_a_websocket_to_a_port_in_the_sandbox_goes_through_the_proxy(domain_server: str, tmp_path: Path) -> None:
    """OpenEnv's client runs an episode over /ws through the same {port}-{id}.{domain} gateway (Miles'
    tb2_sandbox_e2b.py base_url; AgentENV proxy.rs proxy_websocket_request)."""
    import base64
    import hashlib
    import socket

    from conftest import free_port

    build(domain_server, "ws-box")
    sandbox_id = call(domain_server, "POST", "/sandboxes", {"templateID": "ws-box"}).json()["sandboxID"]
    port = free_port()
    (tmp_path / "ws.py").write_text(WS_ECHO_SERVER)
    connection, _ = _start_in(domain_server, sandbox_id, [sys.executable, str(tmp_path / "ws.py"), str(port)])
    host = f"{port}-{sandbox_id}.sandbox.test"
    where = urlsplit(domain_server)
    try:
        deadline = time.monotonic() + 20
        while call(domain_server, "GET", "/x", key=None, headers={"Host": host}).status == 502:
            assert time.monotonic() < deadline, "the server in the sandbox did not come up"
            time.sleep(0.1)
        assert call(domain_server, "GET", "/x", key=None, headers={"Host": host}).status == 426  # plain HTTP
        key = base64.b64encode(b"runner-ws-test-k").decode()
        frame_text = b"hello"
        mask = b"\x01\x02\x03\x04"
        frame = bytes([0x81, 0x80 | len(frame_text)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(frame_text))
        with socket.create_connection((where.hostname, where.port), timeout=10) as sock:
            request = (
                f"GET /ws HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            sock.sendall(request.encode() + frame)  # the first frame right behind the handshake
            data = b""
            while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < 2 + len(b"echo:hello"):
                chunk = sock.recv(4096)
                assert chunk, data
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        expected = base64.b64encode(hashlib.sha1((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest())
        assert b"Sec-WebSocket-Accept: " + expected in head and b"X-Seen-Proto: ws" in head
        assert rest[:2] == bytes([0x81, len(b"echo:hello")]) and rest[2:] == b"echo:hello"
    finally:
        assert call(domain_server, "DELETE", f"/sandboxes/{sandbox_id}").status == 204
        connection.close()
