"""The floor of the main scenario: the least any runner must do, with nothing of trajforge.

Per prompt: POST the conversation, run the reply's `terminal` command with `bash -c`, POST again
with its output, and write one line. One aiohttp session, `--num_workers` prompts at once, and
nothing else: no sandbox, no record, statistics, checkpoint, retry, limit or progress line. Its
requests are the size of trajforge's (a system prompt and six tool schemas, ~4.7 KB against
~4.8), so the server and the JSON encoding cost the same per request.
`bench/throughput.py --floor` runs it beside trajforge in the same invocation, so the gap between
the two is trajforge's own cost on this machine and the floor is what the machine allows.

Two ways to start the command, the two trajforge uses:
- `loop`: from the event loop (asyncio subprocess: fork or vfork, pipes, a child watcher), as
  trajforge's `local` sandbox does;
- `helper`: sent over a socketpair to one separate spawner process that posix_spawns it and
  sends the output back, as trajforge's bwrap slot helpers do. Fork, exec and pipe reads then
  cost the other core, not the loop.

It takes trajforge's run flags (those it needs; the rest are ignored) so that throughput.py starts
it like the CLI, and writes `<output_dir>/<run_name>/trajectories.jsonl` and `statistics.json` in
the shape throughput.py checks: a prompt counts only when its command printed what the server's
script expects (`echo bench-$((6*7))` -> `bench-42`).

    .venv/bin/python bench/floor.py {loop|helper} run --dataset_file=F --base_url=URL --num_workers=N \\
        --output_dir=out --run_name=bench
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import struct
import sys
from pathlib import Path

import aiohttp
import orjson

_FRAME = struct.Struct("!II")  # request id, length

def _tool(name: str, what: str, params: dict[str, str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": what + " " + _ABOUT,
        "parameters": {"type": "object",
                       "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
                       "required": list(params)[:1]}}}


# A toolset the size of trajforge's terminal_only distribution (~4.8 KB per request with the
# conversation), so the server and the JSON encoding do the same work per request.
_ABOUT = ("It runs inside the sample's own environment, whose working directory holds the task's files; "
          "paths are relative to it unless absolute. Output longer than the limit is cut, and errors come "
          "back as the tool's result so that the next step can take them into account.")
_TOOLS = [
    _tool("terminal", "Run a shell command and return its output and exit code.",
          {"command": "The command line, run by bash -c.", "timeout": "Seconds before it is stopped."}),
    _tool("process", "Start, poll, read or stop a background command.",
          {"action": "start, poll, read, write or kill", "id": "The process id given by start."}),
    _tool("read_file", "Read a text file, with line numbers.",
          {"path": "The file.", "offset": "First line to read.", "limit": "How many lines."}),
    _tool("write_file", "Write a text file, creating its parent directories.",
          {"path": "The file.", "content": "Everything the file will hold."}),
    _tool("patch", "Replace one exact passage of a file with another.",
          {"path": "The file.", "old_string": "The passage as it is.", "new_string": "What it becomes."}),
    _tool("search_files", "Search file contents by regular expression, or file names by glob.",
          {"pattern": "What to look for.", "path": "Where to look.", "target": "content or files"}),
]
_SYSTEM = ("You are an agent working in a sandboxed environment with a terminal and file tools. Use the "
           "tools to inspect the environment and to complete the task; call one tool at a time and read its "
           "result before the next step. When the task is done, answer with what you found, briefly, and "
           "without calling a tool. If a command fails, read its error and try another way rather than "
           "repeating it. Never guess the content of a file or the output of a command: look. Keep answers "
           "short and factual; say when something could not be done and why. Work only inside the working "
           "directory unless the task says otherwise, and do not start long-running services.")

# The spawner, run as `python -c`: frames in, posix_spawn, output frames back. Plain blocking
# selectors: it is the stand-in for a sandbox helper, which is a small synchronous process too.
_SPAWNER = r"""
import os, selectors, socket, struct, sys
F = struct.Struct("!II")
sock = socket.socket(fileno=int(sys.argv[1]))
sel = selectors.DefaultSelector()
sel.register(sock, selectors.EVENT_READ, None)
running, buf = {}, b""
while True:
    for key, _ in sel.select():
        if key.data is None:
            data = sock.recv(1 << 16)
            if not data:
                sys.exit(0)
            buf += data
            while len(buf) >= F.size and len(buf) >= F.size + F.unpack_from(buf)[1]:
                rid, n = F.unpack_from(buf)
                cmd, buf = buf[F.size:F.size + n].decode(), buf[F.size + n:]
                r, w = os.pipe()
                pid = os.posix_spawn("/bin/bash", ["bash", "-c", cmd], {"PATH": "/usr/bin:/bin"}, setsid=True,
                                     file_actions=[(os.POSIX_SPAWN_DUP2, w, 1), (os.POSIX_SPAWN_DUP2, w, 2)])
                os.close(w)
                running[r] = (rid, pid, [])
                sel.register(r, selectors.EVENT_READ, r)
        else:
            r = key.data
            rid, pid, chunks = running[r]
            data = os.read(r, 1 << 16)
            if data:
                chunks.append(data)
                continue
            sel.unregister(r)
            os.close(r)
            os.waitpid(pid, 0)
            del running[r]
            out = b"".join(chunks)
            sock.sendall(F.pack(rid, len(out)) + out)
