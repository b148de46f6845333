"""The samples' DNS forwarder: the process behind their resolver address in egress mode.

It runs in the network namespace it serves (the run's router, or a container's), as an id of
its own with no capability and no_new_privs, seeing no host file but its read-only runtime
(launch.py), not dumpable, without fork or file writes (its rlimits), in an interpreter started
with `-I -S` that imported all it needs before `main` seals it: the helpers' import seal
(inside/guard.py) refuses any later import, stdin/stdout/stderr are closed, and the only
descriptors left are the sockets it was handed (a UDP and a TCP listener, UDP sockets connected
to the upstream resolver, the control socket) and the event loop's own socket pair (a poll
selector: no epoll descriptor). It opens nothing after that but the TCP connections it accepts,
and exits when the control socket closes.

Each query is first counted against its client's rate (fair.py: one client per sample address;
beyond the rate it is dropped unread, and a TCP connection carrying it closed). Datagrams are read
until the socket is empty into their clients' queues and handled round robin between clients.
Each is parsed (parse.py): what is not a standard query goes nowhere (a TCP connection carrying it
is closed), a query samples may not ask is answered REFUSED here, and any other goes upstream if
its client has an upstream slot (else it is dropped: UDP clients retry; TCP ones get SERVFAIL),
rebuilt from its parts under a fresh random id on a random upstream socket. A reply goes back
under the client's id once it is checked to answer that question. Upstream is always UDP: TCP
clients get framed DNS both ways, their answers fetched over UDP (with the largest EDNS size when
they sent EDNS; an answer still truncated there reaches them so). Bounds: fair.py's rate, queue
and upstream slots per client and in all, TCP connections in all and per client, queries per
connection, idle and answer timeouts, the sizes of parse.py.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import resource
import selectors
import socket
import sys
import time
from collections.abc import Callable

from trajforge.sandbox.dns import parse as wire
from trajforge.sandbox.dns.fair import FairShare, heavier
from trajforge.sandbox.inside import guard

ANSWER_TIMEOUT = 5.0  # an unanswered query is forgotten (UDP clients retry; TCP ones get SERVFAIL)
IDLE_TIMEOUT = 10.0  # a TCP client that sends nothing for this long is closed
MAX_CONNECTIONS, CONNECTIONS_PER_CLIENT, QUERIES_PER_CONNECTION = 128, 8, 64
READ_BATCH, WORK_BATCH = 1024, 64  # datagrams read, and handled, before the loop turns to its other work
SWEEP_EVERY = 10.0  # seconds between two sweeps of idle clients' state (fair.FairShare.forget_idle)
_PR_SET_DUMPABLE, _PR_SET_NAME = 4, 15

Deliver = Callable[["bytes | None"], None]


class _Pending:
    __slots__ = ("client", "client_id", "deliver", "sent", "timer")

    def __init__(self, sent: wire.Query, client_id: int, client: str, deliver: Deliver) -> None:
        self.sent, self.client_id, self.client, self.deliver = sent, client_id, client, deliver
        self.timer: asyncio.TimerHandle | None = None


class Forwarder:
    """The queries in flight, keyed by (upstream socket, upstream id), and each client's share."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.pending: dict[tuple[int, int], _Pending] = {}
        self.fair: FairShare[tuple[bytes, tuple[str, int]]] = FairShare()
        self.connections: dict[str, dict[asyncio.StreamWriter, None]] = {}  # each client's, oldest first
        self.upstreams: list[asyncio.DatagramTransport] = []
        self.server: asyncio.Server | None = None
        self.udp: socket.socket | None = None
        self._working = False

    async def open(self, udp: socket.socket, tcp: socket.socket, upstreams: list[socket.socket]) -> None:
        for i, sock in enumerate(upstreams):
            transport, _ = await self.loop.create_datagram_endpoint(lambda i=i: _Upstream(self, i), sock=sock)
            self.upstreams.append(transport)
        udp.setblocking(False)
        self.udp = udp
        self.loop.add_reader(udp.fileno(), self._read)
        self.server = await asyncio.start_server(self.tcp_client, sock=tcp, limit=wire.MAX_QUERY + 2)
        self._forget_idle()

    def _forget_idle(self) -> None:
        self.fair.forget_idle(time.monotonic())
        self.loop.call_later(SWEEP_EVERY, self._forget_idle)

    def admit(self, client: str) -> bool:
        """Whether a TCP query of `client` is within its rate (fair.py); False: drop it unread."""
        return self.fair.admit(client, time.monotonic())

    def _read(self) -> None:
        """The UDP socket is readable: read it empty (up to READ_BATCH) into the clients' queues."""
        assert self.udp is not None
        now = time.monotonic()
        for _ in range(READ_BATCH):
            try:
                data, addr = self.udp.recvfrom(wire.MAX_QUERY + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                continue  # an ICMP error of an earlier reply
            client = addr[0]
            if self.fair.admit(client, now):
                self.fair.put(client, (data, addr), now)  # a full queue drops its oldest: the client retries
        if not self._working and self.fair.ring:
            self._working = True
            self.loop.call_soon(self._work)

    def _work(self) -> None:
        """Handle up to WORK_BATCH queued datagrams round robin, then let the loop read again."""
        for _ in range(WORK_BATCH):
            turn = self.fair.take()
            if turn is None:
                break
            client, (data, addr) = turn
            self._datagram(client, data, addr)
        if self.fair.ring:
            self.loop.call_soon(self._work)
        else:
            self._working = False

    def _datagram(self, client: str, data: bytes, addr: tuple[str, int]) -> None:
        try:
            q = wire.parse_query(data)
        except wire.Malformed:
            return
        if wire.refusal(q) is not None:
            self._reply(wire.answer(q, wire.REFUSED), addr)
            return
        self.ask(q, client, lambda reply: self._reply(reply, addr), tcp=False)

    def _reply(self, reply: bytes | None, addr: tuple[str, int]) -> None:
        if reply is not None and self.udp is not None:
            try:
                self.udp.sendto(reply, addr)
            except OSError:  # a full send buffer: the client retries
                pass

    def ask(self, q: wire.Query, client: str, deliver: Deliver, *, tcp: bool) -> None:
        """Send `q` upstream if its client has a slot; `deliver` gets the checked reply (client's
        id), or None when it ends unanswered (no slot, timed out, or its slot taken)."""
        may, free = self.fair.slot(client)
        if not may:
            deliver(None)
            return
        if free is not None:  # the heaviest client's oldest query gives its slot up
            self._finish(free, None)  # type: ignore[arg-type]  (a key of self.pending)
        while True:
            rnd = int.from_bytes(os.urandom(3), "big")
            key = (rnd >> 16) % len(self.upstreams), rnd & 0xFFFF
            if key not in self.pending:
                break
        entry = _Pending(wire.for_upstream(q, key[1], tcp=tcp), q.id, client, deliver)
        entry.timer = self.loop.call_later(ANSWER_TIMEOUT, self._finish, key, None)
        self.pending[key] = entry
        self.fair.sent(client, key)
        self.upstreams[key[0]].sendto(wire.encode_query(entry.sent))

    def from_upstream(self, index: int, data: bytes) -> None:
        entry = self.pending.get((index, data[0] << 8 | data[1])) if len(data) >= 2 else None
        if entry is None:
            return
        try:
            wire.check_reply(data, entry.sent)
        except wire.Malformed:
            return  # the real reply may still come; the timer ends the wait otherwise
        self._finish((index, entry.sent.id), wire.with_id(data, entry.client_id))

    def _finish(self, key: tuple[int, int], reply: bytes | None) -> None:
        entry = self.pending.pop(key, None)
        if entry is None:
            return
        if entry.timer is not None:
            entry.timer.cancel()
        self.fair.done(entry.client, key)
        entry.deliver(reply)

    async def tcp_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        client = str(peer[0]) if peer else ""
        held = self.connections.setdefault(client, {})
        if len(held) < CONNECTIONS_PER_CLIENT and sum(map(len, self.connections.values())) >= MAX_CONNECTIONS:
            top = heavier({c: len(h) for c, h in self.connections.items()}, client)
            if top is not None:  # the heaviest client's oldest connection gives its place up
                oldest = next(iter(self.connections[top]))
                del self.connections[top][oldest]
                oldest.transport.abort()
        if len(held) >= CONNECTIONS_PER_CLIENT or sum(map(len, self.connections.values())) >= MAX_CONNECTIONS:
            if not held:
                del self.connections[client]
            writer.transport.abort()
            return
        held[writer] = None
        try:
            for _ in range(QUERIES_PER_CONNECTION):
                async with asyncio.timeout(IDLE_TIMEOUT):
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    if size > wire.MAX_QUERY:  # "GE" of an HTTP request: 18,245 bytes
                        break
                    data = await reader.readexactly(size)
                if not self.admit(client):
                    break  # over its rate: closed, as a datagram would be dropped
                q = wire.parse_query(data)
                reply = await self._tcp_answer(q, client)
                writer.write(len(reply).to_bytes(2, "big") + reply)
                async with asyncio.timeout(IDLE_TIMEOUT):
                    await writer.drain()
        except (wire.Malformed, asyncio.IncompleteReadError, TimeoutError, OSError):
            pass
        finally:
            held.pop(writer, None)  # (gone already if it gave its place up)
            if not held and self.connections.get(client) is held:
                del self.connections[client]
            writer.close()  # after what is written (unread input makes it a reset)

    async def _tcp_answer(self, q: wire.Query, client: str) -> bytes:
        if wire.refusal(q) is not None:
            return wire.answer(q, wire.REFUSED)
        got: asyncio.Future[bytes | None] = self.loop.create_future()
        self.ask(q, client, lambda r: got.done() or got.set_result(r), tcp=True)
        return await got or wire.answer(q, wire.SERVFAIL)


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, fwd: Forwarder, index: int) -> None:
        self.fwd, self.index = fwd, index

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.fwd.from_upstream(self.index, data)

    def error_received(self, exc: Exception) -> None:
        pass  # an ICMP error on the connected socket: the timers end the waits


