"""Look-alike of tbench2_env/client.py: Tbench2Env, OpenEnv's EnvClient for this environment.

As upstream's EnvClient: `base_url` (http:// or ws://) becomes `<ws url>/ws`; `async with Tbench2Env(base_url=...,
message_timeout_s=...) as env`, then `await env.reset(task_id=...)`, `await env.step(Tbench2Action(...))` (a
StepResult: observation, reward, done), `await env.state()`; a reply of type `error` raises RuntimeError
"Server error: <message> (code: <code>)"; `.sync()` gives the same calls without await.

The connection honours HTTP_PROXY / NO_PROXY as the rollout's other clients do: through a proxy it sends its
opening handshake in absolute form (`GET http://host/ws`), the way a plain HTTP request goes to a proxy, so the
proxy routes it by its Host. Upstream's client (the `websockets` package) asks a proxy to CONNECT instead.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

from tbench2_env.models import Tbench2Action, Tbench2Observation, Tbench2State
from tbench2_env.server import websocket as ws


@dataclass
class StepResult:
    observation: Tbench2Observation
    reward: float | None = None
    done: bool = False


class Tbench2Env:
    def __init__(self, base_url: str, connect_timeout_s: float = 10.0, message_timeout_s: float = 60.0) -> None:
        url = base_url.rstrip("/")
        url = "ws://" + url.removeprefix("http://") if url.startswith("http://") else url
        url = "wss://" + url.removeprefix("https://") if url.startswith("https://") else url
        self._ws_url = f"{url}/ws"
        self._connect_timeout = connect_timeout_s
        self._message_timeout = message_timeout_s
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def connect(self) -> Tbench2Env:
        if self._writer is not None:
            return self
        parts = urllib.parse.urlsplit(self._ws_url)
        if parts.scheme != "ws":
            raise ConnectionError(f"Failed to connect to {self._ws_url}: only ws:// (plain HTTP) here")
        host, port = parts.hostname or "", parts.port or 80
        http_url = f"http://{parts.netloc}{parts.path}"
        proxy = urllib.request.getproxies().get("http")
        via = urllib.parse.urlsplit(proxy) if proxy and not urllib.request.proxy_bypass(host) else None
        target = http_url if via else parts.path
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(via.hostname if via else host, (via.port or 80) if via else port),
                self._connect_timeout,
            )
            key = ws.new_key()
            self._writer.write(
                f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), self._connect_timeout)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            await self.disconnect()
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc!r}") from exc
        lines = head.decode("latin-1").split("\r\n")
        accept = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if lines[0].split(" ")[1:2] != ["101"] or accept.get("sec-websocket-accept") != ws.accept_key(key):
            await self.disconnect()
            raise ConnectionError(f"Failed to connect to {self._ws_url}: {lines[0]}")
        return self

    async def disconnect(self) -> None:
        if self._writer is not None:
            try:
                self._writer.write(ws.frame(ws.TEXT, json.dumps({"type": "close"}).encode(), mask=True))
                self._writer.write(ws.frame(ws.CLOSE, b"\x03\xe8", mask=True))
                await self._writer.drain()
                self._writer.close()
            except OSError:
                pass
        self._reader = self._writer = None

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.connect()
        assert self._reader is not None and self._writer is not None
        self._writer.write(ws.frame(ws.TEXT, json.dumps(message).encode(), mask=True))
        await self._writer.drain()
        opcode, payload = await asyncio.wait_for(_read_frame(self._reader.readexactly), self._message_timeout)
        if opcode != ws.TEXT:
            raise ConnectionError(f"{self._ws_url}: the server closed the connection")
        response = json.loads(payload)
        if response.get("type") == "error":
            data = response.get("data", {})
            raise RuntimeError(
                f"Server error: {data.get('message', 'Unknown error')} (code: {data.get('code', 'UNKNOWN')})"
            )
        return response

    async def reset(self, **kwargs: Any) -> StepResult:
        return self._parse_result((await self._send_and_receive({"type": "reset", "data": kwargs})).get("data", {}))

    async def step(self, action: Tbench2Action, **_: Any) -> StepResult:
        message = {"type": "step", "data": asdict(action)}
        return self._parse_result((await self._send_and_receive(message)).get("data", {}))

    async def state(self) -> Tbench2State:
        data = (await self._send_and_receive({"type": "state"})).get("data", {})
        return Tbench2State(**{k: v for k, v in data.items() if k in Tbench2State.__dataclass_fields__})

    async def close(self) -> None:
        await self.disconnect()

    async def __aenter__(self) -> Tbench2Env:
        return await self.connect()

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @staticmethod
    def _parse_result(payload: dict[str, Any]) -> StepResult:
        fields = Tbench2Observation.__dataclass_fields__
        observation = Tbench2Observation(**{k: v for k, v in payload.get("observation", {}).items() if k in fields})
        observation.reward, observation.done = payload.get("reward"), payload.get("done", False)
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def sync(self) -> SyncTbench2Env:
        return SyncTbench2Env(self)


async def _read_frame(read: Any) -> tuple[int, bytes]:
    """ws.read_frame over an asyncio reader: one frame's bytes read first (the server never fragments)."""
    head = await read(2)
    size = head[1] & 0x7F
    extra = await read(2 if size == 126 else 8) if size in (126, 127) else b""
    length = int.from_bytes(extra, "big") if extra else size
    rest = await read((4 if head[1] & 0x80 else 0) + length)
    data = head + extra + rest
    at = 0

    def take(n: int) -> bytes:
        nonlocal at
        at += n
        return data[at - n : at]

    return ws.read_frame(take)


class SyncTbench2Env:
    """`.sync()`: the same client, each call run to its end on a loop of its own."""

    def __init__(self, client: Tbench2Env) -> None:
        self._client = client
        self._loop = asyncio.new_event_loop()

    def __enter__(self) -> SyncTbench2Env:
        self._loop.run_until_complete(self._client.connect())
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def reset(self, **kwargs: Any) -> StepResult:
        return self._loop.run_until_complete(self._client.reset(**kwargs))

    def step(self, action: Tbench2Action) -> StepResult:
        return self._loop.run_until_complete(self._client.step(action))

    def state(self) -> Tbench2State:
        return self._loop.run_until_complete(self._client.state())

    def close(self) -> None:
        self._loop.run_until_complete(self._client.close())
        self._loop.close()
