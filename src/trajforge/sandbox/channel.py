"""The runner's end of the in-sandbox helper (sandbox/helper.py): requests, replies, processes.

One HelperChannel per sample, over a non-blocking unix stream socket read by the event loop.
Requests carry an id; replies and process-exit events come back as frames whose meta the runner
parses (json) as untrusted input (the helper runs as the sample), with sizes capped: a
helper that breaks the protocol breaks only its own sample (SandboxError). Foreground commands
get two pipes passed with SCM_RIGHTS and read here; background jobs keep their output in the
helper (HelperJob.read). No host path crosses the channel.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import marshal
import os
import socket
import struct
from typing import Any

import json

from trajforge.sandbox.base import ExecResult, FileOpError, Job, LogChunk, PathEscapeError, SandboxError, SymlinkError
from trajforge.sandbox.helper import CD_FAILED, CD_FAILED_EXIT
from trajforge.sandbox.process import DETACH_GRACE, DETACH_NOTE, CappedBuffer

_HEAD = struct.Struct("<II")
MAX_META = 4 << 20
MAX_PAYLOAD = 300 << 20  # above every cap a request asks for (sandbox.base.READ_CAP)


class _Proc:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pid = 0
        self.code: int | None = None
        self.exited: asyncio.Future[int] = loop.create_future()

    def start(self, reply: dict[str, Any]) -> None:
        """The helper's answer to an exec: a pid, or `failed` (it never started: no exit event)."""
        self.pid = int(reply["pid"])
        failed = reply.get("failed")
        if failed is not None and not self.exited.done():
            self.code = int(failed)
            self.exited.set_result(self.code)


