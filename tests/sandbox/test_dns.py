"""DNS carries DNS only: the samples' forwarder (sandbox/dns/forward.py), played as a hostile sample.

Before it, TCP and UDP to slirp's DNS address 10.0.2.3:53 reached the host's resolver as sent (an
HTTP request got an HTTP answer). The forwarder runs against a fake resolver (tests/support/
fake_resolver.py) that logs every byte it receives: in a test network namespace (made here,
with a veth pair, gone after), behind a root-mode bwrap sample's router, and behind a Podman
container. Non-DNS payloads over UDP and TCP never reach it; real queries do, and their answers
come back. The forwarder process holds no privilege and nothing of the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from tests.support.fake_resolver import FakeResolver
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.nettargets import net_admin_reason
from trajforge.sandbox.dns import forward as dns_forward
from trajforge.sandbox.dns import parse as wire
from trajforge.sandbox.dns import service as dns_service
from trajforge.sandbox.dns.service import DnsForwarder
from trajforge.sandbox.network import egress_support

needs_net_admin = pytest.mark.skipif(net_admin_reason() is not None, reason=net_admin_reason() or "")
SRC = Path(dns_service.SOURCE_ROOT)
HTTP = b"GET / HTTP/1.0\r\n\r\n"
RAW = b"raw udp payload \x00\xff for the host's resolver"
ANSWER = "203.0.113.77"


def query(label: bytes, qtype: int = 1, qclass: int = 1, qid: int = 0x5151) -> bytes:
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + bytes((len(label),)) + label + b"\x04test\x00" \
        + struct.pack(">HH", qtype, qclass)


def framed(data: bytes) -> bytes:
    return len(data).to_bytes(2, "big") + data


def recv_all(sock: socket.socket) -> bytes:
    """What the peer sends until it closes the connection (a reset counts as closed)."""
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    except TimeoutError:
        raise AssertionError(f"the forwarder kept the connection open after sending {got!r}") from None
    return got


def read_frame(stream: Any) -> bytes:
    """One length-prefixed DNS message from a TCP stream (a socket's makefile("rb"): two answers
    can arrive in one segment)."""
    size = stream.read(2)
    assert len(size) == 2, f"closed after {size!r}"
    data = stream.read(int.from_bytes(size, "big"))
    assert len(data) == int.from_bytes(size, "big"), f"closed after {data!r}"
    return data


def logged_queries(lines: list[str]) -> list[bytes]:
    return [bytes.fromhex(line.split(" ", 1)[1]) for line in lines if line.startswith(("udp ", "tcp "))]


def asked(label: bytes) -> Any:
    """A predicate on the resolver's log: a datagram asking for `label`.test."""
    wanted = bytes((len(label),)) + label + b"\x04test"
    return lambda line: line.startswith("udp ") and wanted in bytes.fromhex(line[4:])


def probe(addr: tuple[str, int], resolver: FakeResolver) -> tuple[list[str], dict[str, bytes]]:
    """A hostile sample's tries, then one real query over UDP and one over TCP: the resolver's log up
    to the last, and what the client got back."""
    got: dict[str, bytes] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        u.settimeout(10)
        for payload in (HTTP, RAW, query(b"junk") + b"trailing", query(b"ch", qclass=3)[:-3]):
            u.sendto(payload, addr)
        with socket.create_connection(addr, timeout=10) as t:
            t.sendall(HTTP)
            got["tcp http"] = recv_all(t)
        with socket.create_connection(addr, timeout=10) as t:
            t.sendall(framed(RAW))
            got["tcp raw"] = recv_all(t)
        u.sendto(query(b"ch", qclass=3), addr)  # CHAOS: refused by the forwarder itself
        got["refused"] = u.recv(4096)
        u.sendto(query(b"udp-probe"), addr)
        got["udp"] = u.recv(4096)
    with socket.create_connection(addr, timeout=10) as t:  # two queries in one write: answered in order
        t.sendall(framed(query(b"ch", qclass=3, qid=0x6161)) + framed(query(b"tcp-probe", qid=0x6262)))
        with t.makefile("rb") as stream:
            got["tcp refused"] = read_frame(stream)
            got["tcp"] = read_frame(stream)
    return resolver.until(asked(b"tcp-probe")), got


