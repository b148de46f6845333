"""The egress policy of the runner's own fetches of model-chosen URLs (web_extract, vision and
image downloads, every request of the browser through tools/web/egress_proxy.py).

These fetches run in the runner, outside any sandbox, so without a check a model could read the
runner's loopback services, the cloud metadata service (169.254.169.254) or the private network.
The rule (netpolicy.py) is applied to the address actually connected to: a host name is resolved
once, each address is checked, and the socket is opened to that checked address (the TLS name
and Host header stay the host name), so a DNS answer that changes between check and connect
(DNS rebinding) changes nothing. httpx follows redirects through the same connector, so every
hop is checked again. Endpoints the user configured (model, SearXNG, image API) do not go
through this module; an image API's download URL is allowed for that API's own host only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpcore
import httpx

from trajforge.netpolicy import Policy, make_policy

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

CONNECT_TIMEOUT = 10.0


class EgressRefused(httpcore.ConnectError):
    """A destination the policy refuses; its message is meant for the model."""


def policy_for(settings: ToolSettings, extra_hosts: Iterable[str] = ()) -> Policy:
    """The run's policy: `network.allow` plus `extra_hosts` (a configured endpoint's host)."""
    return make_policy([*settings.network_allow, *extra_hosts])


async def resolve_checked(host: str, port: int, policy: Policy, timeout: float = CONNECT_TIMEOUT) -> list[str]:
    """The addresses of `host` the policy allows, in resolver order; EgressRefused when none."""
    host = host.strip("[]")
    try:
        literal = ipaddress.ip_address(host)
        addrs = [str(literal)]
    except ValueError:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as e:
            raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from None
        addrs = list(dict.fromkeys(str(info[4][0]) for info in infos))
    allowed = [a for a in addrs if policy.refusal(a, host) is None]
    if not allowed:
        reason = policy.refusal(addrs[0], host) if addrs else "no address"
        raise EgressRefused(f"refused by the egress policy: {host} -> {reason} "
                            "(loopback, link-local, private and CGNAT destinations are blocked; "
                            "the run's network.allow lists exceptions)")
    return allowed


class PolicyBackend(httpcore.AsyncNetworkBackend):
    """httpcore's connector with the policy in front: connects only to checked addresses."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.inner = httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None, socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        last: Exception | None = None
        for addr in await resolve_checked(host, port, self.policy, timeout or CONNECT_TIMEOUT):
            try:
                return await self.inner.connect_tcp(addr, port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                last = e  # the next address of the same host, as a resolver-order client would
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        raise EgressRefused("unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class PolicyTransport(httpx.AsyncHTTPTransport):
    """httpx's transport whose connection pool connects through PolicyBackend.

    httpx takes no network backend argument, so the pool it built is replaced by one built the
    same way plus ours (httpx 0.28's `_pool`; pinned in constraints.txt). No proxy from the
    environment: a proxy would connect on our behalf, unchecked."""

    def __init__(self, policy: Policy, limits: httpx.Limits) -> None:
        super().__init__(trust_env=False, limits=limits)
        ssl_context = httpx.create_ssl_context(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context, max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections, keepalive_expiry=limits.keepalive_expiry,
            network_backend=PolicyBackend(policy),
        )


def refusal_of(exc: BaseException) -> str | None:
    """The policy's message when `exc` (an httpx error) came from a refused destination."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, EgressRefused):
            return str(seen)
        seen = seen.__cause__ or seen.__context__
    return None


async def precheck_url(url: str, policy: Policy) -> str | None:
    """Why `url`'s host is refused (for a clear early answer), or None; the connect-time check
    (proxy/transport) stays the authority."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return f"invalid URL: {e}"
    if not host:
        return None
    try:
        await resolve_checked(host, port, policy)
    except EgressRefused as e:
        return str(e)
    except httpcore.ConnectError:
        return None  # unresolvable: let the fetch report it in its own words
    return None
