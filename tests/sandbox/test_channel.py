"""The runner's end of a helper channel (sandbox/channel.py) reads what a hostile helper could send:
frames that are not JSON, not an object, oversized, or whose output sizes lie. Each breaks that
channel alone, with a SandboxError for the pending request, and nothing is misattributed."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import pytest

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.channel import MAX_META, HelperChannel

HEAD = struct.Struct("<II")


def frame(meta: bytes, payload: bytes = b"") -> bytes:
    return HEAD.pack(len(meta), len(payload)) + meta + payload


async def _reply_with(data: bytes) -> tuple[HelperChannel, BaseException | tuple]:
    ours, theirs = socket.socketpair()
    channel = HelperChannel(ours, 1000)
    call = asyncio.ensure_future(channel.call({"op": "read", "path": "x", "max": 10}))
    await asyncio.sleep(0)
    theirs.recv(1 << 16)  # the request
    theirs.sendall(data)
    try:
        async with asyncio.timeout(5):
            return channel, await call
    except SandboxError as e:
        return channel, e
    finally:
        theirs.close()
        channel.close()


@pytest.mark.parametrize("data", [
    frame(b"{not json"),
    frame(b"[1, 2]"),
    frame(b'{"id": "1"}'),
    frame('{"id": 1, "msg": "\udcff"}'.encode("utf-8", "surrogatepass")),  # not UTF-8
    HEAD.pack(MAX_META + 1, 0),
])
def test_a_malformed_frame_breaks_only_that_channel(data: bytes) -> None:
    channel, outcome = asyncio.run(_reply_with(data))
    assert isinstance(outcome, SandboxError), outcome
    assert "broke the protocol" in str(outcome), outcome
    assert channel.broken


def test_a_well_formed_reply_is_read() -> None:
    _, outcome = asyncio.run(_reply_with(frame(json.dumps({"id": 1}).encode(), b"data")))
    assert outcome == ({"id": 1}, b"data")