def assert_only_dns_reached(lines: list[str], got: dict[str, bytes]) -> None:
    assert [line.split(" ", 1)[0] for line in lines] == ["udp", "udp"], lines  # no TCP, two datagrams
    for data in logged_queries(lines):
        assert wire.encode_query(wire.parse_query(data)) == data  # each one a rebuilt query
    assert asked(b"udp-probe")(lines[0]) and asked(b"tcp-probe")(lines[1])
    assert got["tcp http"] == b"" and got["tcp raw"] == b""
    for key, qid in (("refused", 0x5151), ("tcp refused", 0x6161)):
        refused = struct.unpack_from(">HH", got[key])
        assert refused[0] == qid and refused[1] & 0x800F == 0x8000 | wire.REFUSED, got[key]
    for key, qid in (("udp", 0x5151), ("tcp", 0x6262)):  # the client's own ids, the resolver's answer
        assert struct.unpack_from(">H", got[key])[0] == qid and socket.inet_aton(ANSWER) in got[key], got[key]


@dataclass
class Lab:
    enter: list[str]  # nsenter's arguments to its network namespace
    address: str  # the forwarder's side of the veth, where the test (the client) sends
    resolver: FakeResolver


@contextlib.contextmanager
def lab() -> Iterator[Lab]:
    """A test network namespace, held by the fake resolver's process (listening on its loopback,
    where only a forwarder in there can reach it) and joined to this one by a veth pair on a /30
    of 198.18.0.0/16 (benchmark addresses); gone with that process. Not `ip netns add`: a name in
    /run/netns lost its mount now and then while another test suite ran on the machine (2 of 500
    tries of a shell loop doing nothing else), and the namespace with it."""
    tag = secrets.token_hex(3)
    host_if, ns_if = f"tfdh{tag}", f"tfdn{tag}"
    base = 4 * secrets.randbelow(1 << 14)
    host_ip, ns_ip = (f"198.18.{base >> 8}.{(base & 255) + k}" for k in (1, 2))
    with FakeResolver("127.0.0.53", 53, ANSWER, own_netns=True) as resolver:
        enter = ["-t", str(resolver.pid), "-n"]
        try:
            pid = str(resolver.pid)
            for argv in (["ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if, "netns", pid],
                         ["ip", "addr", "add", f"{host_ip}/30", "dev", host_if], ["ip", "link", "set", host_if, "up"],
                         ["nsenter", *enter, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if],
                         ["nsenter", *enter, "ip", "link", "set", ns_if, "up"]):
                res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
                assert res.returncode == 0, (argv, res.stderr)
            yield Lab(enter, ns_ip, resolver)
        finally:
            subprocess.run(["ip", "link", "del", host_if], check=False, capture_output=True, timeout=30)


@contextlib.asynccontextmanager
async def forwarder(where: Lab, source_root: Path = SRC) -> AsyncIterator[DnsForwarder]:
    fwd = await DnsForwarder.start(where.enter, listen=(where.address, dns_service.PORT),
                                   upstream=("127.0.0.53", 53), source_root=str(source_root))
    try:
        yield fwd
    finally:
        await fwd.close()


@needs_net_admin
def test_only_rebuilt_queries_reach_the_resolver_and_their_answers_come_back() -> None:
    async def main() -> None:
        with lab() as where:
            async with forwarder(where) as fwd:
                lines, got = await asyncio.to_thread(probe, (where.address, dns_service.PORT), where.resolver)
                assert_only_dns_reached(lines, got)
                assert fwd.alive  # nothing it read made it fail (an import after its start would)

    asyncio.run(main())


@needs_net_admin
def test_one_client_holds_a_bounded_number_of_tcp_connections() -> None:
    async def main() -> None:
        with lab() as where:
            async with forwarder(where):
                addr = (where.address, dns_service.PORT)
                held = [socket.create_connection(addr, timeout=10)
                        for _ in range(dns_forward.CONNECTIONS_PER_CLIENT)]
                try:
                    # closed at once, well before the idle timeout would close it
                    with socket.create_connection(addr, timeout=dns_forward.IDLE_TIMEOUT / 2) as extra:
                        assert recv_all(extra) == b""
                    held[0].sendall(framed(query(b"held", qid=0x7171)))  # the ones held still work
                    with held[0].makefile("rb") as stream:
                        assert socket.inet_aton(ANSWER) in read_frame(stream)
                finally:
                    for sock in held:
                        sock.close()

    asyncio.run(main())


def mutant_copy(root: Path) -> Path:
    """A copy under `root` of what the forwarder loads, for a test to change (readable by its id)."""
    for rel in ("__init__.py", "sandbox/__init__.py", "sandbox/inside/__init__.py", "sandbox/inside/guard.py",
                "sandbox/dns/__init__.py", "sandbox/dns/parse.py", "sandbox/dns/fair.py", "sandbox/dns/launch.py",
                "sandbox/dns/forward.py"):
        rel = f"trajforge/{rel}"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SRC / rel, root / rel)
    for d in (root, *root.rglob("*")):  # the forwarder's own id reads it
        d.chmod(0o755 if d.is_dir() else 0o644)
    return root


