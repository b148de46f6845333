"""No sample starves another's DNS: the forwarder's fair shares (sandbox/dns/fair.py) under floods.

Before them, one sample sending class-CH queries from four processes took another sample's
lookups from 48 answered a second (at most 12 ms each) to 1-4 (500 ms timeouts), and the forwarder
burned CPU outside the flooding sample's cgroup. Here the forwarder runs as in a run's router,
against the fake resolver, in a test network namespace; the samples are source addresses of a
second namespace joined to it by a veth pair, and the flooding ones run in a cgroup with a
sample's CPU share. One sample's lookups are measured twice: while the flooding processes send
the same datagrams to their own loopback (the control: the same CPU taken from a shared machine),
then while they flood the forwarder. The bound is the issue's 50 ms, or three times what the
lookups took in the control if that is more. The kernel's part of the fairness
(service.admission_rules) is loaded in the forwarder's namespace as the router loads it; the
mutation checks take it out, and take the forwarder's per-client shares out, and the measurement
fails each time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.sandbox.test_dns import ANSWER, SRC, Lab, forwarder, needs_net_admin
from tests.support.fake_resolver import FakeResolver
from trajforge.sandbox.dns import fair
from trajforge.sandbox.dns import service as dns_service
from trajforge.sandbox.host import cgroups

LOAD = str(Path(__file__).resolve().parents[1] / "support" / "dns_load.py")
SERVER = "198.18.0.1"  # the forwarder's side of the veth: both ends are in namespaces of the test's own
CONTROL = "127.0.0.1"  # where the flooding processes send in the control: their own loopback
ROUNDS, LOOKUPS, TIMEOUT = 10, 10, 0.25  # control and flood alternate: a load spike of the host hits both
CPU_SHARE = 1.0  # the flooding samples' cgroup: a sample's default sandbox_cpus


@contextlib.contextmanager
def fair_lab(clients: int, admission: bool = True) -> Iterator[tuple[Lab, int, list[str]]]:
    """The forwarder's namespace (held by the fake resolver's process) and the samples' namespace
    (held by a `cat`), joined by a veth pair, with `clients` source addresses on the samples' side;
    the kernel's admission rules loaded unless `admission` is False. Gone with the two processes."""
    with FakeResolver("127.0.0.53", 53, ANSWER, own_netns=True) as resolver:
        holder = subprocess.Popen(["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec cat"],
                                  stdin=subprocess.PIPE)
        try:
            tag = secrets.token_hex(3)
            near, far = f"tfc{tag}", f"tfs{tag}"
            sources = [f"198.18.0.{10 + i}" for i in range(clients)]
            router, samples = ["nsenter", "-t", str(resolver.pid), "-n"], ["nsenter", "-t", str(holder.pid), "-n"]
            steps = [["ip", "link", "add", near, "type", "veth", "peer", "name", far, "netns", str(resolver.pid)],
                     ["ip", "link", "set", near, "netns", str(holder.pid)],
                     [*router, "ip", "addr", "add", f"{SERVER}/24", "dev", far],
                     [*router, "ip", "link", "set", far, "up"],
                     [*samples, "ip", "link", "set", near, "up"],
                     *([*samples, "ip", "addr", "add", f"{ip}/24", "dev", near] for ip in sources)]
            for argv in steps:
                res = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=30)
                assert res.returncode == 0, (argv, res.stderr)
            if admission:
                rules = ["table inet tflab {", *dns_service.admission_rules("prerouting", "", SERVER, dns_service.PORT),
                         "}"]
                res = subprocess.run([*router, "nft", "-f", "-"], input="\n".join(rules) + "\n", check=False,
                                     capture_output=True, text=True, timeout=30)
                assert res.returncode == 0, res.stderr
            yield Lab(router[1:], SERVER, resolver), holder.pid, sources
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait()


