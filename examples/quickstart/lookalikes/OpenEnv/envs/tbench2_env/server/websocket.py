"""RFC 6455 in a few lines, for the look-alike's env server and client: the opening handshake's accept key and
text frames (a client masks what it sends; a server does not). Upstream runs FastAPI's WebSocket on the server
and the `websockets` package in the client; neither is on the bare interpreter a sandbox has here.
"""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from collections.abc import Callable

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, CLOSE, PING, PONG = 0x1, 0x8, 0x9, 0xA


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def new_key() -> str:
    return base64.b64encode(os.urandom(16)).decode()


def frame(opcode: int, payload: bytes, mask: bool) -> bytes:
    head = bytes([0x80 | opcode])
    size = len(payload)
    bit = 0x80 if mask else 0
    if size < 126:
        head += bytes([bit | size])
    elif size < 1 << 16:
        head += bytes([bit | 126]) + struct.pack(">H", size)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", size)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_frame(read: Callable[[int], bytes]) -> tuple[int, bytes]:
    """(opcode, payload) of the next whole message (continuation frames joined); CLOSE with b"" at end of file."""
    opcode, message = 0, b""
    while True:
        head = read(2)
        if len(head) < 2:
            return CLOSE, b""
        final, kind = head[0] & 0x80, head[0] & 0x0F
        size = head[1] & 0x7F
        if size == 126:
            size = struct.unpack(">H", read(2))[0]
        elif size == 127:
            size = struct.unpack(">Q", read(8))[0]
        key = read(4) if head[1] & 0x80 else b""
        payload = read(size)
        if key:
            payload = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
        if kind in (CLOSE, PING, PONG):
            return kind, payload
        opcode = opcode or kind
        message += payload
        if final:
            return opcode, message