def mutant_source(root: Path) -> Path:
    """A copy of the forwarder's source that also relays what it receives, unparsed, upstream."""
    forward = mutant_copy(root) / "trajforge/sandbox/dns/forward.py"
    text = forward.read_text()
    udp = "    def _datagram(self, client: str, data: bytes, addr: tuple[str, int]) -> None:\n"
    tcp = "                q = wire.parse_query(data)\n"
    assert text.count(udp) == 1 and text.count(tcp) == 1, "the mutation's anchors moved: update mutant_source"
    text = text.replace(udp, udp + "        self.upstreams[0].sendto(data)\n")
    text = text.replace(tcp, "                self.upstreams[0].sendto(data)\n" + tcp)
    forward.write_text(text)
    return root


@needs_net_admin
def test_the_probe_fails_a_forwarder_that_relays_bytes_unparsed(tmp_path: Path) -> None:
    async def main() -> None:
        with lab() as where:
            async with forwarder(where, mutant_source(tmp_path / "src")):
                lines, got = await asyncio.to_thread(probe, (where.address, dns_service.PORT), where.resolver)
        with pytest.raises(AssertionError):
            assert_only_dns_reached(lines, got)
        assert HTTP in logged_queries(lines) and RAW in logged_queries(lines)

    asyncio.run(main())


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: " ".join(v.split()) for k, v in (line.split(":", 1) for line in lines if ":" in line)}


@needs_net_admin
def _only_the_way_to(view: Path, name: str, kept: list[Path]) -> None:
    """The host directory `name` is in the view only as the way to a kept path: each directory on
    that way holds the next step and nothing else."""
    ways = [p for p in kept if p.parts[1] == name]
    assert ways, f"/{name} of the host is in the forwarder's view"
    for way in ways:
        for depth in range(2, len(way.parts)):
            steps = {p.parts[depth] for p in ways if p.parts[:depth] == way.parts[:depth] and len(p.parts) > depth}
            assert set(os.listdir(view.joinpath(*way.parts[1:depth]))) == steps, (way, depth)


