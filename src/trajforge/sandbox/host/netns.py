"""The zygote's network namespaces (zygote.py): the run's router and every slot's, made in-process.

A namespace is made with unshare and kept by a descriptor the zygote holds (the handle the
runner names it by; /proc/<zygote>/fd/<n> is its path for slirp4netns and nsenter), then wired
with netlink (netlink.py) after entering it, since a netlink socket belongs to the namespace it
was opened in: loopback up, and in egress mode a veth link to the router (router.py), slot k on
the k-th /30 of 10.128.0.0/9. New interfaces get no IPv6: nothing routes it, and address
configuration would cost every veth its timers and packets. Stdlib only.
"""

from __future__ import annotations

import os

from trajforge.sandbox.host.netlink import Netlink

_NEWNET = 0x40000000
VETH_MTU = 65520


def slot_addresses(index: int) -> tuple[str, str]:
    """(router side, slot side) of slot `index`'s /30 in 10.128.0.0/9 (router.py routes them)."""
    base = (10 << 24) | (128 << 16) | (4 * index)
    dotted = ".".join(str(base >> s & 255) for s in (24, 16, 8, 0))
    head = dotted.rsplit(".", 1)[0]
    last = base & 255
    return f"{head}.{last + 1}", f"{head}.{last + 2}"


class Namespaces:
    """The network half of the zygote: needs its libc, check(), host_net and nets."""

    def _new_netns(self) -> int:
        self.check(self.libc.unshare(_NEWNET), "unshare(net)")
        try:
            return os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            self.check(self.libc.setns(self.host_net, _NEWNET), "setns(host net)")

    def _enter(self, ns: int) -> None:
        self.check(self.libc.setns(ns, _NEWNET), "setns(net)")

    def _no_ipv6(self) -> None:
        """Interfaces made from now on in the current namespace get no IPv6 (nothing routes it, and
        address configuration would cost every new veth its timers and packets)."""
        with open("/proc/sys/net/ipv6/conf/default/disable_ipv6", "w") as f:  # opened here: this ns's own
            f.write("1")

    def op_netns(self, req: dict, _channel: int) -> dict:
        """A slot's network namespace: loopback up; with `router`, a veth link to the router."""
        ns = self._new_netns()
        try:
            router, index = req.get("router"), req.get("index", 0)
            if router is not None:
                self._enter(ns)
                self._no_ipv6()
                outside, inside = slot_addresses(index)
                self._enter(self.nets[router])
                with Netlink() as nl:
                    nl.add_veth(f"s{index}", "eth0", ns, VETH_MTU)
                    nl.add_address(f"s{index}", outside, 30)
                    nl.link_up(f"s{index}")
            self._enter(ns)
            with Netlink() as nl:
                nl.link_up("lo")
                if router is not None:
                    nl.add_address("eth0", inside, 30)
                    nl.link_up("eth0")
                    nl.add_default_route(outside)
        except BaseException:
            os.close(ns)
            raise
        finally:
            self._enter(self.host_net)
        self.nets[ns] = ns
        return {"ns": ns, "path": f"/proc/{os.getpid()}/fd/{ns}"}

    def op_router(self, req: dict, _channel: int) -> dict:
        """The run's router namespace: loopback up and IPv4 forwarding on (only in there)."""
        ns = self._new_netns()
        try:
            self._enter(ns)
            with open("/proc/sys/net/ipv4/ip_forward", "w") as f:  # opened here: the router's own
                f.write("1")
            self._no_ipv6()
            with Netlink() as nl:
                nl.link_up("lo")
        finally:
            self._enter(self.host_net)
        self.nets[ns] = ns
        return {"ns": ns, "path": f"/proc/{os.getpid()}/fd/{ns}"}

    def op_drop(self, req: dict, _channel: int) -> dict:
        fd = self.nets.pop(req["ns"], None)
        if fd is not None:
            os.close(fd)
        return {}
