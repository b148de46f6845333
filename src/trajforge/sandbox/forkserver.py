"""The runner's end of the root-mode zygote (zygote.py): one per run, held by the provider.

Started on first use with the runner's interpreter (`-S -I`, clean environment, the helper
script on stdin); `fork_helper` hands it a sample's bwrap init pid, uids and channel socket.
Closing the socket ends it; so does the runner's death (its parent-death signal).
"""

from __future__ import annotations

import array
import asyncio
import marshal
import os
import socket
import struct
import sys

from trajforge.sandbox.base import SandboxError
from trajforge.sandbox.process import SAFE_PATH


class Zygote:
    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.sock: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def start(self, source: bytes) -> Zygote:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        src_r, src_w = os.pipe()
        try:
            os.write(src_w, source)  # < 64 KiB: fits the pipe
            os.close(src_w)
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-S", "-I", "-c", "import os;exec(compile(os.read(0,1<<17),'zygote','exec'))",
                str(theirs.fileno()), "zygote", stdin=src_r, stdout=asyncio.subprocess.DEVNULL,
                env={"PATH": SAFE_PATH}, pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as e:
            ours.close()
            raise SandboxError(f"cannot start the sandbox zygote: {e}") from e
        finally:
            os.close(src_r)
            theirs.close()
        ours.setblocking(False)
        self.sock = ours
        return self

    async def fork_helper(self, ns_pid: int, uid: int, huid: int, channel: socket.socket,
                          cgroup: str | None = None) -> None:
        """Ask for a helper in the namespaces of `ns_pid`, serving `channel` (closed here), in the
        cgroup whose cgroup.procs is `cgroup` if given."""
        if self.sock is None or self.proc is None or self.proc.returncode is not None:
            raise SandboxError("the sandbox zygote is gone")
        data = marshal.dumps({"pid": ns_pid, "uid": uid, "huid": huid, "cgroup": cgroup})
        frame = struct.pack("<I", len(data)) + data
        loop = asyncio.get_running_loop()
        try:
            async with self._lock:  # a frame and its descriptor go together
                while True:
                    try:
                        sent = self.sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                            array.array("i", [channel.fileno()]).tobytes())])
                        break
                    except BlockingIOError:  # a full socket buffer: wait until the zygote catches up
                        writable = loop.create_future()
                        loop.add_writer(self.sock.fileno(), lambda f=writable: f.done() or f.set_result(None))
                        try:
                            await writable
                        finally:
                            loop.remove_writer(self.sock.fileno())
                if sent < len(frame):
                    await loop.sock_sendall(self.sock, frame[sent:])
        except OSError as e:
            raise SandboxError(f"the sandbox zygote is gone: {e}") from e
        finally:
            channel.close()

    async def aclose(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.returncode is None:
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
