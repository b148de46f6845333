"""Network modes of the isolating sandboxes (`--sandbox_network auto|egress|host|none`).

- egress (the default where it works): each sample has a network namespace of its own, with a
  private loopback, and reaches the outside only through a user-mode TCP/IP stack
  (slirp4netns, with --disable-host-loopback: its gateway 10.0.2.2 does not lead to the host's
  127.0.0.1) that opens ordinary sockets on the host for the sample, behind an nftables rule set
  that rejects every packet to loopback, link-local (169.254.0.0/16: cloud metadata), RFC 1918,
  CGNAT, unique-local, multicast and reserved ranges, and to the host's own addresses
  (netpolicy.py), except what `network.allow` lists. DNS to slirp's address 10.0.2.3:53 (UDP
  and TCP) is redirected to a DNS forwarder (dns/forward.py) that passes on well-formed queries
  only, rebuilt; nothing a sample sends reaches slirp's DNS relay, and the host's resolver
  behind it, as sent. bwrap: one router namespace per run holds the stack, the rules and the
  forwarder, and every sample's namespace is linked to it (router.py). The rules are installed
  by the runner (root) where samples run without capabilities, so a sample cannot change them.
  A sample's services listen in its own namespace, which nothing else can route to, so samples
  cannot reach each other. Needs root (the bwrap "root" mode), slirp4netns and nft.
- host: the host's network as is (the pre-egress behaviour; `on` is accepted as its old name).
- none: an empty network namespace.
Containers: egress is podman's `slirp4netns:allow_host_loopback=false` (docker: its default
bridge) plus the same rule set entered into the container's namespace (`install_rules`), and with
Podman a forwarder of the container's own in that namespace (`start_dns`), on its loopback: the
rules redirect 10.0.2.3:53 there and let only the forwarder's queries (its sockets carry a mark,
which takes CAP_NET_ADMIN to set) go to 10.0.2.3. Docker's bridge has no 10.0.2.3. `auto`
resolves once per run (`resolve_mode`, into a NetworkMode the run's provider holds): egress when
the backend's probe gets it, else host with a note saying why; an explicit egress that cannot be
had is a UsageError before any work. Which modes a backend can give at all is its spec's
(trajforge.catalog.sandboxes: `networks`, `egress_probe`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trajforge.catalog.sandboxes import AUTO, OLD_NAMES, SANDBOXES, NetworkMode, auto_order
from trajforge.errors import UsageError
from trajforge.netpolicy import BLOCKED_V4, BLOCKED_V6, host_addresses
from trajforge.registry import load
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.dns.service import MARK, PORT, DnsForwarder, admission_rules
from trajforge.sandbox.process import SAFE_PATH, tool_path

if TYPE_CHECKING:
    from trajforge.sandbox.sandbox_settings import SandboxSettings

SLIRP_DNS = "10.0.2.3"
DNS_UPSTREAM = (SLIRP_DNS, 53)  # where a container's forwarder asks: its slirp4netns's DNS relay
START_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class EgressSupport:
    usable: bool
    detail: str


def _network(entry: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        return None


def ruleset(allow: list[str] | tuple[str, ...] = ()) -> str:
    """The nftables rules loaded into a sample's namespace (pure, for tests and doctor)."""
    v4 = list(BLOCKED_V4) + [a for a in host_addresses() if ":" not in a]
    v6 = list(BLOCKED_V6) + [a for a in host_addresses() if ":" in a]
    nets = [n for n in map(_network, allow) if n is not None]  # host names: runner-side fetches only
    ok4 = [str(n) for n in nets if n.version == 4]
    ok6 = [str(n) for n in nets if n.version == 6]
    up, port = DNS_UPSTREAM
    lines = ["table inet trajforge {",
             # DNS to slirp's address goes to the forwarder on loopback, except the forwarder's own.
             "  chain dns_redirect {", "    type nat hook output priority -100; policy accept;",
             f"    meta mark {MARK:#x} return",
             f"    ip daddr {SLIRP_DNS} udp dport 53 redirect to :{PORT}",
             f"    ip daddr {SLIRP_DNS} tcp dport 53 redirect to :{PORT}", "  }",
             "  chain out {", "    type filter hook output priority 0; policy accept;",
             '    oifname "lo" accept',
             # redirected: seen here with its new address and the interface of its old route
             f"    ct status dnat ip daddr 127.0.0.1 udp dport {PORT} accept",
             f"    ct status dnat ip daddr 127.0.0.1 tcp dport {PORT} accept",
             f"    meta mark {MARK:#x} ip daddr {up} udp dport {port} accept"]
    if ok4:
        lines.append(f"    ip daddr {{ {', '.join(ok4)} }} accept")
    if ok6:
        lines.append(f"    ip6 daddr {{ {', '.join(ok6)} }} accept")
    # TCP gets a reset (an immediate "connection refused"), everything else an ICMP error.
    for fam, nets in (("ip", v4), ("ip6", v6)):
        lines += [f"    {fam} daddr {{ {', '.join(nets)} }} meta l4proto tcp reject with tcp reset",
                  f"    {fam} daddr {{ {', '.join(nets)} }} reject with icmpx type admin-prohibited"]
    lines += ["  }", *admission_rules("output", "", SLIRP_DNS, 53), "}"]  # the forwarder's work bounded
    return "\n".join(lines) + "\n"


