"""Which destination addresses a sample may reach: one rule for sandboxes and runner-side fetches.

A leaf module (no I/O beyond the host-address listing): the sandbox network module turns
BLOCKED_V4/BLOCKED_V6 into an in-namespace firewall, and the runner's egress policy
(tools/web/egress.py) checks every address it is about to connect to with `refusal`. Blocked by
default: loopback, link-local (cloud metadata at 169.254.169.254 lives there), RFC 1918 and
unique-local private ranges, CGNAT, multicast, "this network", reserved and benchmark ranges,
and the host's own addresses (a public address of the host would otherwise reach its
services). `network.allow` (CIDRs or host names) re-opens chosen destinations.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

BLOCKED_V4 = ("0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
              "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4")
BLOCKED_V6 = ("::/127", "::ffff:0:0/96", "64:ff9b::/96", "fc00::/7", "fe80::/10", "ff00::/8")
_NETS = tuple(ipaddress.ip_network(n) for n in BLOCKED_V4 + BLOCKED_V6)
_WHY = {"127.0.0.0/8": "loopback", "::/127": "loopback/unspecified", "169.254.0.0/16": "link-local",
        "fe80::/10": "link-local", "100.64.0.0/10": "CGNAT", "224.0.0.0/4": "multicast", "ff00::/8": "multicast",
        "0.0.0.0/8": "unspecified", "fc00::/7": "private"}


@lru_cache(maxsize=1)
def host_addresses() -> tuple[str, ...]:
    """Every address configured on this host's interfaces (`ip -j addr`), once per process.

    A sandbox reaching the host through one of them would reach the host's own services."""
    try:
        out = subprocess.run(["ip", "-j", "addr"], capture_output=True, timeout=10, check=True).stdout
        found = {a["local"] for link in json.loads(out) for a in link.get("addr_info", []) if a.get("local")}
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return ()
    return tuple(sorted(found))


def _unmapped(ip: IPAddress) -> IPAddress:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


@dataclass(frozen=True)
class Policy:
    """allow_nets/allow_hosts: `network.allow`; host_addrs: addresses of the host itself."""

    allow_nets: tuple[IPNetwork, ...] = ()
    allow_hosts: frozenset[str] = frozenset()
    host_addrs: frozenset[IPAddress] = field(default_factory=frozenset)

    def refusal(self, ip: str | IPAddress, host: str | None = None) -> str | None:
        """Why connecting to `ip` (resolved from `host`) is refused, or None when allowed."""
        addr = _unmapped(ipaddress.ip_address(ip) if isinstance(ip, str) else ip)
        if host is not None and host.lower().rstrip(".") in self.allow_hosts:
            return None
        if any(addr in net for net in self.allow_nets):
            return None
        for net in _NETS:
            if addr in net:
                return f"{addr} is a {_WHY.get(str(net), 'private or reserved')} address"
        if addr in self.host_addrs:
            return f"{addr} is an address of this host"
        return None


def make_policy(allow: Iterable[str] = (), *, include_host: bool = True) -> Policy:
    """The policy for `network.allow` entries (CIDRs, addresses or host names)."""
    nets: list[IPNetwork] = []
    hosts: set[str] = set()
    for entry in allow:
        try:
            nets.append(ipaddress.ip_network(entry.strip(), strict=False))
        except ValueError:
            hosts.add(entry.strip().lower().rstrip("."))
    own = frozenset(_unmapped(ipaddress.ip_address(a)) for a in host_addresses()) if include_host else frozenset()
    return Policy(tuple(nets), frozenset(hosts), own)


def valid_allow_entry(entry: str) -> bool:
    """A CIDR/address, or something shaped like a host name (no scheme, path or port)."""
    try:
        ipaddress.ip_network(entry.strip(), strict=False)
        return True
    except ValueError:
        pass
    name = entry.strip().rstrip(".")
    return bool(name) and all(part and len(part) < 64 and all(c.isalnum() or c in "-_*" for c in part)
                              for part in name.split("."))