class _Reader(asyncio.Protocol):
    def __init__(self, buf: CappedBuffer, closed: asyncio.Future[None]) -> None:
        self.buf, self.closed = buf, closed

    def data_received(self, data: bytes) -> None:
        self.buf.feed(data)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class HelperChannel:
    def __init__(self, sock: socket.socket, output_cap: int) -> None:
        self.sock = sock
        self.output_cap = output_cap
        self.loop = asyncio.get_running_loop()
        sock.setblocking(False)
        self._ids = itertools.count(1)
        self._replies: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}
        self._procs: dict[int, _Proc] = {}
        self._buf = bytearray()
        self._send_lock = asyncio.Lock()
        self.broken: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.loop.add_reader(sock.fileno(), self._on_readable)

    # --- transport -------------------------------------------------------------------------
    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            return self._break(f"the sandbox helper's channel failed: {e}")
        if not data:
            return self._break("the sandbox helper is gone")
        self._buf += data
        while len(self._buf) >= 8:
            mlen, plen = _HEAD.unpack_from(self._buf)
            if mlen > MAX_META or plen > MAX_PAYLOAD:
                return self._break("the sandbox helper broke the protocol (oversized frame)")
            if len(self._buf) < 8 + mlen + plen:
                break
            try:
                meta = json.loads(bytes(self._buf[8:8 + mlen]))
                if not isinstance(meta, dict) or not isinstance(meta.get("id", 0), int):
                    raise ValueError("not an object")
            except ValueError:
                return self._break("the sandbox helper broke the protocol (bad frame)")
            payload = bytes(self._buf[8 + mlen:8 + mlen + plen])
            del self._buf[:8 + mlen + plen]
            self._dispatch(meta, payload)

    def _dispatch(self, meta: dict[str, Any], payload: bytes) -> None:
        rid = meta.get("id")
        if meta.get("ev") == "exit":
            proc = self._procs.pop(rid, None) if isinstance(rid, int) else None
            if proc is not None and not proc.exited.done():
                code = meta.get("code")
                proc.code = code if isinstance(code, int) else -9
                proc.exited.set_result(proc.code)
            return
        fut = self._replies.pop(rid, None) if isinstance(rid, int) else None
        if fut is not None and not fut.done():
            fut.set_result((meta, payload))

    def _break(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        with contextlib.suppress(ValueError, OSError):
            self.loop.remove_reader(self.sock.fileno())
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(SandboxError(why))
        self._replies.clear()
        for proc in self._procs.values():  # the namespace died with the helper: so did they
            if not proc.exited.done():
                proc.code = -9
                proc.exited.set_result(-9)
        self._procs.clear()

    def close(self) -> None:
        self._break("the sandbox is closed")
        self.sock.close()

    async def _send(self, meta: dict[str, Any], payload: bytes = b"", fds: tuple[int, ...] = ()) -> None:
        data = marshal.dumps(meta)
        frame = _HEAD.pack(len(data), len(payload)) + data
        async with self._send_lock:
            if fds:  # the descriptors ride on the first bytes of the frame
                while True:
                    try:
                        sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                            array.array("i", fds).tobytes())])
                        break
                    except BlockingIOError:
                        await self._writable()
                frame = frame[sent:]
            await self.loop.sock_sendall(self.sock, frame + payload)

    async def _writable(self) -> None:
        fut = self.loop.create_future()
        self.loop.add_writer(self.sock.fileno(), lambda: fut.done() or fut.set_result(None))
        try:
            await fut
        finally:
            self.loop.remove_writer(self.sock.fileno())

    async def call(self, meta: dict[str, Any], payload: bytes = b"", fds: tuple[int, ...] = (),
                   proc: _Proc | None = None) -> tuple[dict[str, Any], bytes]:
        """One request and its reply; file errors raised as the model's, breakage as SandboxError."""
        if self.broken:
            raise SandboxError(self.broken)
        rid = meta.setdefault("id", next(self._ids))
        fut = self._replies[rid] = self.loop.create_future()
        if proc is not None:
            self._procs[rid] = proc
        try:
            await self._send(meta, payload, fds)
        except OSError as e:
            self._break(f"the sandbox helper's channel failed: {e}")
        try:
            reply, data = await fut
        except asyncio.CancelledError:
            if proc is not None:  # the command may start after all: kill it as soon as its pid is known
                self._replies[rid] = late = self.loop.create_future()
                late.add_done_callback(self._kill_late)
            raise
        kind = reply.get("error")
        if kind is not None:
            self._procs.pop(rid, None)
            msg = str(reply.get("msg", ""))
            if kind == "symlink":
                raise SymlinkError(str(reply.get("rel", "")), str(reply.get("link", "")))
            if kind == "escape":
                raise PathEscapeError(msg)
            raise FileOpError(str(kind), msg)
        return reply, data

    def _kill_late(self, fut: asyncio.Future[tuple[dict[str, Any], bytes]]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        pid = fut.result()[0].get("pid")
        if isinstance(pid, int) and not self.broken:
            self._tasks.add(task := self.loop.create_task(self.kill_group(pid)))
            task.add_done_callback(self._tasks.discard)

    # --- processes -------------------------------------------------------------------------
    async def exec(self, command: str, *, timeout: float, cwd: str | None) -> ExecResult:
        out_buf, err_buf = CappedBuffer(self.output_cap), CappedBuffer(self.output_cap)
        closed = [self.loop.create_future(), self.loop.create_future()]
        pipes = [os.pipe(), os.pipe()]
        transports = []
        try:
            for (r, _), buf, done in zip(pipes, (out_buf, err_buf), closed, strict=True):
                t, _ = await self.loop.connect_read_pipe(lambda b=buf, d=done: _Reader(b, d), open(r, "rb", 0))
                transports.append(t)
            proc = _Proc(self.loop)
            meta: dict[str, Any] = {"op": "exec", "cmd": command, "cwd": cwd, "nfds": 2}
            reply, _ = await self.call(meta, fds=(pipes[0][1], pipes[1][1]), proc=proc)
        finally:
            for _, w in pipes:
                os.close(w)
        proc.start(reply)
        timed_out = detached = False
        all_closed = asyncio.gather(*closed)
        try:
            done, _ = await asyncio.wait([proc.exited], timeout=timeout)
            timed_out = not done
            if done:
                done, _ = await asyncio.wait([all_closed], timeout=DETACH_GRACE)
                detached = not done
        finally:
            if not all_closed.done():
                await asyncio.shield(self.kill_group(proc.pid))
                await asyncio.wait([all_closed], timeout=DETACH_GRACE)
            if not proc.exited.done():
                await asyncio.wait([proc.exited], timeout=DETACH_GRACE)
            for t in transports:
                t.close()
        stderr = err_buf.text() + (DETACH_NOTE if detached else "")
        res = ExecResult(exit_code=None if timed_out else proc.code, stdout=out_buf.text(), stderr=stderr,
                         timed_out=timed_out, truncated=out_buf.truncated or err_buf.truncated)
        if proc.code == CD_FAILED_EXIT and stderr.startswith(CD_FAILED):
            res.start_error = "the command could not start in its working directory: " + \
                stderr[len(CD_FAILED):].strip(": \n")
        return res

    async def kill_group(self, pgid: int) -> None:
        if pgid <= 1:  # a command that never started has no group
            return
        with contextlib.suppress(SandboxError):
            await self.call({"op": "kill", "pgid": pgid})

    async def spawn(self, command: str, *, cwd: str | None) -> HelperJob:
        proc = _Proc(self.loop)
        reply, _ = await self.call({"op": "exec", "cmd": command, "cwd": cwd, "nfds": 0, "log": True}, proc=proc)
        proc.start(reply)
        return HelperJob(self, int(reply["id"]), proc)


class HelperJob(Job):
    def __init__(self, channel: HelperChannel, job_id: int, proc: _Proc) -> None:
        self.channel, self.id, self.proc, self.pid = channel, job_id, proc, proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.code

    async def wait(self, timeout: float | None = None) -> int | None:
        await asyncio.wait([self.proc.exited], timeout=timeout)
        return self.proc.code

    async def kill(self) -> None:
        await self.channel.kill_group(self.pid)
        await self.wait(5)

    async def read(self, offset: int, cap: int) -> LogChunk:
        try:
            reply, data = await self.channel.call({"op": "log", "job": self.id, "offset": offset, "cap": cap})
        except SandboxError:
            return LogChunk(b"", b"", 0, offset)  # the sandbox is gone, and its output with it
        head = min(int(reply.get("head", 0)), len(data))
        return LogChunk(data[:head], data[head:], int(reply.get("dropped", 0)), int(reply.get("end", offset)))