async def install_rules(pid: int, allow: list[str] | tuple[str, ...] = ()) -> None:
    """Load `ruleset` into the network namespace of `pid` (as root, from the host)."""
    nft = tool_path("nft")
    if nft is None:
        raise SandboxError("egress networking needs nft (apt-get install nftables)")
    proc = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(pid), "-n", nft, "-f", "-", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH}, cwd="/")
    _, err = await proc.communicate(ruleset(allow).encode())
    if proc.returncode != 0:
        raise SandboxError(f"cannot install the egress firewall: {err.decode(errors='replace').strip()[-300:]}")


async def start_dns(pid: int) -> DnsForwarder:
    """The DNS forwarder of the container whose process is `pid` (Podman's slirp4netns network),
    in its network namespace and listening on its loopback, where `ruleset` redirects its DNS."""
    return await DnsForwarder.start(["-t", str(pid), "-n"], listen=("127.0.0.1", PORT), upstream=DNS_UPSTREAM)


_support: dict[str, EgressSupport] = {}


async def egress_support(backend: str) -> EgressSupport:
    """Whether samples of `backend` get egress here, once per process: the host's needs (root,
    slirp4netns, nft, nsenter), then the backend's own proof (its spec's `egress_probe`)."""
    if backend in _support:
        return _support[backend]
    spec = SANDBOXES.get(backend)
    missing = [n for n in ("slirp4netns", "nft", "nsenter") if tool_path(n) is None]
    if spec is None:
        found = EgressSupport(False, f"unknown sandbox backend {backend!r}")
    elif NetworkMode.EGRESS not in spec.capabilities.networks:
        found = EgressSupport(False, f"the {backend} sandbox has no network namespace")
    elif os.geteuid() != 0:
        found = EgressSupport(False, "egress needs the runner to be root (it sets up each sample's namespace)")
    elif missing:
        found = EgressSupport(False, f"missing {', '.join(missing)} (apt-get install slirp4netns nftables)")
    elif spec.capabilities.egress_probe is not None:
        found = await load(spec.capabilities.egress_probe)()
    else:
        found = EgressSupport(True, "")
    _support[backend] = found
    return found


def network_backend(settings: SandboxSettings) -> str:
    """The backend whose network the run's mode is resolved for: `--sandbox`, or under auto the
    one it prefers (a row with an image gets the same mode in its container)."""
    return settings.backend if settings.backend != AUTO else auto_order()[0].name


async def resolve_mode(settings: SandboxSettings) -> tuple[NetworkMode, str | None]:
    """The concrete mode for this run and a note for the user when auto could not get egress.

    Raises UsageError when egress was asked for explicitly and cannot be had."""
    mode = OLD_NAMES.get(settings.network, settings.network)
    if mode not in (AUTO, NetworkMode.EGRESS):
        return NetworkMode(mode), None
    backend = network_backend(settings)
    support = await egress_support(backend)
    if support.usable:
        return NetworkMode.EGRESS, None
    if mode == NetworkMode.EGRESS:
        raise UsageError(f"--sandbox_network egress is not available with --sandbox {settings.backend}: "
                         f"{support.detail} (see `trajforge doctor`; --sandbox_network host opts into the host network)")
    if NetworkMode.EGRESS not in SANDBOXES[backend].capabilities.networks:
        return NetworkMode.HOST, None  # a backend that never isolates the network: nothing to announce
    return NetworkMode.HOST, (f"egress networking is not available here ({support.detail}); samples share the "
                              "host network (--sandbox_network host); see `trajforge doctor`")


_DETAILS = {NetworkMode.HOST: "the host's network, loopback and private ranges included (opt-in)",
            NetworkMode.NONE: "an empty network namespace"}


async def doctor_rows(settings: SandboxSettings) -> dict[str, object]:
    """`trajforge doctor`: each network mode and whether it works for the backend `auto` prefers here."""
    egress = await egress_support(network_backend(settings))
    rows: dict[str, object] = {
        NetworkMode.EGRESS: {"usable": egress.usable, "detail": egress.detail, "slirp4netns": tool_path("slirp4netns"),
                             "pasta": tool_path("pasta"), "nft": tool_path("nft")}}
    rows |= {mode: {"usable": True, "detail": detail} for mode, detail in _DETAILS.items()}
    rows[AUTO] = NetworkMode.EGRESS if egress.usable else NetworkMode.HOST
    return {str(k): v for k, v in rows.items()}