def test_the_forwarder_holds_no_privilege_and_nothing_of_the_host() -> None:
    async def main() -> None:
        with lab() as where:
            async with forwarder(where) as fwd:
                pid, uid = fwd.pid, fwd.uid
                st = status_of(pid)
                assert st["Uid"] == st["Gid"] == " ".join([str(uid)] * 4) and uid != 0  # real, effective, saved, fs
                assert st["Groups"] == "" and st["NoNewPrivs"] == "1"
                for caps in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
                    assert st[caps] == "0" * 16, (caps, st[caps])
                assert os.stat(f"/proc/{pid}/status").st_uid == 0  # not dumpable: its /proc is root's
                fds = {fd: os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
                assert fds and all(target.startswith("socket:[") for target in fds.values()), fds
                assert "0" not in fds or fds["0"].startswith("socket:[")  # stdin/out/err closed (or reused by sockets)
                assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(f"/proc/{where.resolver.pid}/ns/net").st_ino
                assert Path(f"/proc/{pid}/environ").read_bytes() == b""
                assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-I", b"-S"]
                limits = Path(f"/proc/{pid}/limits").read_text()
                assert [line.split()[2:4] for line in limits.splitlines() if line.startswith("Max processes")] \
                    == [["0", "0"]]
                # Its own mount namespace: an empty read-only root with the interpreter, the system's
                # libraries and its source, nothing else of the host (no /home, /tmp, /proc, /etc ...).
                assert os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino
                top = set(os.listdir(f"/proc/{pid}/root"))
                kept_paths = [Path(p) for p in (sys.base_prefix, dns_service.SOURCE_ROOT)]
                kept = {p.parts[1] for p in kept_paths}
                assert top <= {"usr", "lib", "lib64", "lib32", "libx32", "etc"} | kept, top
                assert set(os.listdir(f"/proc/{pid}/root/etc")) <= {"ld.so.cache"}
                for name in ("tmp", "proc", "home", "dev"):
                    if name in top:  # only as the way to a kept path (a checkout under /tmp, say)
                        _only_the_way_to(Path(f"/proc/{pid}/root"), name, kept_paths)
                lo, span = dns_service.FORWARDER_IDS
                assert lo <= uid < lo + span

    asyncio.run(main())


def test_forwarder_ids_are_no_sample_s() -> None:
    from trajforge.sandbox.backends.bwrap import sandbox_pool
    from trajforge.sandbox.backends.container import container_backend
    from trajforge.sandbox.backends.container.container_argv import ID_RANGE

    lo, span = dns_service.FORWARDER_IDS
    containers_end = container_backend.ID_LOW + container_backend._ID_SLOTS * ID_RANGE
    assert containers_end <= lo and lo + span <= sandbox_pool._UID_BASE  # bwrap samples' ids come after


@needs_net_admin
def test_the_forwarder_ends_when_its_runner_dies() -> None:
    """The runner's end of the control socket closes with it, even on SIGKILL: nothing is left."""
    with lab() as where:
        code = ("import asyncio, sys\nfrom trajforge.sandbox.dns.service import DnsForwarder\n"
                "async def main():\n"
                f"    fwd = await DnsForwarder.start({where.enter!r}, listen=('{where.address}', 5300),"
                " upstream=('127.0.0.53', 53))\n"
                "    print(fwd.pid, flush=True)\n    sys.stdin.read()\n"
                "asyncio.run(main())\n")
        runner = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
        try:
            assert runner.stdout is not None
            pid = int(runner.stdout.readline())
            watch = os.pidfd_open(pid)
        finally:
            runner.send_signal(signal.SIGKILL)
            runner.wait()
        try:
            assert select.select([watch], [], [], 30)[0] == [watch]  # readable once the process exited
        finally:
            os.close(watch)


def test_the_forwarder_loads_no_code_after_its_start() -> None:
    """Only its own modules come with it from trajforge, and once sealed an import raises."""
    boot = ("import os, sys; sys.path.append(sys.argv[1]); from trajforge.sandbox.dns import forward\n"
            "names = sorted(m for m in sys.modules if m.startswith('trajforge'))\n"
            "w = os.dup(1); os.write(w, repr(names).encode() + b'\\n'); forward._seal()\n"
            "try:\n    import json\nexcept ImportError as e:\n    os.write(w, str(e).encode())\n")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", boot, str(SRC)], check=False, capture_output=True,
                         text=True, timeout=60)
    names, refused = out.stdout.split("\n", 1)
    assert names == ("['trajforge', 'trajforge.sandbox', 'trajforge.sandbox.dns', 'trajforge.sandbox.dns.fair', "
                     "'trajforge.sandbox.dns.forward', "
                     "'trajforge.sandbox.dns.parse', 'trajforge.sandbox.inside', 'trajforge.sandbox.inside.guard']")
    assert "loads no module after its start ('json' refused)" in refused, out