def in_samples(ns: int, *args: str) -> subprocess.Popen[str]:
    """dns_load.py in the samples' namespace, taking commands on stdin."""
    return subprocess.Popen(["nsenter", "-t", str(ns), "-n", "--", sys.executable, LOAD, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def say(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def heard(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline()


def udp_delivered(pid: int) -> int:
    """The UDP datagrams delivered to sockets of the network namespace of `pid` (InDatagrams)."""
    lines = [line.split() for line in Path(f"/proc/{pid}/net/snmp").read_text().splitlines() if line.startswith("Udp:")]
    return int(lines[1][lines[0].index("InDatagrams")])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def flooders(ns: int, kind: str, sources: list[str]) -> Iterator[list[subprocess.Popen[str]]]:
    """Four processes that flood from `sources` (dns_load.py), in one cgroup with a sample's CPU share."""
    where = cgroups.hierarchies()
    if where is None or not where.has("cpu"):
        pytest.skip("no cgroup with a CPU controller to give the flooding samples a sample's CPU share")
    group = cgroups.SampleGroup(where, memory=None, cpus=CPU_SHARE, pids=None).create()
    procs: list[subprocess.Popen[str]] = []
    try:
        for _ in range(4):
            procs.append(in_samples(ns, "flood", SERVER, str(dns_service.PORT), CONTROL, kind, ",".join(sources)))
            for path in group.procs:  # before its first datagram (it waits for a command): nsenter execs python
                Path(path).write_text(str(procs[-1].pid))
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in procs:
            proc.wait(timeout=60)
        group.remove()


@dataclass
class Measured:
    control: list[float | None] = field(default_factory=list)  # the lookups while the flood went elsewhere
    during: list[float | None] = field(default_factory=list)  # and while it went to the forwarder
    cpu: float = 0.0  # the forwarder's CPU seconds over the whole measurement
    flooding: float = 0.0  # seconds the flood went to the forwarder, from each switch to the next
    delivered: int = 0  # UDP datagrams that reached a socket in the forwarder's namespace meanwhile


def measure(clients: int, kind: str, source_root: Path, admission: bool, fill: bool = True) -> Measured:
    """A sample's lookups, in ROUNDS rounds of LOOKUPS in the control then LOOKUPS while the other
    clients flood the forwarder. With `mixed` floods (and `fill`) the first round starts once every
    upstream slot of the forwarder has held a query that is never answered."""
    got = Measured()

    def rounds(where: Lab, ns: int, victim: str, others: list[str], fwd_pid: int) -> None:
        victim_proc = in_samples(ns, "measure", SERVER, str(dns_service.PORT), victim, str(TIMEOUT))
        try:
            with flooders(ns, kind, others) as procs:
                cpu, delivered = cpu_seconds(fwd_pid), udp_delivered(where.resolver.pid)
                for n in range(ROUNDS):
                    for target, into in (("control", got.control), ("server", got.during)):
                        start = time.monotonic()
                        for proc in procs:
                            say(proc, target)
                        assert all(heard(proc) == "on\n" for proc in procs)
                        if n == 0 and target == "server" and kind == "mixed" and fill:
                            blackholed = 0

                            def filled(line: str) -> bool:
                                nonlocal blackholed
                                blackholed += line.startswith("udp ") and "09626c61636b686f6c6500" in line
                                return blackholed >= fair.INFLIGHT
                            where.resolver.until(filled, timeout=60)
                        say(victim_proc, str(LOOKUPS))
                        into.extend(json.loads(heard(victim_proc)))
                        if target == "server":  # from the switch on: the forwarder's CPU counts from there
                            got.flooding += time.monotonic() - start
                got.cpu = cpu_seconds(fwd_pid) - cpu
                got.delivered = udp_delivered(where.resolver.pid) - delivered
        finally:
            assert victim_proc.stdin is not None
            victim_proc.stdin.close()
            victim_proc.wait(timeout=60)

    async def main() -> None:
        with fair_lab(clients + 1, admission) as (where, ns, (victim, *others)):
            async with forwarder(where, source_root) as fwd:
                await asyncio.to_thread(rounds, where, ns, victim, others, fwd.pid)
                assert fwd.alive

    asyncio.run(main())
    return got


def one_flooder(source_root: Path = SRC, admission: bool = True) -> Measured:
    """Another sample floods class-CH queries from four processes."""
    return measure(1, "chaos", source_root, admission)


def colluders(source_root: Path = SRC, admission: bool = True, fill: bool = True) -> Measured:
    """16 other samples flood together: class-CH queries, and queries that hold every upstream
    slot of the forwarder until they time out."""
    return measure(16, "mixed", source_root, admission, fill)


def share_within(took: list[float | None], bound: float) -> float:
    return sum(t is not None and t <= bound for t in took) / len(took)


def assert_fair(got: Measured) -> None:
    assert share_within(got.control, TIMEOUT) >= 0.95, got.control
    answered = sorted(t for t in got.control if t is not None)
    bound = max(0.050, 3 * answered[int(len(answered) * 0.95) - 1])
    assert share_within(got.during, bound) >= 0.95, (
        f"{share_within(got.during, bound):.0%} within {bound * 1000:.0f} ms", got.during, got.control)


def assert_bounded(got: Measured) -> None:
    """What reached the forwarder's namespace: the flooding sample's rate (its bucket full again at
    each round: the control lets it refill), and per lookup its query, the forwarder's to the
    resolver and the resolver's answer. Whatever it sent: 20,000 datagrams a round to start with."""
    flood = fair.RATE * got.flooding + fair.BURST * ROUNDS
    lookups = 3 * (len(got.control) + len(got.during))
    assert got.delivered <= 1.2 * (flood + lookups) + 100, (got.delivered, flood, lookups)


ATTEMPTS = 3


def fair_in_one_of(attempts: int, take: Callable[[], Measured]) -> Measured:
    """The first of up to `attempts` measurements that `assert_fair` accepts; the last one's
    failure if none is.

    A host's load spike (a second test suite, a compiler on a shared 2-core machine) can fall on a
    round's flood half and miss its control half, and then one measurement fails with the
    forwarder fair. Noise only ever makes a lookup slower: it cannot make a starving forwarder
    look fair, which starves the victim in every measurement (the mutation checks below take one
    measurement, and fail it)."""
    for attempt in range(1, attempts + 1):
        got = take()
        try:
            assert_fair(got)
        except AssertionError:
            if attempt == attempts:
                raise
            continue
        return got
    raise AssertionError("no attempt")  # attempts >= 1


@needs_net_admin
def test_a_sample_flooding_from_four_processes_starves_no_other_and_costs_the_forwarder_little() -> None:
    got = fair_in_one_of(ATTEMPTS, one_flooder)
    assert_bounded(got)
    assert got.cpu < 0.25 * got.flooding, got  # before: the flood kept it busy on a whole CPU


@needs_net_admin
def test_sixteen_colluding_samples_deny_no_other() -> None:
    fair_in_one_of(ATTEMPTS, colluders)


def unfair_source(root: Path) -> Path:
    """A copy of the forwarder's source that counts every client of its UDP socket as one: one
    rate, one queue, one share of the upstream slots."""
    from tests.sandbox.test_dns import mutant_copy

    forward = mutant_copy(root) / "trajforge/sandbox/dns/forward.py"
    text = forward.read_text()
    anchor = "            client = addr[0]\n"
    assert text.count(anchor) == 1, "the mutation's anchor moved: update unfair_source"
    forward.write_text(text.replace(anchor, '            client = ""\n'))
    return root


@needs_net_admin
def test_the_flood_test_fails_without_the_kernel_s_admission() -> None:
    got = one_flooder(admission=False)
    with pytest.raises(AssertionError):
        assert_bounded(got)
    assert got.delivered > 10 * fair.RATE * got.flooding, got  # the flood reached the forwarder whole


@needs_net_admin
def test_the_colluders_test_fails_with_one_share_for_every_client(tmp_path: Path) -> None:
    # With one share the clients hold 64 upstream slots in all, not 1,024: the flood starts unfilled.
    got = colluders(unfair_source(tmp_path / "src"), fill=False)
    with pytest.raises(AssertionError):
        assert_fair(got)


def colluders_holding_every_connection(source_root: Path = SRC) -> str:
    """What a sample's TCP lookup gets while 16 others hold every TCP connection the forwarder takes."""
    from trajforge.sandbox.dns import forward

    each = forward.CONNECTIONS_PER_CLIENT
    assert 16 * each >= forward.MAX_CONNECTIONS

    async def main() -> str:
        with fair_lab(17) as (where, ns, (victim, *others)):
            async with forwarder(where, source_root):
                holder = in_samples(ns, "hold", SERVER, str(dns_service.PORT), str(each), ",".join(others))
                try:
                    assert await asyncio.to_thread(heard, holder) == "held\n"
                    tcp = in_samples(ns, "tcp", SERVER, str(dns_service.PORT), victim)
                    got = await asyncio.to_thread(heard, tcp)
                    await asyncio.to_thread(tcp.wait, 60)
                finally:
                    assert holder.stdin is not None
                    holder.stdin.close()
                    holder.kill()  # its connections may have been taken: it cannot tell
                    await asyncio.to_thread(holder.wait, 60)
        return got

    return asyncio.run(main())


@needs_net_admin
def test_sixteen_samples_holding_every_tcp_connection_deny_no_other() -> None:
    assert colluders_holding_every_connection() == "answered\n"


@needs_net_admin
def test_the_tcp_test_fails_when_no_connection_gives_its_place_up(tmp_path: Path) -> None:
    from tests.sandbox.test_dns import mutant_copy

    forward = mutant_copy(tmp_path / "src") / "trajforge/sandbox/dns/forward.py"
    text = forward.read_text()
    anchor = "            if top is not None:  # the heaviest client's oldest connection gives its place up\n"
    assert text.count(anchor) == 1, "the mutation's anchor moved"
    forward.write_text(text.replace(anchor, "            if False:\n"))
    assert colluders_holding_every_connection(tmp_path / "src") == "closed\n"


def test_the_router_and_containers_load_the_admission_rules() -> None:
    from trajforge.sandbox.host.router import router_ruleset
    from trajforge.sandbox.network import ruleset

    for text, hook, match in ((router_ruleset(host_addrs=["192.0.2.2"]), "prerouting", 'iifname "s*" '),
                              (ruleset(), "output", "")):
        rules = "\n".join(dns_service.admission_rules(hook, match, "10.0.2.3", 53))
        assert rules in text
        assert f"{match}ip daddr 10.0.2.3 udp dport 53 update @dns_datagrams {{ ip saddr limit rate over " \
               f"{fair.RATE:g}/second burst {fair.BURST} packets }} drop" in rules
