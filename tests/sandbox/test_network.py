"""Network modes and the egress policy, played as a hostile model would.

Targets (tests/support/nettargets.py): the runner's loopback, 169.254.169.254 bound on the host's
`lo` (a stand-in for a cloud metadata service), a private address bound on `lo`, the host's own
address, another sample's loopback server, and a "public" server in a test network namespace
reached over a veth pair on TEST-NET-3. Nothing leaves this machine.
"""

from __future__ import annotations

import asyncio
import shutil
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from tests.conftest import cli
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.nettargets import Target, host_server, net_admin_reason, public_server
from tests.support.policies import tool_messages, user_prompt
from tests.support.scripted_server import Recorded, Reply, ScriptedServer, chat, tool_call
from tests.support.web_fixture import WebFixture
from tests.support.run_state import read_records
from trajforge.config import RunConfig
from trajforge.netpolicy import make_policy
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox, bwrap_argv
from trajforge.sandbox.network import egress_support, ruleset

EGRESS = asyncio.run(egress_support("bwrap"))
needs_egress = pytest.mark.skipif(not EGRESS.usable, reason=f"egress not available here: {EGRESS.detail}")
needs_net_admin = pytest.mark.skipif(net_admin_reason() is not None, reason=net_admin_reason() or "")
CURL = "curl -sS -m 5 {url}; rc=$?; echo; echo curl=$rc"


def test_policy_refuses_internal_ranges_and_honours_allow() -> None:
    policy = make_policy(include_host=False)
    for ip in ("127.0.0.1", "169.254.169.254", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1",
               "0.0.0.0", "224.0.0.1", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254"):
        assert policy.refusal(ip) is not None, ip
    for ip in ("203.0.113.9", "8.8.8.8", "2606:4700::1111"):
        assert policy.refusal(ip) is None, ip
    allowed = make_policy(["127.0.0.0/8", "internal.example"], include_host=False)
    assert allowed.refusal("127.0.0.5") is None and allowed.refusal("10.0.0.1") is not None
    assert allowed.refusal("10.0.0.1", "Internal.Example.") is None  # host names match case-insensitively
    assert "link-local" in (policy.refusal("169.254.169.254") or "")


def test_config_modes_and_alias() -> None:
    assert RunConfig().sandbox_network == "auto"
    assert RunConfig(sandbox_network="on").sandbox_network == "host"  # configs from before egress
    with pytest.raises(ValueError):
        RunConfig(network={"allow": ["http://x/"]})
    assert RunConfig(network={"allow": ["10.0.0.0/8", "db.internal"]}).network.allow == ["10.0.0.0/8", "db.internal"]


def test_ruleset_blocks_every_range_and_tmpfs_sizes_precede_their_mounts() -> None:
    rules = ruleset(["10.9.0.0/16", "1password.example", "fd12::/16"])
    assert "1password" not in rules and "fd12::/16 } accept" in rules  # names are for runner fetches only
    for net in ("127.0.0.0/8", "169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                "100.64.0.0/10", "fc00::/7", "fe80::/10"):
        assert net in rules
    assert rules.index("10.9.0.0/16 } accept") < rules.index("reject")
    argv = bwrap_argv("bwrap", layout=[], binds=[], chdir="/", network=False, privileged=True,
                      tmp_size=1 << 20, shm_size=2 << 20)
    joined = " ".join(argv)
    assert f"--size {2 << 20} --perms 1777 --tmpfs /dev/shm" in joined
    assert f"--size {1 << 20} --perms 1777 --tmpfs /tmp" in joined


async def _curl(sb: BwrapSandbox, url: str) -> str:
    res = await sb.exec(CURL.format(url=url), timeout=30)
    return res.stdout + res.stderr


@needs_egress
@needs_net_admin
def test_egress_reaches_the_public_server_and_nothing_internal(tmp_path: Path) -> None:
    async def main() -> None:
        with host_server("127.0.0.1") as runner_lo, host_server("169.254.169.254") as metadata, \
                host_server("10.231.7.1") as private, public_server() as public:
            a = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS)
            b = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS)
            host = BwrapSandbox(tmp_path, network=NetworkMode.HOST)
            for sb in (a, b, host):
                await sb.start()
            try:
                out = await _curl(a, public.url)
                assert public.token in out and "curl=0" in out, out  # the internet-facing path works
                for target in (runner_lo, metadata, private):
                    out = await _curl(a, target.url)
                    assert target.token not in out and "curl=0" not in out, (target.url, out)
                    # the same targets answer from the host network: the test's targets are real
                    assert metadata.token in await _curl(host, metadata.url)
                port = runner_lo.url.rsplit(":", 1)[1].strip("/")
                for via in (f"http://10.0.2.2:{port}/", "http://192.0.2.2:22/", "http://10.0.2.3:80/"):
                    out = await _curl(a, via)  # slirp's gateway/DNS address and the host's own address
                    assert "curl=0" not in out and runner_lo.token not in out, (via, out)
                # sample A serves a secret on its loopback; sample B's 127.0.0.1 is its own
                await a.write_file("secret.txt", b"sample-a-secret")
                await a.spawn("exec python3 -m http.server 18765 --bind 127.0.0.1")
                out = await a.exec("for i in $(seq 50); do curl -sS -m 2 http://127.0.0.1:18765/secret.txt && "
                                   "break; sleep 0.1; done", timeout=30)
                assert "sample-a-secret" in out.stdout, out
                out_b = await _curl(b, "http://127.0.0.1:18765/secret.txt")
                assert "sample-a-secret" not in out_b and "curl=0" not in out_b
                iptables = await a.exec("nft flush ruleset; echo nft=$?", timeout=30)
                assert "nft=0" not in iptables.stdout  # no capabilities: the firewall stays
                assert metadata.token not in await _curl(a, metadata.url)
            finally:
                for sb in (a, b, host):
                    await sb.close()

    asyncio.run(main())