def test_a_slot_s_dns_goes_to_the_forwarder_and_never_on_to_tap0() -> None:
    from trajforge.sandbox.host.router import router_ruleset

    port = dns_service.PORT
    router = router_ruleset(host_addrs=["192.0.2.2"])
    assert f'iifname "s*" ip daddr 10.0.2.3 udp dport 53 redirect to :{port}' in router
    assert f'iifname "s*" ip daddr 10.0.2.3 tcp dport 53 redirect to :{port}' in router
    assert "dport 53 accept" not in router  # before: slots' UDP and TCP to 10.0.2.3:53 went on to tap0
    assert f'iifname "s*" ct status dnat udp dport {port} accept' in router


def test_a_container_s_dns_goes_to_its_forwarder_and_only_the_forwarder_s_to_slirp() -> None:
    from trajforge.sandbox.network import ruleset

    port = dns_service.PORT
    container = ruleset()
    assert f"ip daddr 10.0.2.3 tcp dport 53 redirect to :{port}" in container
    mark = f"meta mark {dns_service.MARK:#x}"
    assert [line.strip() for line in container.splitlines() if "dport 53 accept" in line] == \
        [f"{mark} ip daddr 10.0.2.3 udp dport 53 accept"]  # the forwarder's own queries only
    assert container.index(f"{mark} return") < container.index("redirect to")


EGRESS = asyncio.run(egress_support("bwrap"))

SAMPLE_PROBE = r"""
import socket, struct, subprocess
def q(label, qid):
    head = struct.pack(">HHHHHH", qid, 0x100, 1, 0, 0, 0)
    return head + bytes((len(label),)) + label + b"\x04test\x00\x00\x01\x00\x01"
t = socket.create_connection(("10.0.2.3", 53), timeout=10)
t.sendall(b"GET / HTTP/1.0\r\n\r\n")
try:
    print("tcp-http", repr(t.recv(4096)))
except (ConnectionResetError, TimeoutError) as e:
    print("tcp-http", type(e).__name__)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(3)
u.sendto(b"raw udp payload for the host's resolver", ("10.0.2.3", 53))
try:
    print("udp-raw", repr(u.recv(4096)))
except TimeoutError:
    print("udp-raw timeout")
try:
    u.sendto(q(b"direct", 7), (UPSTREAM, 53))  # the resolver's own address: not for samples
    print("direct", repr(u.recv(4096)))
except OSError as e:
    print("direct", type(e).__name__)
found = subprocess.run(["getent", "ahostsv4", "probe.trajforge.test"], capture_output=True, text=True).stdout
print("getent", found.split()[:1])
t = socket.create_connection(("10.0.2.3", 53), timeout=10)
t.sendall(len(q(b"tcp-probe", 9)).to_bytes(2, "big") + q(b"tcp-probe", 9))
f = t.makefile("rb")
n = int.from_bytes(f.read(2), "big")
print("tcp-dns", f.read(n).hex())
"""


@contextlib.contextmanager
def resolver_on_host() -> Iterator[tuple[str, FakeResolver]]:
    """The fake resolver at a private address on the host's `lo`: reached through slirp, like the
    host's own resolver, and an address no sample may reach itself."""
    ip = f"10.231.53.{1 + secrets.randbelow(250)}"
    subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True, timeout=30)
    try:
        with FakeResolver(ip, 53, ANSWER) as resolver:
            yield ip, resolver
    finally:
        subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], check=False, timeout=30)


