"""A local HTTP proxy that puts the egress policy in front of the run's Chromium.

Chromium is started with `--proxy-server` pointing here and `--proxy-bypass-list=<-loopback>`
(so even localhost goes through the proxy), hence every request of every page (navigations,
subresources, redirects, fetch/XHR, websockets) reaches the network only through this proxy.
Chromium does not resolve names itself when it uses a proxy; the proxy resolves, checks each
address with the policy (egress.py) and connects to a checked address, so DNS rebinding
and redirects to private addresses are refused like the first request. Two request forms:
CONNECT host:port (https, wss: a tunnel), and absolute-form `GET http://host/...` (http, ws),
forwarded on a fresh upstream connection with `Connection: close` both ways. Refusals answer 403 with
the policy's reason as the body. The server listens on 127.0.0.1 only, for the runner's
Chromium; samples never reach the host's loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

import httpcore

from trajforge.netpolicy import Policy
from trajforge.tools.web.egress import EgressRefused, resolve_checked

_MAX_HEAD = 64 * 1024
EGRESS_HEADER = "X-Trajforge-Egress"
_HOP = {b"proxy-connection", b"connection", b"keep-alive", b"proxy-authorization"}


class EgressProxy:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.server: asyncio.Server | None = None
        self.port = 0
        self.refused: list[str] = []  # recent refusals, newest last (for tests and logs)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0, limit=_MAX_HEAD)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}"

    async def aclose(self) -> None:
        if self.server is not None:
            self.server.close()
            for task in list(self._tasks):
                task.cancel()
            with contextlib.suppress(Exception):
                await self.server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, _, rest = head.partition(b"\r\n")
        method, target, version = line.split(b" ", 2)
        if method == b"CONNECT":
            host, _, port = target.decode("latin-1").rpartition(":")
            upstream = await self._connect(host, int(port), writer)
            if upstream is None:
                return
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await _pipe_both(reader, writer, *upstream)
            return
        url = urlsplit(target.decode("latin-1"))
        if url.scheme not in ("http", "ws") or not url.hostname:
            await _refuse(writer, f"only http(s) and ws(s) URLs can be fetched, not {target[:100]!r}")
            return
        upstream = await self._connect(url.hostname, url.port or 80, writer)
        if upstream is None:
            return
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        headers = [h for h in rest.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP]
        upgrade = any(h.lower().startswith(b"upgrade:") for h in headers)
        conn = b"Connection: Upgrade" if upgrade else b"Connection: close"
        up_reader, up_writer = upstream
        up_writer.write(b" ".join((method, path.encode("latin-1"), version)) + b"\r\n"
                        + b"\r\n".join([*headers, conn]) + b"\r\n\r\n")
        # The answer tells Chromium to close too: a reused client connection would otherwise carry
        # its next request, maybe for another host, to this upstream.
        answer = await up_reader.readuntil(b"\r\n\r\n")
        status, _, fields = answer.partition(b"\r\n")
        if b" 101 " not in status + b" ":
            kept = [h for h in fields.split(b"\r\n") if h and h.split(b":", 1)[0].strip().lower() not in _HOP]
            answer = status + b"\r\n" + b"\r\n".join([*kept, b"Connection: close"]) + b"\r\n\r\n"
        writer.write(answer)
        await _pipe_both(reader, writer, up_reader, up_writer)

    async def _connect(self, host: str, port: int, writer: asyncio.StreamWriter
                       ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            addrs = await resolve_checked(host, port, self.policy)
        except EgressRefused as e:
            self.refused = [*self.refused[-99:], f"{host}:{port}"]
            await _refuse(writer, str(e))
            return None
        except httpcore.ConnectError as e:
            await _refuse(writer, str(e), status=b"502 Bad Gateway")
            return None
        why = "no address"
        for addr in addrs:
            try:
                async with asyncio.timeout(10):
                    return await asyncio.open_connection(addr, port, limit=_MAX_HEAD)
            except ConnectionRefusedError:
                why = "connection refused"
            except (OSError, TimeoutError) as e:
                why = str(e) or type(e).__name__
        await _refuse(writer, f"cannot connect to {host}:{port}: {why}", status=b"502 Bad Gateway")
        return None


async def _refuse(writer: asyncio.StreamWriter, message: str, status: bytes = b"403 Forbidden") -> None:
    """An answer of the proxy itself, marked by EGRESS_HEADER so tools report it as a failure."""
    body = message.encode()
    writer.write(b"HTTP/1.1 " + status + b"\r\n" + EGRESS_HEADER.encode() + b": 1\r\n"
                 b"Content-Type: text/plain; charset=utf-8\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
    with contextlib.suppress(OSError):
        await writer.drain()


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()


async def _pipe_both(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter,
                     u_reader: asyncio.StreamReader, u_writer: asyncio.StreamWriter) -> None:
    try:
        await asyncio.gather(_pipe(c_reader, u_writer), _pipe(u_reader, c_writer))
    finally:
        u_writer.close()
