"""Network targets for the egress tests, all on this machine (no traffic leaves it).

- `host_server(ip)`: an HTTP server on the host at `ip` (added to `lo` for the test when it is not
  already there, e.g. 169.254.169.254 standing in for a cloud metadata service, or a private
  address), answering every GET with a secret token.
- `public_server()`: a "public" server: a network namespace created for the test, joined to the
  host by a veth pair on TEST-NET-3 (203.0.113.0/24, documentation addresses that are not in any
  blocked range), serving a token from inside that namespace. The host routes to it over the
  veth, so a sandbox in egress mode reaching it goes the way internet traffic would (through the
  user-mode stack, then the host's routing), without leaving the machine.
Both need root (ip addr/netns); `net_admin_reason()` says why not when they cannot be had.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field


@functools.lru_cache(maxsize=1)
def net_admin_reason() -> str | None:
    """None when this process may add addresses and network namespaces (tried for real)."""
    if os.geteuid() != 0:
        return "needs root to add addresses and network namespaces"
    if shutil.which("ip") is None:
        return "needs iproute2 (ip)"
    name = f"tfprobe{secrets.token_hex(3)}"
    res = _ip("netns", "add", name)
    if res.returncode != 0:
        return f"cannot create a network namespace: {res.stderr.strip()[:200]}"
    _ip("netns", "del", name)
    return None


@dataclass
class Target:
    url: str
    token: str
    hits: list[str] = field(default_factory=list)  # paths requested (host_server only)


def _handler(token: str, hits: list[str]) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            hits.append(self.path)
            body = f"<html><head><title>secret</title></head><body>{token}</body></html>".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def host_server(ip: str) -> Iterator[Target]:
    added = False
    if _ip("-o", "addr", "show", "dev", "lo").stdout.find(f" {ip}/") < 0:
        res = _ip("addr", "add", f"{ip}/32", "dev", "lo")
        assert res.returncode == 0, res.stderr
        added = True
    token = "secret-" + secrets.token_hex(6)
    hits: list[str] = []
    server = http.server.ThreadingHTTPServer((ip, 0), _handler(token, hits))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Target(f"http://{ip}:{server.server_address[1]}/", token, hits)
    finally:
        server.shutdown()
        server.server_close()
        if added:
            _ip("addr", "del", f"{ip}/32", "dev", "lo")


# /r?<url>: a redirect to <url>; /p?<url>: a page loading <url> as image, iframe, fetch and
# websocket (a hostile page inside the browser); anything else: the token.
_SERVE = ("import http.server,sys,urllib.parse\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        path,_,q=self.path.partition('?'); q=urllib.parse.unquote(q)\n"
          "        if path=='/r':\n"
          "            self.send_response(302); self.send_header('Location',q); self.send_header('Content-Length','0')\n"
          "            self.end_headers(); return\n"
          "        body=sys.argv[2]\n"
          "        if path=='/p':\n"
          "            w=q.replace('http://','ws://')\n"
          "            body+=f'<img src=\"{q}img\"><iframe src=\"{q}frame\"></iframe><script>fetch(\"{q}fetch\")'\n"
          "            body+=f';try{{new WebSocket(\"{w}ws\")}}catch(e){{}}</script>'\n"
          "        b=('<html><head><title>public</title></head><body>'+body+'</body></html>').encode()\n"
          "        self.send_response(200); self.send_header('Content-Type','text/html')\n"
          "        self.send_header('Content-Length',str(len(b))); self.end_headers(); self.wfile.write(b)\n"
          "    def log_message(self,*a): pass\n"
          "http.server.ThreadingHTTPServer((sys.argv[1],8080),H).serve_forever()\n")


@contextlib.contextmanager
def public_server() -> Iterator[Target]:
    tag = secrets.token_hex(3)
    ns, host_if, ns_if = f"tfpub{tag}", f"tfh{tag}", f"tfn{tag}"
    octet = 16 + secrets.randbelow(60) * 4  # a /30 of TEST-NET-3 per test run
    host_ip, ns_ip = f"203.0.113.{octet + 1}", f"203.0.113.{octet + 2}"
    token = "public-" + secrets.token_hex(6)
    proc = None
    try:
        for args in (("netns", "add", ns), ("link", "add", host_if, "type", "veth", "peer", "name", ns_if,
                                            "netns", ns),
                     ("addr", "add", f"{host_ip}/30", "dev", host_if), ("link", "set", host_if, "up"),
                     ("-n", ns, "addr", "add", f"{ns_ip}/30", "dev", ns_if), ("-n", ns, "link", "set", ns_if, "up"),
                     ("-n", ns, "link", "set", "lo", "up")):
            res = _ip(*args)
            assert res.returncode == 0, (args, res.stderr)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", _SERVE, ns_ip, token])
        url = f"http://{ns_ip}:8080/"
        deadline = time.monotonic() + 10
        while True:  # the server is another process: wait until it answers
            try:
                with urllib.request.urlopen(url, timeout=1) as r:
                    assert token in r.read().decode()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield Target(url, token)
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        _ip("link", "del", host_if)
        _ip("netns", "del", ns)