def forwarders() -> list[int]:
    """This process's children that are DNS forwarders (they name themselves tf-dns)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            name, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if name == "tf-dns" and int(rest[1]) == os.getpid() and rest[0] != "Z":
                found.append(int(entry.name))
    return found


def assert_sample_got_only_dns(out: str, lines: list[str]) -> None:
    assert "tcp-http b''" in out or "tcp-http ConnectionResetError" in out, out
    assert "udp-raw timeout" in out and "direct b" not in out, out
    assert f"getent ['{ANSWER}']" in out, out  # glibc's resolver, through the forwarder
    assert "tcp-dns 0009" in out and socket.inet_aton(ANSWER).hex() in out, out
    assert lines and not any(line.startswith(("tcp", "tcp-open")) for line in lines), lines
    for data in logged_queries(lines):
        assert wire.encode_query(wire.parse_query(data)) == data and b"probe" in data, data


@pytest.mark.skipif(not EGRESS.usable, reason=f"egress not available here: {EGRESS.detail}")
@needs_net_admin
def test_a_bwrap_sample_resolves_through_the_forwarder_and_sends_the_resolver_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
    from trajforge.sandbox.host import router

    async def main(ip: str, resolver: FakeResolver) -> None:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS)
        await sb.start()
        try:
            res = await sb.exec(f"python3 - <<'EOF'\nUPSTREAM = {ip!r}\n{SAMPLE_PROBE}\nEOF", timeout=120)
            [pid] = forwarders()
            # the interfaces of its network namespace: the router's (slirp's tap0, the slots' links)
            links = [line.split(":")[0].strip() for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]]
            assert "tap0" in links and "eth0" not in links, links
            assert any(name[0] == "s" and name[1:].isdigit() for name in links), links
            st = status_of(pid)
            assert st["CapEff"] == st["CapBnd"] == "0" * 16 and st["NoNewPrivs"] == "1" and st["Uid"] != "0 0 0 0"
        finally:
            await sb.close()
        assert_sample_got_only_dns(res.stdout + res.stderr, resolver.until(asked(b"tcp-probe")))
        assert forwarders() == []  # gone with the run's router

    with resolver_on_host() as (ip, resolver):
        monkeypatch.setattr(router, "DNS_UPSTREAM", (ip, 53))  # the forwarder asks it, through slirp
        asyncio.run(main(ip, resolver))


@needs_net_admin
def test_a_container_sample_resolves_through_its_forwarder_and_sends_the_resolver_nothing_else(
        tmp_path: Path, busybox_image: str, podman: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The busybox image has no Python: nc and nslookup play the sample. The resolver's private
    address is refused to the sample and open to the forwarder's marked sockets only."""
    from tests.support.sandboxes import create_sandbox
    from trajforge.config import RunConfig
    from trajforge.sandbox import network

    cfg = RunConfig(container_engine="podman", run_name=f"dnstest-{os.getpid()}", sandbox_network="egress")
    script = ("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 10.0.2.3 53; echo nc=$?; "
              "nslookup direct.test {ip}; echo direct=$?; nslookup probe.trajforge.test 10.0.2.3")

    async def main(ip: str, resolver: FakeResolver) -> None:
        sb = await create_sandbox(cfg, cwd=None, image=busybox_image, root=tmp_path)
        try:
            pid = sb.dns.pid  # type: ignore[attr-defined]
            assert status_of(pid)["CapEff"] == "0" * 16 and status_of(pid)["NoNewPrivs"] == "1"
            res = await sb.exec(script.format(ip=ip), timeout=120)
        finally:
            await sb.close()
        out = res.stdout + res.stderr
        assert "HTTP" not in out and "nc=" in out, out
        assert "direct=1" in out and "Operation not permitted" in out, out  # the private address: refused
        assert f"Address: {ANSWER}" in out, out
        lines = resolver.until(lambda line: line.startswith("udp ") and b"\x05probe" in bytes.fromhex(line[4:]))
        assert not any(line.startswith(("tcp", "tcp-open")) for line in lines), lines
        for data in logged_queries(lines):
            assert wire.encode_query(wire.parse_query(data)) == data, data
        with pytest.raises(ProcessLookupError):  # closed with its container
            os.kill(pid, 0)

    with resolver_on_host() as (ip, resolver):
        monkeypatch.setattr(network, "DNS_UPSTREAM", (ip, 53))
        asyncio.run(main(ip, resolver))