@needs_egress
@pytest.mark.skipif(shutil.which("ip") is None, reason="needs iproute2's ip")
def test_the_run_s_router_leaves_the_host_s_shared_mounts_alone(tmp_path: Path) -> None:
    """slirp4netns 1.2.0's --enable-sandbox detached the host's shared mounts: every `ip netns`
    namespace lost its mount under /run/netns, and with them every Podman container's, after
    which `podman ps` failed on the host. The router starts it in a private mount namespace."""
    name = f"tf-probe-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        assert f"/run/netns/{name} " in Path("/proc/self/mountinfo").read_text()

        async def main() -> None:
            sb = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS)
            await sb.start()
            try:
                assert (await sb.exec("echo up", timeout=30)).stdout == "up\n"
            finally:
                await sb.close()

        asyncio.run(main())
        assert f"/run/netns/{name} " in Path("/proc/self/mountinfo").read_text()
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


@needs_egress
def test_egress_samples_resolve_through_slirp_and_the_run_leaves_no_file_behind(tmp_path: Path) -> None:
    """The resolv.conf naming slirp's DNS forwarder is a file of the run's /etc, which lives in the
    template's own tmpfs (etc_copy.py): before, every run left a /tmp/trajforge-net-* directory
    holding it."""
    import tempfile

    def leftovers() -> set[str]:
        return {p.name for p in Path(tempfile.gettempdir()).glob("trajforge-net-*")}

    async def main() -> None:
        before = leftovers()
        sb = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS)
        await sb.start()
        try:
            out = await sb.exec("cat /etc/resolv.conf; echo x >> /etc/resolv.conf && echo wrote", timeout=30)
            mounts = await sb.exec("grep -e resolv.conf -e ' /etc ' /proc/self/mountinfo", timeout=30)
        finally:
            await sb.close()
        assert "nameserver 10.0.2.3" in out.stdout and "wrote" not in out.stdout, out
        assert "trajforge-net-" not in mounts.stdout and "resolv.conf" not in mounts.stdout, mounts  # no host file
        assert " / /etc ro," in mounts.stdout and " overlay " in mounts.stdout, mounts  # the sandbox's own /etc
        assert leftovers() <= before

    asyncio.run(main())


def hostile_policy(req: Recorded) -> Reply:
    """The prompt is a JSON list of [tool, arguments]; one call per turn, then an answer."""
    plan: list[list[Any]] = json.loads(user_prompt(req.body))
    done = len(tool_messages(req.body))
    if done < len(plan):
        name, args = plan[done]
        return chat(None, tool_calls=[tool_call(name, args)], reasoning=f"try {name}")
    return chat("done", reasoning="finished")