def _harden() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)  # exec made it dumpable again (its uids are equal)
    libc.prctl(_PR_SET_NAME, b"tf-dns", 0, 0, 0)
    for limit, value in ((resource.RLIMIT_NPROC, 0), (resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_NOFILE, 256), (resource.RLIMIT_AS, 512 << 20)):
        resource.setrlimit(limit, (value, value))  # no fork, no thread, no file written


def _seal() -> None:
    """Nothing it reads can make it load code (the helpers' import seal), nor write to 0-2."""
    guard.seal()
    for fd in (0, 1, 2):
        try:
            os.close(fd)
        except OSError:
            pass
    for name in ("stdin", "stdout", "stderr", "__stdin__", "__stdout__", "__stderr__"):
        setattr(sys, name, None)  # nothing writes to descriptors 0-2, which sockets take next


def main(argv: list[str]) -> None:
    """argv: the descriptors of the control socket, the UDP and TCP listeners and the upstreams."""
    control, udp, tcp, *upstreams = (socket.socket(fileno=int(fd)) for fd in argv)
    _harden()
    loop = asyncio.SelectorEventLoop(selectors.PollSelector())
    asyncio.set_event_loop(loop)
    loop.set_exception_handler(lambda _loop, _context: None)
    loop.run_until_complete(Forwarder(loop).open(udp, tcp, upstreams))
    _seal()
    control.sendall(b"ready\n")
    control.setblocking(False)
    loop.run_until_complete(loop.sock_recv(control, 1))  # b"" when the runner closes its end or dies
    os._exit(0)
