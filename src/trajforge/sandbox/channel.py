"""The runner's end of the in-sandbox helper (sandbox/inside/helper.py): requests, replies, processes.

One HelperChannel per helper (a sample's, or a container's file helper), over a non-blocking unix stream socket read by the event loop. Requests carry an id;
replies and process-exit events come back as frames whose meta the runner parses (JSON) as
untrusted input (the helper runs as the sample), with sizes capped: a helper that breaks the
protocol breaks only its own sample (SandboxError). A foreground command's output comes with
its exit event (head and tail of each stream, commands.py): one request and one event per
command; background jobs keep their output in the helper (HelperJob.read). No host path
crosses the channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import marshal
import socket
import struct
from typing import Any

try:  # ~10 us less per frame than json's; the sandbox package itself needs only the stdlib
    from orjson import loads as _loads
except ImportError:  # (tests/sandbox/test_bwrap_user.py runs it as `nobody` with the system Python)
    from json import loads as _loads

from trajforge.sandbox.inside import fsops
from trajforge.sandbox.interface import ExecResult, Job, LogChunk, SandboxError, check_model_path, raise_reply
from trajforge.sandbox.inside.helper import CD_FAILED, CD_FAILED_EXIT
from trajforge.sandbox.process import DETACH_GRACE, DETACH_NOTE, CappedBuffer

_HEAD = struct.Struct("<II")
MAX_META = 4 << 20
MAX_PAYLOAD = 300 << 20  # above every cap a request asks for (sandbox.interface.READ_CAP)


class _Proc:
    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int = 0) -> None:
        self.pid = 0
        self.code: int | None = None
        self.exited: asyncio.Future[int] = loop.create_future()
        self.out, self.err = CappedBuffer(cap), CappedBuffer(cap)
        self.detached = False

    def start(self, reply: dict[str, Any]) -> None:
        """The helper's answer to an exec: a pid, or `failed` (it never started: no exit event)."""
        self.pid = int(reply["pid"])
        failed = reply.get("failed")
        if failed is not None and not self.exited.done():
            self.err.feed(str(reply.get("err", "")).encode())
            self.end(int(failed))

    def end(self, code: int) -> None:
        if not self.exited.done():
            self.code = code
            self.exited.set_result(code)

    def output(self, meta: dict[str, Any], payload: bytes) -> None:
        """A foreground command's exit event: head and tail of each stream (commands.Capture)."""
        sizes = meta.get("sizes")
        if not (isinstance(sizes, list) and len(sizes) == 6 and all(isinstance(n, int) and n >= 0 for n in sizes)
                and sizes[0] + sizes[1] + sizes[3] + sizes[4] == len(payload)):
            return  # a helper that breaks the protocol: no output, never someone else's bytes
        at = 0
        for buf, (head, tail, total) in ((self.out, sizes[0:3]), (self.err, sizes[3:6])):
            buf.restore(payload[at:at + head], payload[at + head:at + head + tail], total)
            at += head + tail
        self.detached = meta.get("detached") is True


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
            data = self.sock.recv(1 << 16)  # not more: glibc serves a larger buffer with mmap and munmap
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
                meta = _loads(bytes(self._buf[8:8 + mlen]))  # either's JSONDecodeError is a ValueError
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
                if "sizes" in meta:
                    proc.output(meta, payload)
                proc.end(code if isinstance(code, int) else -9)
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
            proc.end(-9)
        self._procs.clear()

    def close(self) -> None:
        self._break("the sandbox is closed")
        self.sock.close()

    async def _send(self, meta: dict[str, Any], payload: bytes = b"") -> None:
        data = marshal.dumps(meta)
        async with self._send_lock:
            await self.loop.sock_sendall(self.sock, _HEAD.pack(len(data), len(payload)) + data + payload)

    def expect(self, rid: int) -> asyncio.Future[tuple[dict[str, Any], bytes]]:
        """The reply frame `rid` that the helper sends unasked (a sandbox's first frame: ready)."""
        fut = self._replies[rid] = self.loop.create_future()
        return fut

    async def call(self, meta: dict[str, Any], payload: bytes = b"",
                   proc: _Proc | None = None) -> tuple[dict[str, Any], bytes]:
        """One request and its reply; file errors raised as the model's, breakage as SandboxError."""
        if self.broken:
            raise SandboxError(self.broken)
        rid = meta.setdefault("id", next(self._ids))
        fut = self._replies[rid] = self.loop.create_future()
        if proc is not None:
            self._procs[rid] = proc
        try:
            await self._send(meta, payload)
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
            raise_reply(reply)
        return reply, data

    def _kill_late(self, fut: asyncio.Future[tuple[dict[str, Any], bytes]]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        pid = fut.result()[0].get("pid")
        if isinstance(pid, int) and not self.broken:
            self._tasks.add(task := self.loop.create_task(self.kill_group(pid)))
            task.add_done_callback(self._tasks.discard)

    # --- files -----------------------------------------------------------------------------
    async def read_file(self, path: str, max_bytes: int, offset: int | None = None) -> bytes:
        _, data = await self.call({"op": "read", "path": check_model_path(path), "max": max_bytes, "offset": offset})
        if len(data) > max_bytes:
            raise SandboxError("the sandbox helper sent more than was asked for")
        return data

    async def write_file(self, path: str, data: bytes, how: str) -> str:
        reply, _ = await self.call({"op": "write", "path": check_model_path(path), "how": how}, data)
        return str(reply.get("rel", ""))

    async def search(self, path: str, pattern: str, *, target: str, glob: str | None, limit: int, max_file: int,
                     max_files: int) -> tuple[list[str], bool]:
        reply, _ = await self.call({
            "op": "search", "path": check_model_path(path), "pattern": pattern, "target": target, "glob": glob,
            "limit": limit, "max_file": max_file, "max_files": max_files, "seconds": fsops.SEARCH_SECONDS})
        found = reply.get("found")
        if not isinstance(found, list):
            raise SandboxError("the sandbox helper sent a malformed search result")
        return [str(x) for x in found[:limit]], bool(reply.get("more"))

    async def inspect(self) -> dict[str, Any]:
        """The helper's own /proc status, descriptors and whether its imports are sealed (helper.op_self)."""
        reply, _ = await self.call({"op": "self"})
        return reply

    # --- processes -------------------------------------------------------------------------
    async def exec(self, command: str, *, timeout: float, cwd: str | None) -> ExecResult:
        proc = _Proc(self.loop, self.output_cap)
        reply, _ = await self.call({"op": "exec", "cmd": command, "cwd": cwd, "cap": self.output_cap}, proc=proc)
        proc.start(reply)
        # asyncio.wait never cancels what it watches: after a timeout the exit is still awaitable.
        try:
            done, _ = await asyncio.wait([proc.exited], timeout=timeout)
        except asyncio.CancelledError:  # the command must not outlive its call
            await asyncio.shield(self.kill_group(proc.pid))
            raise
        timed_out = not done
        if timed_out:
            await asyncio.shield(self.kill_group(proc.pid))
            # The helper reports it once killed (and its pipes closed, DETACH_GRACE at most).
            await asyncio.wait([proc.exited], timeout=DETACH_GRACE + 5)
        stderr = proc.err.text() + (DETACH_NOTE if proc.detached and not timed_out else "")
        res = ExecResult(exit_code=None if timed_out else proc.code, stdout=proc.out.text(), stderr=stderr,
                         timed_out=timed_out, truncated=proc.out.truncated or proc.err.truncated)
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
        reply, _ = await self.call({"op": "exec", "cmd": command, "cwd": cwd, "log": True}, proc=proc)
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
