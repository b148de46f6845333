"""The runner's end of the root-mode zygote (zygote.py): one per run, held by the bwrap runtime.

Started with the runner's interpreter (`-S -I`, clean environment, the helper script on stdin).
`request` sends one request and awaits its reply; `fork` also hands over a channel socket (a
sandbox's, or a container's file helper's) and returns the forked process's host pid and a future
that resolves, with its exit code, once it is reaped (for a sandbox, every process of its pid
namespace is dead by then). Closing the socket ends the
zygote; so does the runner's death (its parent-death signal).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import itertools
import marshal
import os
import socket
import struct
import sys
from typing import Any

from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.process import SAFE_PATH

_FRAME = struct.Struct("<I")
# The script arrives compiled (marshal, same interpreter): a zygote that compiled it itself would keep
# ~2 MB more of the compiler's heap, copied into every fork's page tables.
_BOOT = "import marshal,os;exec(marshal.loads(b''.join(iter(lambda:os.read(0,1<<20),b''))))"
_F_SETPIPE_SZ = 1031


class Zygote:
    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self.broken: str | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._buf = bytearray()
        self._lock = asyncio.Lock()

    async def start(self, source: bytes) -> Zygote:
        code = marshal.dumps(compile(source, "zygote", "exec"))
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        src_r, src_w = os.pipe()
        try:
            fcntl.fcntl(src_w, _F_SETPIPE_SZ, max(len(code), 1 << 16))  # the whole script fits: never blocks
            os.write(src_w, code)
            os.close(src_w)
            # argv[0] is a name, not the runner's interpreter path: helpers inherit this command
            # line, and a sample's `ps` shows it as its pid 1.
            self.proc = await asyncio.create_subprocess_exec(
                "sandbox-init", "-S", "-I", "-c", _BOOT, str(theirs.fileno()), "zygote", executable=sys.executable,
                stdin=src_r,
                stdout=asyncio.subprocess.DEVNULL, env={"PATH": SAFE_PATH}, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start the sandbox zygote: {e}") from e
        finally:
            os.close(src_r)
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        asyncio.get_running_loop().add_reader(ours.fileno(), self._on_readable)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else 0

    def _on_readable(self) -> None:
        # Deliberately not channel.HelperChannel's reader: this peer is the runner's own (marshal
        # frames, no size caps), that one a sample's helper (JSON parsed as untrusted, capped).
        assert self.sock is not None
        try:
            data = self.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self._break(f"the sandbox zygote's socket failed: {e}")
        if not data:
            return self._break("the sandbox zygote is gone")
        self._buf += data
        while len(self._buf) >= 4:
            (size,) = _FRAME.unpack_from(self._buf)
            if len(self._buf) < 4 + size:
                break
            msg = marshal.loads(bytes(self._buf[4:4 + size]))  # the zygote is ours: trusted input
            del self._buf[:4 + size]
            if msg.get("ev") == "exit":
                fut = self._exits.pop(msg["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(int(msg.get("code", -9)))
                continue
            reply = self._replies.pop(msg["id"], None)
            if reply is not None and not reply.done():
                reply.set_result(msg)

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        if self.sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self.sock.fileno())
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(SandboxError(why))
        self._replies.clear()
        for ex in self._exits.values():  # the zygote's death kills no helper: the runner's channel
            if not ex.done():  # closing does; report them gone so nothing waits forever
                ex.set_result(-9)
        self._exits.clear()

    async def request(self, op: str, *, channel: socket.socket | None = None, **fields: Any) -> dict[str, Any]:
        """One request; SandboxError when the zygote refuses it or is gone."""
        if self.broken or self.sock is None:
            raise SandboxError(self.broken or "the sandbox zygote is not running")
        rid = next(self._ids)
        data = marshal.dumps({"op": op, "id": rid, **fields})
        frame = _FRAME.pack(len(data)) + data
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._replies[rid] = fut
        if op in ("sandbox", "enter"):
            self._exits[rid] = loop.create_future()
        try:
            async with self._lock:  # a frame and its descriptor go together
                if channel is not None:
                    fds = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [channel.fileno()]).tobytes())]
                    while True:
                        try:
                            sent = self.sock.sendmsg([frame], fds)
                            break
                        except BlockingIOError:
                            await _writable(loop, self.sock)
                    frame = frame[sent:]
                if frame:
                    await loop.sock_sendall(self.sock, frame)
        except OSError as e:
            self._break(f"the sandbox zygote is gone: {e}")
        finally:
            if channel is not None:
                channel.close()
        reply = await fut
        if "error" in reply:
            self._exits.pop(rid, None)
            raise SandboxError(f"the sandbox zygote refused {op}: {reply['error']}")
        reply["rid"] = rid
        return reply

    async def fork(self, channel: socket.socket, op: str, **fields: Any) -> tuple[int, asyncio.Future[int]]:
        """Fork a process serving `channel` (closed here): a sandbox (`sandbox`) or a container's
        file helper (`enter`); (host pid, its exit once reaped)."""
        reply = await self.request(op, channel=channel, **fields)
        exited = self._exits.get(reply["rid"])
        if exited is None:  # cannot happen: the reply comes before any exit event
            exited = asyncio.get_running_loop().create_future()
            exited.set_result(-9)
        return int(reply["pid"]), exited

    async def aclose(self) -> None:
        if self.sock is not None:
            self._break("the sandbox zygote is closed")
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _writable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    fut = loop.create_future()
    loop.add_writer(sock.fileno(), lambda: fut.done() or fut.set_result(None))
    try:
        await fut
    finally:
        loop.remove_writer(sock.fileno())
