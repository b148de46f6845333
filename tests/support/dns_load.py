"""Load on the DNS forwarder for the fairness tests (tests/sandbox/test_dns_fairness.py): a sample
that measures its lookups, and samples that flood. Stdlib only; run as a script in the clients'
network namespace, one sample per source address; both take commands on stdin and end at its end.

- `measure SERVER PORT SOURCE TIMEOUT`: for each line N, N queries for A records, one after the
  other, each waiting up to TIMEOUT seconds for its answer; prints a JSON list of the seconds each
  took (null: no answer in time).
- `flood SERVER PORT CONTROL KIND SOURCE[,SOURCE...]`: sends as fast as it can, in turn from every
  SOURCE, to SERVER:PORT after a line `server` and to CONTROL:9 (the discard port of its own
  loopback, where nothing listens) after a line `control`; prints "on" once it has sent 5,000
  datagrams after each. KIND `chaos`: class CH queries, which the forwarder refuses itself;
  `mixed`: those and queries for names under `blackhole`, which the fake resolver never answers
  (they hold the forwarder's upstream slots until they time out).
- `hold SERVER PORT COUNT SOURCE[,SOURCE...]`: COUNT TCP connections from each SOURCE, each with one
  class CH query answered (so the forwarder serves it), then prints "held" and keeps them open.
- `tcp SERVER PORT SOURCE`: one TCP connection and one query for an A record; prints "answered"
  or "closed".
"""

from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import time

ON = 5_000


def query(qid: int, labels: list[bytes], qclass: int = 1) -> bytes:
    name = b"".join(bytes((len(x),)) + x for x in labels) + b"\x00"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", 1, qclass)


def measure(server: tuple[str, int], source: str, timeout: float) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((source, 0))
    n = 0
    for line in sys.stdin:
        took: list[float | None] = []
        for _ in range(int(line)):
            n += 1
            qid = (os.getpid() + n) & 0xFFFF
            start = time.monotonic()
            sock.sendto(query(qid, [b"victim%d" % n, b"test"]), server)
            deadline = start + timeout
            got = None
            while (left := deadline - time.monotonic()) > 0:
                if not select.select([sock], [], [], left)[0]:
                    break
                data = sock.recv(4096)
                if len(data) >= 2 and struct.unpack_from(">H", data)[0] == qid:
                    got = time.monotonic() - start
                    break
            took.append(got)
        print(json.dumps(took), flush=True)


def flood(server: tuple[str, int], control: tuple[str, int], kind: str, sources: list[str]) -> None:
    socks = []
    for source in sources:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((source, 0))
        sock.setblocking(False)
        socks.append(sock)
    chaos = query(0x4348, [b"version", b"bind"], qclass=3)
    target, sent, n = None, 0, 0
    while True:
        if target is None or (n & 63 == 0 and select.select([sys.stdin], [], [], 0)[0]):
            line = sys.stdin.readline()
            if not line:
                return
            if line.strip() in ("server", "control"):
                target, sent = server if line.strip() == "server" else control, 0
        n += 1
        for i, sock in enumerate(socks):  # mixed: every source sends both kinds in turn
            payload = chaos if kind == "chaos" or (n + i) & 1 else query(n & 0xFFFF, [b"h%d-%d" % (n, i), b"blackhole"])
            try:
                sock.sendto(payload, target)
            except OSError:  # a full buffer, or the ICMP error of the control's closed port
                pass
        sent += len(socks)
        if ON <= sent < ON + len(socks):
            print("on", flush=True)


def framed_answer(sock: socket.socket, qid: int) -> bool:
    """Whether the answer read from `sock` is to the query `qid` (False: the connection closed)."""
    with sock.makefile("rb") as stream:
        size = stream.read(2)
        data = stream.read(int.from_bytes(size, "big")) if len(size) == 2 else b""
    return len(data) >= 2 and struct.unpack_from(">H", data)[0] == qid


def hold(server: tuple[str, int], count: int, sources: list[str]) -> None:
    held = []
    for source in sources:
        for i in range(count):
            sock = socket.create_connection(server, timeout=30, source_address=(source, 0))
            q = query(i, [b"version", b"bind"], qclass=3)
            sock.sendall(len(q).to_bytes(2, "big") + q)
            assert framed_answer(sock, i), "a held connection was not served"
            held.append(sock)
    print("held", flush=True)
    sys.stdin.read()


def tcp(server: tuple[str, int], source: str) -> None:
    try:
        with socket.create_connection(server, timeout=30, source_address=(source, 0)) as sock:
            q = query(0x7474, [b"tcp-victim", b"test"])
            sock.sendall(len(q).to_bytes(2, "big") + q)
            print("answered" if framed_answer(sock, 0x7474) else "closed", flush=True)
    except OSError:
        print("closed", flush=True)


if __name__ == "__main__":
    mode, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "measure":
        measure((host, port), sys.argv[4], float(sys.argv[5]))
    elif mode == "hold":
        hold((host, port), int(sys.argv[4]), sys.argv[5].split(","))
    elif mode == "tcp":
        tcp((host, port), sys.argv[4])
    else:
        flood((host, port), (sys.argv[4], 9), sys.argv[5], sys.argv[6].split(","))
