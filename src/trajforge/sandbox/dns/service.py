"""Starting and stopping a DNS forwarder (forward.py) for samples in egress mode, and the kernel's
share of its fairness (`admission_rules`).

One per run in the router namespace (host/router.py), one per container with Podman's network
(network.py). The runner starts it through nsenter into the namespace it serves and the root
launcher (launch.py), with an id of its own drawn at random from [1.7e9, 1.8e9): no account
and no sample has one there (bwrap samples' ids start at 1.8e9, containers' id maps end below
1.7e9), so no process but itself can signal it. The runner keeps one end of a socket pair:
"ready" (or the launcher's error) comes back on it, and closing it, or the runner's death, ends
the forwarder. Its start is two interpreter starts: once per run for bwrap, once per container
for Podman (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from trajforge.sandbox.dns.fair import BURST, RATE
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.process import SAFE_PATH, tool_path

FORWARDER_IDS = (1_700_000_000, 100_000_000)  # first id, how many
MARK = 0x74660035  # SO_MARK of the forwarder's upstream sockets ("tf", 53)
PORT = 5300  # where the forwarder listens: samples' port 53 is redirected there (unprivileged: no capability to bind)
UPSTREAM_SOCKETS = 4
CONNECT_RATE, CONNECT_BURST = 20, 40  # new TCP connections to the forwarder a second per sample, and at once
START_TIMEOUT = 10.0
LAUNCH = ("import sys; sys.path.append(sys.argv[1]); "
          "from trajforge.sandbox.dns.launch import main; main(sys.argv[1:])")
SOURCE_ROOT = str(Path(__file__).resolve().parents[3])  # holds the trajforge package


def admission_rules(hook: str, match: str, address: str, port: int) -> list[str]:
    """Lines of an `inet` nftables table that drop, per sending address, DNS datagrams beyond the
    forwarder's own per-client rate (fair.py) and new TCP connections beyond CONNECT_RATE, on the
    `hook` (prerouting: from other namespaces; output: from this one) of packets to `address`:`port`
    that `match` selects. Before conntrack (priority raw) and before they reach the forwarder's
    socket: a socket one sample fills loses every other sample's datagrams, and dropping here costs
    the sending sample's own CPU, not the forwarder's. The forwarder's own queries upstream (its
    SO_MARK) pass."""
    sets = {"dns_datagrams": (f"udp dport {port}", RATE, BURST),
            "dns_connections": (f"tcp dport {port} tcp flags & (syn | ack) == syn", CONNECT_RATE, CONNECT_BURST)}
    lines = [f"  set {name} {{ type ipv4_addr; size 65535; flags dynamic,timeout; timeout 1m; }}" for name in sets]
    lines += ["  chain dns_admission {", f"    type filter hook {hook} priority raw; policy accept;",
              f"    meta mark {MARK:#x} return"]
    lines += [f"    {match}ip daddr {address} {what} update @{name} {{ ip saddr limit rate over {rate:g}/second "
              f"burst {burst} packets }} drop" for name, (what, rate, burst) in sets.items()]
    return [*lines, "  }"]


class DnsForwarder:
    def __init__(self, proc: asyncio.subprocess.Process, control: socket.socket, uid: int) -> None:
        self.proc, self.control, self.uid = proc, control, uid

    @classmethod
    async def start(cls, enter: Sequence[str], *, listen: tuple[str, int], upstream: tuple[str, int],
                    source_root: str = SOURCE_ROOT) -> DnsForwarder:
        """A forwarder in the network namespace that `nsenter` reaches with `enter` (e.g.
        ["--net=PATH"]), listening on `listen` (UDP and TCP), asking `upstream` over UDP."""
        nsenter = tool_path("nsenter")
        if nsenter is None:
            raise SandboxError("the DNS forwarder needs nsenter (apt-get install util-linux)")
        uid = FORWARDER_IDS[0] + secrets.randbelow(FORWARDER_IDS[1])
        ours, theirs = socket.socketpair()
        errors = tempfile.TemporaryFile()  # read only when the start fails
        try:
            proc = await asyncio.create_subprocess_exec(
                nsenter, *enter, "--", sys.executable, "-I", "-S", "-c", LAUNCH, source_root, str(theirs.fileno()),
                str(uid), listen[0], str(listen[1]), upstream[0], str(upstream[1]), str(MARK), str(UPSTREAM_SOCKETS),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=errors,
                pass_fds=(theirs.fileno(),), start_new_session=True, env={"PATH": SAFE_PATH}, cwd="/")
        except BaseException:
            ours.close()
            errors.close()
            raise
        finally:
            theirs.close()
        fwd = cls(proc, ours, uid)
        with errors:
            ours.setblocking(False)
            try:
                async with asyncio.timeout(START_TIMEOUT):
                    said = await asyncio.get_running_loop().sock_recv(ours, 4096)
            except TimeoutError:
                said = b""
            except BaseException:
                await fwd.close()
                raise
            if said != b"ready\n":
                await fwd.close()
                errors.seek(0)
                why = (said or errors.read()[-300:]).decode(errors="replace").strip()
                raise SandboxError(f"the DNS forwarder did not start: {why or 'no output'}")
        return fwd

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None

    async def close(self) -> None:
        self.control.close()  # the forwarder exits when it sees this end close
        if self.proc.returncode is None:
            try:
                async with asyncio.timeout(2):
                    await self.proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
