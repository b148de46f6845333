"""Just enough rtnetlink to wire a sample's network namespace: links up, veth pairs, addresses,
a default route. Stdlib only: it runs in the zygote (zygote.py), which sets up each slot's
namespace in-process instead of starting `ip` several times per slot (one `ip` costs more CPU
than everything else a one-command sample does).

A netlink socket belongs to the network namespace it was opened in, so `Netlink()` must be
opened after entering the namespace it is meant to change, and closed before leaving it.
Every request asks for an acknowledgement; a refusal raises OSError with the kernel's errno.
"""

from __future__ import annotations

import _socket
import os
import struct

_NETLINK_ROUTE = 0
_NLMSG_ERROR = 2
_RTM_NEWLINK, _RTM_NEWADDR, _RTM_NEWROUTE = 16, 20, 24
_F_REQUEST, _F_ACK, _F_EXCL, _F_CREATE = 0x1, 0x4, 0x200, 0x400
_IFLA_IFNAME, _IFLA_MTU, _IFLA_LINKINFO, _IFLA_NET_NS_FD = 3, 4, 18, 28
_IFLA_INFO_KIND, _IFLA_INFO_DATA, _VETH_INFO_PEER = 1, 2, 1
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_RTA_GATEWAY = 5
_IFF_UP = 0x1
_AF_INET = 2
_HDR = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change


def _attr(kind: int, data: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(data), kind) + data
    return raw + b"\0" * (-len(raw) % 4)


def _name(text: str) -> bytes:
    return text.encode() + b"\0"


def _ipv4(text: str) -> bytes:
    return bytes(int(part) for part in text.split("."))


class Netlink:
    """One NETLINK_ROUTE socket in the current network namespace."""

    def __init__(self) -> None:
        self.sock = _socket.socket(_socket.AF_NETLINK, _socket.SOCK_RAW | _socket.SOCK_CLOEXEC, _NETLINK_ROUTE)
        self.sock.bind((0, 0))
        self.seq = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, kind: int, body: bytes, flags: int = 0) -> None:
        self.seq += 1
        self.sock.send(_HDR.pack(_HDR.size + len(body), kind, _F_REQUEST | _F_ACK | flags, self.seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + _HDR.size <= len(data):
                length, mtype, _flags, seq, _pid = _HDR.unpack_from(data, offset)
                if mtype == _NLMSG_ERROR and seq == self.seq:
                    (code,) = struct.unpack_from("=i", data, offset + _HDR.size)
                    if code:
                        raise OSError(-code, f"netlink: {os.strerror(-code)}")
                    return
                offset += max(length, _HDR.size)

    def link_up(self, name: str, mtu: int | None = None) -> None:
        index = _socket.if_nametoindex(name)
        attrs = _attr(_IFLA_MTU, struct.pack("=I", mtu)) if mtu else b""
        self.request(_RTM_NEWLINK, _IFINFO.pack(0, 0, index, _IFF_UP, _IFF_UP) + attrs)

    def add_veth(self, name: str, peer: str, peer_netns_fd: int, mtu: int) -> None:
        """A veth pair: `name` here, `peer` created directly in the namespace of `peer_netns_fd`."""
        peer_info = (_IFINFO.pack(0, 0, 0, 0, 0) + _attr(_IFLA_IFNAME, _name(peer))
                     + _attr(_IFLA_MTU, struct.pack("=I", mtu)) + _attr(_IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd)))
        info = _attr(_IFLA_INFO_KIND, b"veth") + _attr(_IFLA_INFO_DATA, _attr(_VETH_INFO_PEER, peer_info))
        body = (_IFINFO.pack(0, 0, 0, 0, 0) + _attr(_IFLA_IFNAME, _name(name))
                + _attr(_IFLA_MTU, struct.pack("=I", mtu)) + _attr(_IFLA_LINKINFO, info))
        self.request(_RTM_NEWLINK, body, _F_CREATE | _F_EXCL)

    def add_address(self, name: str, address: str, prefix: int) -> None:
        index = _socket.if_nametoindex(name)
        body = struct.pack("=BBBBI", _AF_INET, prefix, 0, 0, index)
        body += _attr(_IFA_LOCAL, _ipv4(address)) + _attr(_IFA_ADDRESS, _ipv4(address))
        self.request(_RTM_NEWADDR, body, _F_CREATE | _F_EXCL)

    def add_default_route(self, gateway: str) -> None:
        # rtmsg: family, dst_len, src_len, tos, table main, protocol boot, scope universe, unicast
        body = struct.pack("=BBBBBBBBI", _AF_INET, 0, 0, 0, 254, 3, 0, 1, 0) + _attr(_RTA_GATEWAY, _ipv4(gateway))
        self.request(_RTM_NEWROUTE, body, _F_CREATE | _F_EXCL)
