"""Look-alike of tbench2_env/server/app.py: the environment over HTTP and WebSocket, as OpenEnv's create_app
serves it: `GET /health` (200, {"status": "healthy"}) and `/ws`, where each message is JSON with a `type` —
`reset` (data: reset's keywords), `step` (data: the action), `state`, `close` — answered with `observation`
(data: {observation, reward, done}), `state` or `error` (data: {message, code}). Upstream serves it with
uvicorn and FastAPI; this one with the standard library, so it runs on a bare interpreter in a sandbox.

    python -m tbench2_env.server.app --host 0.0.0.0 --port 8000
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tbench2_env.models import Tbench2Action
from tbench2_env.server import websocket as ws
from tbench2_env.server.tbench2_env_environment import Tbench2Environment


def answer(env: Tbench2Environment, message: dict[str, Any]) -> dict[str, Any] | None:
    kind, data = message.get("type"), message.get("data") or {}
    try:
        if kind == "reset":
            observation = env.reset(**data)
        elif kind == "step":
            fields = {k: v for k, v in data.items() if k in Tbench2Action.__dataclass_fields__}
            observation = env.step(Tbench2Action(**fields))
        elif kind == "state":
            return {"type": "state", "data": asdict(env.state())}
        elif kind == "close":
            return None
        else:
            return {"type": "error", "data": {"message": f"Unknown message type: {kind}", "code": "UNKNOWN_TYPE"}}
    except Exception as exc:  # noqa: BLE001 - the error goes back to the client, as upstream's handler sends it
        return {"type": "error", "data": {"message": str(exc), "code": "EXECUTION_ERROR"}}
    body = asdict(observation)
    reward, done = body.pop("reward"), body.pop("done")
    return {"type": "observation", "data": {"observation": body, "reward": reward, "done": done}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.path == "/health":
            body = json.dumps({"status": "healthy"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket()
        else:
            self.send_error(404)

    def _websocket(self) -> None:
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", ws.accept_key(self.headers.get("Sec-WebSocket-Key", "")))
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        env = Tbench2Environment()  # one environment per connection, as upstream's sessions

        def read(n: int) -> bytes:
            return self.rfile.read(n)

        while True:
            opcode, payload = ws.read_frame(read)
            if opcode == ws.CLOSE:
                self.wfile.write(ws.frame(ws.CLOSE, payload[:2], mask=False))
                return
            if opcode == ws.PING:
                self.wfile.write(ws.frame(ws.PONG, payload, mask=False))
                continue
            if opcode != ws.TEXT:
                continue
            try:
                message = json.loads(payload)
            except ValueError:
                message = {"type": None}
            reply = answer(env, message) if isinstance(message, dict) else None
            if reply is None:
                self.wfile.write(ws.frame(ws.CLOSE, b"\x03\xe8", mask=False))
                return
            self.wfile.write(ws.frame(ws.TEXT, json.dumps(reply).encode(), mask=False))
            self.wfile.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description="the tbench2 env server (look-alike)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
