"""A fake DNS resolver for the forwarder tests, and `FakeResolver` to run it and read its log.

As a script (`python fake_resolver.py ADDRESS PORT ANSWER`) it listens on UDP and TCP at
ADDRESS:PORT, writes one line to stdout per datagram and per TCP chunk it receives ("udp <hex>",
"tcp <hex>"; "tcp-open" when a connection is accepted) before it answers, and prints "ready" once
both sockets listen. It answers what looks like a query for type A with one A record ANSWER,
other types with an empty NOERROR answer, and only logs what it cannot parse or asks for a name
under `blackhole` (a zone whose servers never answer: the query waits upstream until it times out). Stdlib only;
`FakeResolver` runs it on the host or, with `own_netns`, in a new network namespace that its
process holds (`unshare --net`), gone with it.
"""

from __future__ import annotations

import queue
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Callable


BLACKHOLE = b"\x09blackhole\x00"


def reply(data: bytes, answer: str) -> bytes | None:
    if len(data) < 17 or BLACKHOLE in data:
        return None
    qid, _flags, qd = struct.unpack_from(">HHH", data)
    pos = 12
    while pos < len(data) and data[pos]:
        pos += 1 + data[pos]
    end = pos + 5
    if qd != 1 or end > len(data):
        return None
    qtype = struct.unpack_from(">H", data, pos + 1)[0]
    records = b""
    if qtype == 1:  # a name pointer to the question, A, IN, TTL 60, 4 bytes
        records = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(answer)
    return struct.pack(">HHHHHH", qid, 0x8180, 1, 1 if records else 0, 0, 0) + data[12:end] + records


def log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def serve_tcp(server: socket.socket, answer: str) -> None:
    while True:
        conn, _ = server.accept()
        log("tcp-open")
        with conn:
            buf = b""
            while chunk := conn.recv(65536):
                log(f"tcp {chunk.hex()}")
                buf += chunk
                while len(buf) >= 2 and len(buf) >= 2 + int.from_bytes(buf[:2], "big"):
                    size = int.from_bytes(buf[:2], "big")
                    out = reply(buf[2:2 + size], answer)
                    buf = buf[2 + size:]
                    if out is not None:
                        conn.sendall(len(out).to_bytes(2, "big") + out)


def main() -> None:
    address, port, answer = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, port))
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((address, port))
    tcp.listen(16)
    threading.Thread(target=serve_tcp, args=(tcp, answer), daemon=True).start()
    log("ready")
    while True:
        data, addr = udp.recvfrom(65536)
        log(f"udp {data.hex()}")
        out = reply(data, answer)
        if out is not None:
            udp.sendto(out, addr)


class FakeResolver:
    """The script above as a subprocess; `until` reads its log lines as they come."""

    def __init__(self, address: str, port: int = 53, answer: str = "203.0.113.77", own_netns: bool = False) -> None:
        # its own namespace's loopback up before it binds there
        netns = ["unshare", "--net", "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"'] if own_netns else []
        self.argv = [*netns, sys.executable, __file__, address, str(port), answer]
        self.lines: queue.Queue[str] = queue.Queue()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> FakeResolver:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()
        assert self.until(lambda line: line == "ready") == ["ready"]
        return self

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def until(self, found: Callable[[str], bool], timeout: float = 30) -> list[str]:
        """Every line logged from the last call on, up to the first one `found` accepts."""
        seen: list[str] = []
        while True:
            try:
                seen.append(self.lines.get(timeout=timeout))
            except queue.Empty:
                raise AssertionError(f"the resolver never logged the line waited for; it logged {seen}") from None
            if found(seen[-1]):
                return seen

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    main()
