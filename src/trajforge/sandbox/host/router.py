"""Egress for root-mode bwrap samples: one router namespace per run between the samples and slirp4netns.

Every sample slot has a network namespace of its own whose only way out is a veth link `eth0`
to the run's router namespace (zygote.op_netns; slot k is 10.128.0.0/9's k-th /30). The router
forwards to `tap0`, served by one slirp4netns per run (--disable-host-loopback: its gateway
10.0.2.2 never leads to the host's 127.0.0.1), and masquerades. Its nftables rules are the
egress policy, in a namespace no sample can reach into (commands run without capabilities, and
the router is not in any sample's namespaces): forward only from a slot to tap0, never to the
blocked ranges of netpolicy.py (loopback, link-local and cloud metadata, RFC 1918, CGNAT,
unique-local, multicast, reserved) nor to the host's own addresses, except what `network.allow`
lists; never from one slot to another; nothing addressed to the router itself but DNS. A
sample's DNS (UDP and TCP to 10.0.2.3:53, the address its resolv.conf names) is redirected to the
run's DNS forwarder in the router namespace (dns/forward.py, started unprivileged by
dns/service.py), which passes on only well-formed queries, rebuilt, to slirp's DNS address:
nothing of a sample's goes to slirp's DNS relay, and so to the host's resolver, as sent. One
user-mode stack per run instead of one per sample: a sample start costs a namespace and a veth
pair (microseconds in-kernel), not a process (bench/RESULTS.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import tempfile
from collections.abc import Sequence

from trajforge.netpolicy import BLOCKED_V4, host_addresses
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.dns.service import PORT as DNS_PORT
from trajforge.sandbox.dns.service import DnsForwarder, admission_rules
from trajforge.sandbox.host.zygote_client import Zygote
from trajforge.sandbox.process import SAFE_PATH, tool_path

SLIRP_DNS = "10.0.2.3"
DNS_UPSTREAM = (SLIRP_DNS, 53)  # where the forwarder asks: slirp's DNS relay, seen from the router
START_TIMEOUT = 10.0


def _networks(entries: Sequence[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    nets = []
    for entry in entries:
        with contextlib.suppress(ValueError):  # host names: runner-side fetches only
            nets.append(ipaddress.ip_network(entry.strip(), strict=False))
    return nets


def router_ruleset(allow: Sequence[str] = (), host_addrs: Sequence[str] | None = None) -> str:
    """The nftables rules of the router namespace (pure, for tests and doctor)."""
    hosts = host_addresses() if host_addrs is None else tuple(host_addrs)
    v4 = list(BLOCKED_V4) + [a for a in hosts if ":" not in a]
    nets = _networks(allow)
    ok4 = [str(n) for n in nets if n.version == 4]
    slot = 'iifname "s*"'
    lines = ["table inet trajforge {",
             # A slot's DNS goes to the forwarder, never on to tap0 (10.0.2.3 is a blocked address).
             "  chain dns_redirect {", "    type nat hook prerouting priority -100; policy accept;",
             f"    {slot} ip daddr {SLIRP_DNS} udp dport 53 redirect to :{DNS_PORT}",
             f"    {slot} ip daddr {SLIRP_DNS} tcp dport 53 redirect to :{DNS_PORT}", "  }",
             "  chain forward_filter {", "    type filter hook forward priority 0; policy drop;",
             "    ct state established,related accept",
             "    meta nfproto ipv6 reject"]  # no IPv6 beyond a slot: nothing to filter, nothing to allow
    if ok4:
        lines.append(f'    {slot} oifname "tap0" ip daddr {{ {", ".join(ok4)} }} accept')
    # TCP gets a reset (an immediate "connection refused"), everything else an ICMP error.
    lines += [f"    {slot} ip daddr {{ {', '.join(v4)} }} meta l4proto tcp reject with tcp reset",
              f"    {slot} ip daddr {{ {', '.join(v4)} }} reject with icmpx type admin-prohibited",
              f'    {slot} oifname "tap0" accept',
              f"    {slot} meta l4proto tcp reject with tcp reset",  # to another slot
              f"    {slot} reject with icmpx type admin-prohibited",
              "  }",
              "  chain input_filter {", "    type filter hook input priority 0; policy accept;",
              f"    {slot} ct status dnat udp dport {DNS_PORT} accept",
              f"    {slot} ct status dnat tcp dport {DNS_PORT} accept",
              f"    {slot} meta l4proto tcp reject with tcp reset", f"    {slot} reject with icmpx type admin-prohibited",
              '    iifname "tap0" ct state established,related accept', '    iifname "tap0" drop',
              "  }",
              "  chain nat_out {", "    type nat hook postrouting priority 100; policy accept;",
              '    oifname "tap0" masquerade', "  }",
              # every sample's fair share of the forwarder (dns/fair.py): the kernel's part
              *admission_rules("prerouting", f"{slot} ", SLIRP_DNS, 53), "}"]
    return "\n".join(lines) + "\n"


def resolv_conf() -> bytes:
    """The resolv.conf bound over /etc/resolv.conf in egress mode, naming slirp's DNS address, which
    the router redirects to the run's forwarder (the host's resolver is often on a loopback or
    private address the sample may not reach).
    bwrap reads it from a pipe (--ro-bind-data): no file on the host to create or clean up."""
    return f"nameserver {SLIRP_DNS}\noptions edns0\n".encode("ascii")


class Router:
    """The run's router namespace (held by the zygote), its firewall, its slirp4netns and its DNS forwarder."""

    def __init__(self, zygote: Zygote, allow: Sequence[str] = ()) -> None:
        self.zygote, self.allow = zygote, tuple(allow)
        self.ns: int | None = None
        self.path = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.dns: DnsForwarder | None = None
        self._exit_w: int | None = None

    async def start(self) -> Router:
        slirp, nft = tool_path("slirp4netns"), tool_path("nft")
        if slirp is None or nft is None or tool_path("nsenter") is None:
            raise SandboxError("egress networking needs slirp4netns, nft and nsenter "
                               "(apt-get install slirp4netns nftables util-linux)")
        reply = await self.zygote.request("router")
        self.ns, self.path = reply["ns"], reply["path"]
        try:
            await asyncio.gather(self._firewall(nft), self._slirp(slirp))
            # After slirp: its upstream sockets are connected through tap0.
            self.dns = await DnsForwarder.start([f"--net={self.path}"], listen=("0.0.0.0", DNS_PORT),
                                                upstream=DNS_UPSTREAM)
        except BaseException:
            await self.close()
            raise
        return self

    async def _firewall(self, nft: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            "nsenter", f"--net={self.path}", nft, "-f", "-", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH}, cwd="/")
        _, err = await proc.communicate(router_ruleset(self.allow).encode())
        if proc.returncode != 0:
            raise SandboxError(f"cannot install the egress firewall: {err.decode(errors='replace').strip()[-300:]}")

    async def _slirp(self, slirp: str) -> None:
        unshare = tool_path("unshare") or "unshare"
        exit_r, self._exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        # stderr to an unnamed file, read only when the start fails (a pipe nobody drains would
        # keep the transport open for the run's whole life).
        errors = tempfile.TemporaryFile()
        try:
            # In a mount namespace of its own, private: slirp4netns's --enable-sandbox (1.2.0)
            # pivots and detaches the old root without making it private first, and the unmount
            # then reached every shared mount of the host (/run/netns/*: every `ip netns` and
            # Podman container namespace lost its mount, and `podman ps` failed from then on).
            self.proc = await asyncio.create_subprocess_exec(
                unshare, "--mount", "--propagation", "private", "--",
                slirp, "--configure", "--mtu=65520", "--disable-host-loopback", "--enable-sandbox",
                "--enable-seccomp", f"--exit-fd={exit_r}", f"--ready-fd={ready_w}", "--netns-type=path",
                self.path, "tap0", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=errors, pass_fds=(exit_r, ready_w), start_new_session=True, env={"PATH": SAFE_PATH}, cwd="/")
        except BaseException:
            errors.close()
            raise
        finally:
            os.close(exit_r)
            os.close(ready_w)
        try:
            async with asyncio.timeout(START_TIMEOUT):
                ready = await asyncio.to_thread(os.read, ready_r, 1)  # EOF when slirp4netns dies
        except TimeoutError:
            ready = b""
        finally:
            os.close(ready_r)
        with errors:
            if ready != b"1":
                errors.seek(0)
                err = errors.read()[-300:].decode(errors="replace").strip()
                raise SandboxError(f"slirp4netns did not start: {err or 'no output'}")

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None and self.dns is not None and self.dns.alive

    async def close(self) -> None:
        dns, self.dns = self.dns, None
        if dns is not None:
            await dns.close()
        if self._exit_w is not None:
            os.close(self._exit_w)  # slirp4netns exits when this pipe closes (or the runner dies)
            self._exit_w = None
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            try:
                async with asyncio.timeout(2):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        if self.ns is not None:
            ns, self.ns = self.ns, None
            with contextlib.suppress(SandboxError):
                await self.zygote.request("drop", ns=ns)
