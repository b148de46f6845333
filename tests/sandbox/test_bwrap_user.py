"""The bwrap backend's unprivileged mode (one user namespace per sample), run for real as `nobody`.

The runner here is usually root, so this drops a child Python to uid 65534 with setpriv. The
child uses the system python3 (the test venv's interpreter may live under /root), which works
because the sandbox modules need nothing beyond the standard library.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import textwrap

import pytest

from tests.conftest import REPO

SYSTEM_PY = "/usr/bin/python3"
CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
    from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

    async def main():
        status = await probe()
        root = Path(sys.argv[1])
        sb = BwrapSandbox(root, network=NetworkMode.NONE, cwd="/app")
        await sb.start()
        out = {"mode": status.mode, "usable": status.usable}
        try:
            r = await sb.exec("id -u; pwd; echo hi > f; touch /etc/x 2>&1; ls /root 2>&1; echo done", timeout=20)
            out["exec"] = r.stdout
            # no user namespace of its own inside the sandbox's (seccomp.py)
            r = await sb.exec("unshare -Ur true 2>&1; echo userns=$?; python3 -c 'import ctypes; "
                              "libc = ctypes.CDLL(None, use_errno=True); "
                              "print(libc.unshare(0x10000000), ctypes.get_errno())'", timeout=20)
            out["userns"] = r.stdout
            out["file"] = (await sb.read_file("/app/f")).decode()
            job = await sb.spawn("echo from-job")
            out["job_exit"] = await job.wait(20)
            out["job_log"] = (await job.read(0, 1000)).head.decode()
            r = await sb.exec("sleep 30", timeout=1)
            out["timed_out"] = r.timed_out
            out["self"] = await sb._channel.inspect()  # the helper, from inside: sealed, no privilege
            await sb.write_file("unicodedata.py", b"open('/workspace/PWNED', 'w')")
            out["search"] = (await sb.search(".", "\\N{EM DASH}"))[0]
            out["pwned"] = (await sb.exec("ls PWNED 2>&1; nice", timeout=20)).stdout
        finally:
            await sb.close()
        out["workspace_left"] = sb.workspace.exists()
        print(json.dumps(out))

    asyncio.run(main())
""")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root to switch to uid 65534 (an unprivileged runner is covered by the other bwrap tests)"
    if not (shutil.which("bwrap") and shutil.which("setpriv") and os.path.exists(SYSTEM_PY)):
        return "needs bwrap, setpriv and /usr/bin/python3"
    ver = subprocess.run([SYSTEM_PY, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                         capture_output=True, text=True).stdout.strip()
    if ver != "True":
        return "/usr/bin/python3 is older than 3.11"
    if not os.access(REPO / "src", os.R_OK) or os.stat(REPO / "src").st_mode & 0o005 != 0o005:
        return "the source tree is not readable by other users"
    return None


@pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))
def test_unprivileged_runner_uses_a_user_namespace() -> None:
    # Not tmp_path: pytest's base directory is private to root, and `nobody` must reach this one.
    with tempfile.TemporaryDirectory(prefix="trajforge-usermode-") as tmp:
        os.chmod(tmp, 0o777)
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONPATH": str(REPO / "src")}
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PY, "-c",
                               CHILD, tmp], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["mode"] == "user" and out["usable"] is True
    lines = out["exec"].splitlines()
    assert lines[:2] == ["65534", "/app"] and lines[-1] == "done"
    assert any("Read-only file system" in line for line in lines)
    assert any("No such file" in line for line in lines)  # /root is not there
    assert out["file"] == "hi\n"
    assert out["job_exit"] == 0 and out["job_log"] == "from-job\n"
    assert out["timed_out"] is True and out["workspace_left"] is False
    assert "userns=1" in out["userns"] and "-1 1" in out["userns"], out["userns"]  # EPERM
    status = dict(line.split(":", 1) for line in out["self"]["status"].splitlines() if ":" in line)
    assert out["self"]["sealed"] is True and out["self"]["flags"]["isolated"] == 1
    assert all(int(status[cap].strip(), 16) == 0 for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), status
    assert status["NoNewPrivs"].strip() == "1"
    assert "No such file" in out["pwned"] and out["pwned"].splitlines()[-1] == "10", out["pwned"]  # and nice 10