"""


class Spawner:
    """The runner's end of the spawner process."""

    def __init__(self) -> None:
        self._sock, self._peer = socket.socketpair()
        self._waiting: dict[int, asyncio.Future[bytes]] = {}
        self._ids = 0
        self._buf = b""

    async def start(self) -> None:
        fd = self._peer.fileno()
        self._proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _SPAWNER, str(fd), pass_fds=[fd])
        self._peer.close()
        self._sock.setblocking(False)
        asyncio.get_running_loop().add_reader(self._sock, self._readable)

    def _readable(self) -> None:
        data = self._sock.recv(1 << 16)
        if not data:
            for f in self._waiting.values():
                f.set_exception(EOFError("the spawner exited"))
            asyncio.get_running_loop().remove_reader(self._sock)
            return
        self._buf += data
        while len(self._buf) >= _FRAME.size:
            rid, n = _FRAME.unpack_from(self._buf)
            if len(self._buf) < _FRAME.size + n:
                break
            self._waiting.pop(rid).set_result(self._buf[_FRAME.size:_FRAME.size + n])
            self._buf = self._buf[_FRAME.size + n:]

    async def run(self, command: str) -> bytes:
        self._ids += 1
        fut = asyncio.get_running_loop().create_future()
        self._waiting[self._ids] = fut
        cmd = command.encode()
        await asyncio.get_running_loop().sock_sendall(self._sock, _FRAME.pack(self._ids, len(cmd)) + cmd)
        return await fut

    async def aclose(self) -> None:
        asyncio.get_running_loop().remove_reader(self._sock)
        self._sock.close()
        await self._proc.wait()  # reaped: its CPU and its shells' count in the harness's os.wait4


async def in_loop(command: str) -> bytes:
    proc = await asyncio.create_subprocess_exec("/bin/bash", "-c", command, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                env={"PATH": "/usr/bin:/bin"}, start_new_session=True)
    out, _ = await proc.communicate()
    return out


async def run(mode: str, prompts: list[str], url: str, workers: int, out: Path) -> int:
    spawner = Spawner() if mode == "helper" else None
    if spawner is not None:
        await spawner.start()
    todo = iter(enumerate(prompts))
    good = 0
    lines: list[bytes] = []
    headers = {"Content-Type": "application/json", "Authorization": "Bearer floor"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def complete(messages: list[dict]) -> dict:
            body = orjson.dumps({"model": "bench", "messages": messages, "tools": _TOOLS})
            async with http.post(url + "/chat/completions", data=body, headers=headers) as r:
                r.raise_for_status()
                return orjson.loads(await r.read())["choices"][0]["message"]

        async def session() -> None:
            nonlocal good
            for index, prompt in todo:
                messages = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]
                reply = await complete(messages)
                call = reply["tool_calls"][0]
                command = orjson.loads(call["function"]["arguments"])["command"]
                output = await (spawner.run(command) if spawner else in_loop(command))
                messages += [reply, {"role": "tool", "tool_call_id": call["id"], "content": output.decode()}]
                answer = await complete(messages)
                ok = output.strip() == b"bench-42" and not answer.get("tool_calls")
                good += ok
                lines.append(orjson.dumps({"prompt_index": index, "completed": ok,
                                           "tool_stats": {"terminal": {"count": 1, "success": int(ok)}}}) + b"\n")

        async with asyncio.TaskGroup() as tg:
            for _ in range(workers):
                tg.create_task(session())
    if spawner is not None:
        await spawner.aclose()
    out.mkdir(parents=True, exist_ok=True)
    (out / "trajectories.jsonl").write_bytes(b"".join(lines))
    (out / "statistics.json").write_bytes(orjson.dumps(
        {"run": {"samples": {"failed": len(prompts) - good, "discarded": 0, "failed_by_class": {},
                             "discarded_by_reason": {}}}}))
    return 0 if good == len(prompts) else 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["loop", "helper"])
    ap.add_argument("command", choices=["run"])
    ap.add_argument("--dataset_file", required=True)
    ap.add_argument("--base_url", required=True)
    ap.add_argument("--num_workers", type=int, required=True)
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--run_name", required=True)
    args, _ = ap.parse_known_args(argv)
    prompts = [orjson.loads(line)["prompt"] for line in Path(args.dataset_file).read_bytes().splitlines() if line]
    out = Path(args.output_dir) / args.run_name
    if args.mode == "loop" and hasattr(os, "pidfd_open"):  # as trajforge does on 3.11 (runner/eventloop.py)
        asyncio.set_child_watcher(asyncio.PidfdChildWatcher())
    return asyncio.run(run(args.mode, prompts, args.base_url.rstrip("/"), args.num_workers, out))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