def run_hostile(tmp_path: Path, server: ScriptedServer, site: WebFixture, mode: str, plan: list[list[Any]],
                env: dict[str, str], toolsets: str = "{terminal: 100, web: 100, browser: 100, vision: 100}"
                ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any], list[str]]:
    server.handler = hostile_policy
    (tmp_path / "ds.jsonl").write_text(json.dumps({"prompt": json.dumps(plan)}) + "\n")
    (tmp_path / "cfg.yaml").write_text(f"tools:\n  web:\n    searxng_url: {site.base}\n  browser:\n"
                                       f"    navigation_timeout: 5\ndistributions:\n  net:\n    toolsets: {toolsets}\n")
    proc = subprocess.run(
        cli("run", "--dataset_file=ds.jsonl", "--batch_size=1", f"--run_name=net-{mode}", f"--base_url={server.url}",
            "--model=scripted", "--distribution=net", "--config=cfg.yaml", f"--sandbox_network={mode}",
            "--max_turns=20", "--tool_timeout=20"),
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    [record] = read_records(tmp_path / "data" / f"net-{mode}")
    offered = [t["function"]["name"] for t in server.chat_requests()[0]["tools"]]
    return proc, record, offered


def results(record: dict[str, Any]) -> list[str]:
    import re

    return [block for turn in record["conversations"] if turn["from"] == "tool"
            for block in re.findall(r"<tool_response>\n(.*?)\n</tool_response>", turn["value"], re.S)]


def fetch_plan(targets: list[Target]) -> list[list[Any]]:
    plan: list[list[Any]] = []
    for t in targets:
        plan += [["web_extract", {"urls": [t.url]}], ["browser_navigate", {"url": t.url}],
                 ["browser_snapshot", {}], ["vision_analyze", {"image_url": t.url, "question": "what?"}]]
    return plan


@needs_net_admin
@pytest.mark.parametrize("mode", ["host", "egress"])
def test_hostile_model_fetches_are_refused_in_every_mode(tmp_path: Path, server: ScriptedServer, mode: str,
                                                         clean_env: dict[str, str]) -> None:
    if mode == "egress" and not EGRESS.usable:
        pytest.skip(f"egress not available here: {EGRESS.detail}")
    pytest.importorskip("playwright")
    runner_lo = Target(server.url + "/models", "scripted")  # the runner's own model server
    with WebFixture() as site, host_server("169.254.169.254") as metadata, host_server("10.231.7.1") as private, \
            public_server() as public:
        targets = [metadata, private]
        plan = fetch_plan([runner_lo, *targets]) + [["web_extract", {"urls": [public.url]}]]
        if mode == "egress":
            plan += [["terminal", {"command": CURL.format(url=t.url)}] for t in [*targets, public]]
            plan.append(["terminal", {"command": CURL.format(url=runner_lo.url)}])
        proc, record, offered = run_hostile(tmp_path, server, site, mode, plan, clean_env)
    outs = results(record)
    assert len(outs) == len(plan), outs
    assert {"web_extract", "browser_navigate", "vision_analyze"} <= set(offered)
    for (name, args), out in zip(plan, outs, strict=True):
        text = json.dumps(args)
        if public.url in text:
            assert public.token in out, out  # the internet-facing path works
            continue
        if name == "browser_snapshot":
            assert metadata.token not in out and private.token not in out
            continue
        for t in targets:
            assert t.token not in out, (name, args, out)
        assert '"object"' not in out, (name, out)  # the model server's /models answer
        if name != "terminal":
            assert "egress policy" in out or "refused" in out, (name, out)
    assert not [r for r in server.requests if r.path.endswith("/models")]


@needs_egress
def test_none_mode_offers_no_tool_that_fetches_model_urls(tmp_path: Path, server: ScriptedServer,
                                                          clean_env: dict[str, str]) -> None:
    with WebFixture() as site:
        plan = [["vision_analyze", {"image_url": site.url("/image.png"), "question": "what?"}],
                ["terminal", {"command": "curl -sS -m 3 http://1.1.1.1/; echo curl=$?"}]]
        proc, record, offered = run_hostile(tmp_path, server, site, "none", plan, clean_env)
    assert "web_search" in offered and "web_extract" not in offered
    assert not any(n.startswith("browser_") for n in offered) and "vision_analyze" in offered
    vision, terminal = results(record)
    assert "--sandbox_network none" in vision and "curl=0" not in terminal
    assert not [r for r in site.requests if r.path.endswith("/image.png")]


def test_auto_falls_back_to_host_with_a_note_and_explicit_egress_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge.errors import UsageError
    from trajforge.runner.preflight import check_network
    from trajforge.sandbox import network

    monkeypatch.setitem(network._support, "bwrap", network.EgressSupport(False, "no slirp4netns here"))
    mode, note = asyncio.run(network.resolve_mode(RunConfig().sandbox_settings()))
    assert mode == "host" and note is not None and "no slirp4netns here" in note and "host" in note
    with pytest.raises(UsageError, match="egress is not available.*no slirp4netns here"):
        asyncio.run(network.resolve_mode(RunConfig(sandbox_network="egress").sandbox_settings()))
    assert asyncio.run(network.resolve_mode(RunConfig(sandbox_network="none").sandbox_settings())) == ("none", None)
    mode, settings = check_network(RunConfig(sandbox_network="auto").sandbox_settings())
    assert mode == "host" and settings.network == NetworkMode.HOST  # fixed for the whole run


def test_explicit_egress_that_cannot_be_had_is_refused_before_any_work(
        tmp_path: Path, server: ScriptedServer, clean_env: dict[str, str]) -> None:
    (tmp_path / "ds.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    env = clean_env  # the local backend has no network namespace: egress cannot be had with it
    proc = subprocess.run([sys.executable, "-m", "trajforge", "run", "--dataset_file=ds.jsonl", "--batch_size=1",
                           "--run_name=x", f"--base_url={server.url}", "--model=m", "--sandbox=local",
                           "--sandbox_network=egress"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    # preflight's contradiction check names it before the network probe would (the probe's own
    # refusal: test_auto_falls_back_to_host_with_a_note_and_explicit_egress_is_refused)
    assert "--sandbox local cannot apply --sandbox_network egress" in proc.stderr and "Traceback" not in proc.stderr
    assert server.chat_requests() == [] and not (tmp_path / "data" / "x").exists()


def test_doctor_reports_network_modes_and_limits(clean_env: dict[str, str]) -> None:
    proc = subprocess.run(cli("doctor", "--json"), env=clean_env, capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout)
    assert report["network"]["egress"]["usable"] == EGRESS.usable
    assert report["network"]["auto"] == ("egress" if EGRESS.usable else "host")
    assert set(report["limits"]) >= {"sandbox_memory", "sandbox_tmp_size", "sandbox_shm_size", "sandbox_disk",
                                     "sandbox_cpu_seconds"}
    text = subprocess.run(cli("doctor"), env=clean_env, capture_output=True, text=True, timeout=120).stdout
    assert "network modes" in text and "sandbox_disk" in text and "--sandbox_network auto uses:" in text
    if os.geteuid() == 0 and Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists():
        assert "memory cgroup" in report["limits"]["sandbox_memory"]["enforced_by"]


@needs_net_admin
def test_container_egress_and_limits(tmp_path: Path, busybox_image: str, podman: Any) -> None:  # noqa: F811
    from trajforge.sandbox.interface import SandboxError
    from tests.support.sandboxes import create_sandbox

    cfg = RunConfig(container_engine="podman", run_name=f"nettest-{os.getpid()}", sandbox_network="egress",
                    sandbox_tmp_size="8m", sandbox_disk="64m")
    # busybox's static wget crashes in this image (NSS); nc speaks HTTP/1.0 well enough.
    wget = 'u={url}; h=${{u#http://}}; h=${{h%%/*}}; printf "GET / HTTP/1.0\\r\\n\\r\\n" | nc -w 5 ${{h%:*}} ${{h#*:}}; ' \
           'rc=$?; echo; echo wget=$rc'

    async def main() -> None:
        with host_server("127.0.0.1") as runner_lo, host_server("169.254.169.254") as metadata, \
                host_server("10.231.7.1") as private, public_server() as public:
            sb = await create_sandbox(cfg, cwd=None, image=busybox_image, root=tmp_path)
            try:
                out = (await sb.exec(wget.format(url=public.url), timeout=30)).stdout
                assert public.token in out, out
                port = runner_lo.url.rsplit(":", 1)[1]
                for url in (metadata.url, private.url, f"http://10.0.2.2:{port}", runner_lo.url, "http://192.0.2.2:22/"):
                    res = await sb.exec(wget.format(url=url), timeout=30)
                    assert "secret-" not in res.stdout and "SSH" not in res.stdout, (url, res)
                res = await sb.exec("df -k /tmp /workspace | tail -2", timeout=30)
                sizes = [int(line.split()[1]) for line in res.stdout.splitlines()]
                assert sizes[0] == 8 << 10 and sizes[1] <= 64 << 10, res
                with pytest.raises(SandboxError, match="sandbox_tmp_size"):
                    await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=20", timeout=30)
            finally:
                await sb.close()

    asyncio.run(main())


async def _call(toolset: Any, name: str, args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    tool = next(t for t in toolset.tools if t.name == name)
    return json.loads(await tool.run(args, ctx))


@needs_net_admin
def test_browser_subresources_redirects_and_websockets_go_through_the_policy(tmp_path: Path) -> None:
    """A public page that loads internal URLs as image, iframe, fetch and websocket, and a public
    redirect to the metadata address: nothing internal is ever requested."""
    pytest.importorskip("playwright")
    from tests.support.toolsets import run_with
    from trajforge.tools.browser import toolset as browser

    cfg = RunConfig(tools={"browser": {"navigation_timeout": 5, "action_timeout": 5}})
    with host_server("169.254.169.254") as metadata, host_server("127.0.0.1") as runner_lo, public_server() as public:
        async def body(toolset: Any, ctx: Any) -> None:
            for inner in (metadata, runner_lo):
                page = await _call(toolset, "browser_navigate", {"url": f"{public.url}p?{inner.url}"}, ctx)
                assert page["success"], page
                snap = await _call(toolset, "browser_snapshot", {}, ctx)
                assert public.token in snap["snapshot"] and inner.token not in json.dumps(snap)
                await asyncio.sleep(1)  # let the page's fetch, iframe and websocket try
                moved = await _call(toolset, "browser_navigate", {"url": f"{public.url}r?{inner.url}"}, ctx)
                assert not moved["success"] or inner.token not in json.dumps(moved), moved
                snap = await _call(toolset, "browser_snapshot", {}, ctx)
                assert inner.token not in json.dumps(snap)
            # a name that resolves to loopback is refused on its address, not its spelling
            port = runner_lo.url.rsplit(":", 1)[1].strip("/")
            named = await _call(toolset, "browser_navigate", {"url": f"http://localhost:{port}/"}, ctx)
            assert not named["success"] and "egress policy" in named["error"]
            refused = toolset.proxy.refused
            assert any(r.startswith("169.254.169.254:") for r in refused), refused

        run_with(tmp_path, browser.build, cfg, body)
        assert metadata.hits == [] and runner_lo.hits == []


@needs_net_admin
def test_web_extract_and_vision_refuse_redirects_and_names_to_internal_addresses(tmp_path: Path) -> None:
    from tests.support.toolsets import run_with
    from trajforge.tools import vision
    from trajforge.tools.web import toolset as web

    with WebFixture() as site, host_server("169.254.169.254") as metadata, public_server() as public:
        cfg = RunConfig.model_validate({"tools": {"web": {"searxng_url": site.base}}, "base_url": site.base})
        port = metadata.url.rsplit(":", 1)[1].strip("/")

        async def web_body(toolset: Any, ctx: Any) -> None:
            hop = await _call(toolset, "web_extract", {"urls": [f"{public.url}r?{metadata.url}"]}, ctx)
            assert not hop["success"] and "169.254.169.254" in hop["error"] and "egress policy" in hop["error"]
            named = await _call(toolset, "web_extract", {"urls": [f"http://localhost:{site.base.rsplit(':', 1)[1]}/"]},
                                ctx)
            assert not named["success"] and "loopback" in named["error"]
            ok = await _call(toolset, "web_extract", {"urls": [public.url]}, ctx)
            assert ok["success"] and public.token in ok["results"][0]["content"]
            found = await _call(toolset, "web_search", {"query": "tides"}, ctx)  # the user's SearXNG on loopback
            assert found["success"], found

        async def vision_body(toolset: Any, ctx: Any) -> None:
            hop = await _call(toolset, "vision_analyze", {"image_url": f"{public.url}r?{metadata.url}",
                                                          "question": "?"}, ctx)
            assert not hop["success"] and "egress policy" in hop["error"]
            ipv6 = await _call(toolset, "vision_analyze", {"image_url": f"http://[::ffff:169.254.169.254]:{port}/",
                                                           "question": "?"}, ctx)
            assert not ipv6["success"] and "link-local" in ipv6["error"], ipv6

        run_with(tmp_path, lambda c: web.build(c, {}), cfg, web_body)
        vcfg = RunConfig.model_validate({"base_url": site.base, "model": "m", "api_key": "k"})
        run_with(tmp_path, vision.build, vcfg, vision_body)
        assert metadata.hits == []


@needs_egress
@needs_net_admin
def test_network_allow_opens_a_private_range_for_samples(tmp_path: Path) -> None:
    async def main() -> None:
        with host_server("10.231.7.1") as private, host_server("10.231.8.1") as other:
            sb = BwrapSandbox(tmp_path, network=NetworkMode.EGRESS, allow=["10.231.7.0/24"])
            await sb.start()
            try:
                assert private.token in await _curl(sb, private.url)
                assert other.token not in await _curl(sb, other.url)
            finally:
                await sb.close()

    asyncio.run(main())


def test_egress_proxy_forwards_allowed_requests_closing_and_refuses_the_rest() -> None:
    from trajforge.tools.web.egress_proxy import EGRESS_HEADER, EgressProxy

    async def ask(port: int, head: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        data = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        return data

    async def main(site: str) -> None:
        proxy = EgressProxy(make_policy(["127.0.0.1"], include_host=False))
        await proxy.start()
        try:
            host = site.split("//", 1)[1].rstrip("/")
            got = await ask(proxy.port, f"GET {site}/other.html HTTP/1.1\r\nHost: {host}\r\n"
                                        "Proxy-Connection: keep-alive\r\n\r\n".encode())
            head = got.split(b"\r\n\r\n", 1)[0].lower()
            assert b" 200 " in head and b"connection: close" in head and b"History of tidal mills" in got
            for request in (b"CONNECT 169.254.169.254:443 HTTP/1.1\r\n\r\n",
                            b"GET http://10.1.2.3/ HTTP/1.1\r\nHost: 10.1.2.3\r\n\r\n",
                            b"GET ftp://example.com/ HTTP/1.1\r\n\r\n"):
                got = await ask(proxy.port, request)
                assert got.startswith(b"HTTP/1.1 403") and EGRESS_HEADER.encode() in got, got
            assert proxy.refused == ["169.254.169.254:443", "10.1.2.3:80"]
        finally:
            await proxy.aclose()

    with WebFixture() as site:
        asyncio.run(main(site.base))


@needs_net_admin
def test_a_name_is_resolved_once_and_the_checked_address_is_the_one_connected_to() -> None:
    """DNS rebinding: the resolver answers a public address first and loopback afterwards; the
    fetch connects to the checked public address and never asks again."""
    from trajforge.tools.web import fetch as http_fetch

    with public_server() as public, host_server("127.0.0.1") as runner_lo:
        public_ip = public.url.split("//")[1].split(":")[0]
        answers: list[str] = []

        async def main() -> http_fetch.Fetched:
            loop = asyncio.get_running_loop()
            real = loop.getaddrinfo

            async def rebinding(host: str, port: int, **kw: Any) -> Any:
                if host != "rebind.test":
                    return await real(host, port, **kw)
                answers.append(public_ip if not answers else "127.0.0.1")
                return await real(answers[-1], port, **kw)

            loop.getaddrinfo = rebinding  # type: ignore[method-assign]
            client = http_fetch.new_client(timeout=10, max_redirects=2, user_agent="t", policy=make_policy())
            try:
                return await http_fetch.fetch(client, "http://rebind.test:8080/", max_bytes=10_000, timeout=10)
            finally:
                await client.aclose()

        fetched = asyncio.run(main())
        assert public.token in fetched.body.decode() and answers == [public_ip]
        assert runner_lo.hits == []


@pytest.mark.parametrize("mode", ["egress", "host"])
def test_a_sample_cannot_reach_another_sample_s_loopback_server(tmp_path: Path, mode: str,
                                                                clean_env: dict[str, str]) -> None:
    """Sample A serves a secret on 127.0.0.1 while sample B polls that address. In egress mode B
    never gets it; in host mode (the opt-in shared network) it does, which shows the probe works."""
    if mode == "egress" and not EGRESS.usable:
        pytest.skip(f"egress not available here: {EGRESS.detail}")
    from tests.support.policies import prompt_command_policy

    with socket_port() as port:
        serve = (f"cd /tmp && echo sample-a-secret > s.txt && (python3 -m http.server {port} --bind 127.0.0.1 "
                 ">/dev/null 2>&1 &) ; sleep 8; echo A-done")
        poll = (f"for i in $(seq 30); do curl -s -m 1 http://127.0.0.1:{port}/s.txt && break; sleep 0.2; done; "
                "echo B-done")
        (tmp_path / "ds.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (serve, poll)))
        with ScriptedServer() as server:
            server.handler = prompt_command_policy
            proc = subprocess.run(
                cli("run", "--dataset_file=ds.jsonl", "--batch_size=2", "--run_name=pair", f"--base_url={server.url}",
                    "--model=scripted", "--distribution=terminal_only", f"--sandbox_network={mode}",
                    "--sandbox=bwrap", "--num_workers=2", "--tool_timeout=30"),
                cwd=tmp_path, env=clean_env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    records = read_records(tmp_path / "data" / "pair")
    outputs = {r["prompt_index"]: r["conversations"][-1]["value"] for r in records}
    assert "A-done" in outputs[0] and "B-done" in outputs[1]
    assert ("sample-a-secret" in outputs[1]) == (mode == "host"), outputs[1]


@contextlib.contextmanager
def socket_port() -> Any:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port


@needs_net_admin
def test_image_api_download_urls_go_through_the_policy(tmp_path: Path, server: ScriptedServer) -> None:
    """The image API is the user's endpoint (reachable although it is on loopback); a download URL
    it answers with that points at the metadata address is refused."""
    from tests.support.scripted_server import Reply
    from tests.support.toolsets import run_with
    from trajforge.tools import image_gen

    with host_server("169.254.169.254") as metadata:
        server.handler = lambda req: Reply(body={"created": 0, "data": [{"url": metadata.url + "img.png"}]})
        cfg = RunConfig.model_validate({"model": "m", "base_url": server.url, "api_key": "k",
                                        "tools": {"image_gen": {"response_format": "url"}}})

        async def body(toolset: Any, ctx: Any) -> None:
            got = json.loads(await toolset.tools[0].run({"prompt": "red"}, ctx))
            assert not got["success"] and "egress policy" in got["error"] and "link-local" in got["error"], got

        run_with(tmp_path, image_gen.build, cfg, body)
        assert len(server.requests) == 1 and metadata.hits == []


@needs_egress
def test_a_working_egress_probe_spares_the_bwrap_probe_a_second_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """The egress probe (preflight) is a root bwrap sandbox that worked: the backend's probe then
    needs no sandbox of its own, and still makes one when no egress probe ran."""
    from trajforge.sandbox.backends.bwrap import bwrap_backend

    started: list[bool] = []
    real_start = BwrapSandbox.start

    async def counting_start(self: BwrapSandbox) -> None:
        started.append(True)
        await real_start(self)

    monkeypatch.setattr(BwrapSandbox, "start", counting_start)
    status = asyncio.run(bwrap_backend.probe())
    assert status.usable and status.mode == "root" and "bubblewrap" in status.detail and started == []
    monkeypatch.setattr(bwrap_backend, "_proven", [])
    status = asyncio.run(bwrap_backend.probe())
    assert status.usable and started == [True]
