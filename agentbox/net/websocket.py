"""A WebSocket through the broker (Codex streams its answers over one): relayed frame by frame, both ways checked.

The upgrade request asked for no extension (the broker drops `Sec-WebSocket-Extensions`), so every payload is
plain: a frame with a reserved bit set, a masked frame from the server or an unmasked one from the client ends the
relay. The client's payloads (unmasked for reading) are scanned for placeholders; the server's for the real values
the broker holds, as one stream across frames, and a frame is sent on only once the scan cleared all of it (a
frame whose end could begin a secret waits for the next).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import NamedTuple

from agentbox.net.scan import Leak, PlaceholderScan, Scanner

MAX_FRAME = 16 << 20


class Broken(Exception):
    """Not a WebSocket stream the broker can read: the relay ends."""


class Frame(NamedTuple):
    raw: bytes  # as it came (header and payload)
    payload: bytes  # unmasked


async def read_frame(reader: asyncio.StreamReader, masked: bool) -> Frame:
    head = await reader.readexactly(2)
    if head[0] & 0x70:
        raise Broken("a frame with a reserved bit set (no extension was agreed)")
    if (head[0] & 0x0F) not in (0, 1, 2, 8, 9, 10):
        raise Broken("a frame with a reserved opcode")
    if bool(head[1] & 0x80) != masked:
        raise Broken("a client frame without a mask" if masked else "a masked frame from the server")
    length = head[1] & 0x7F
    extra = b""
    if length == 126:
        extra = await reader.readexactly(2)
        length = struct.unpack("!H", extra)[0]
    elif length == 127:
        extra = await reader.readexactly(8)
        length = struct.unpack("!Q", extra)[0]
    if length > MAX_FRAME:
        raise Broken(f"a frame over {MAX_FRAME >> 20} MB")
    key = await reader.readexactly(4) if masked else b""
    data = await reader.readexactly(length)
    return Frame(head + extra + key + data, _unmask(data, key) if masked else data)


def _unmask(data: bytes, key: bytes) -> bytes:
    if not data:
        return data
    repeated = (key * (len(data) // 4 + 1))[:len(data)]
    return (int.from_bytes(data, "big") ^ int.from_bytes(repeated, "big")).to_bytes(len(data), "big")


async def relay(client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                server: tuple[asyncio.StreamReader, asyncio.StreamWriter], scanner: Scanner,
                placeholder_found: Callable[[list[str]], str], idle: float,
                before_sending: Callable[[Frame], str | None] | None = None) -> str:
    """Relay until either side ends; returns why it ended ("" for an ordinary end). `placeholder_found` says why
    placeholders in a client's message end the relay; `before_sending` judges each client frame before it goes on
    (a canary or a private file in the messages, the host's upload cap: agentbox.net.intercept) and says why it
    ends the relay, or None."""
    async def upward() -> None:
        scan = PlaceholderScan()
        while True:
            frame = await asyncio.wait_for(read_frame(client[0], masked=True), idle)
            found = scan.feed(frame.payload)
            if found:
                raise Broken(placeholder_found(found))
            refused = before_sending(frame) if before_sending is not None else None
            if refused:
                raise Broken(refused)
            server[1].write(frame.raw)
            await server[1].drain()

    async def downward() -> None:
        waiting: list[tuple[bytes, int]] = []  # frames not yet sent: (raw, where their payload ends in the stream)
        seen = cleared = 0
        while True:
            try:
                frame = await asyncio.wait_for(read_frame(server[0], masked=False), idle)
            except asyncio.IncompleteReadError:
                cleared += len(scanner.flush())
                frame = None
            if frame is not None:
                seen += len(frame.payload)
                waiting.append((frame.raw, seen))
                cleared += len(scanner.feed(frame.payload))
            while waiting and waiting[0][1] <= cleared:
                client[1].write(waiting.pop(0)[0])
            await client[1].drain()
            if frame is None:
                return

    tasks = [asyncio.ensure_future(upward()), asyncio.ensure_future(downward())]
    why = ""
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            error = task.exception()
            if isinstance(error, Leak):
                why = "attempted leak: a real credential in a WebSocket message from the server; the connection " \
                      "was ended"
            elif isinstance(error, Broken):
                why = str(error)
            elif error is not None and not isinstance(error, (ConnectionError, asyncio.IncompleteReadError,
                                                                asyncio.TimeoutError)):
                raise error
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return why
