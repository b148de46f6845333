"""Hermetic helpers, played by a hostile dataset and a hostile model: a row `cwd` over the runtime is
refused in every spelling, and a module planted where the helper would import from is never run.

The attack of issue 36: a row says `"cwd": "/root"` (above the runner's standard library), so the
workspace is mounted where the helper's `sys.path` points; the model writes `unicodedata.py`
there and calls `search_files` with `\\N{EM DASH}`, which makes `re` import `unicodedata`. Two
guards stop it, each tested with the other removed: the cwd policy (sandbox/cwd_policy.py) refuses
the row, and the helper loads no module after its start (sandbox/guard.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from trajforge.catalog.sandboxes import NetworkMode
import pytest

from tests.conftest import cli
from trajforge.dataset import load_dataset
from trajforge.errors import DatasetError
from trajforge.sandbox import cwd_policy
from trajforge.sandbox.inside import guard
from trajforge.sandbox.interface import FileOpError, SandboxError
from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.host.resources import ResourceLimits

STATUS = asyncio.run(probe())
STDLIB = sysconfig.get_paths()["stdlib"]  # where the runner's interpreter, and the zygote's, import from
ABOVE = os.path.dirname(os.path.dirname(os.path.dirname(STDLIB)))  # /root/.pyenv/versions, /usr...


def _spellings(path: str) -> list[str]:
    top = "/" + path.strip("/").split("/")[0]
    return [path, "/" + path, path + "/", path + "//", f"/./{path.lstrip('/')}", f"{top}/../{path.lstrip('/')}",
            path.replace("/", "//"), ABOVE, STDLIB]


@pytest.mark.parametrize("cwd", _spellings(STDLIB) + ["//usr/lib/python3", "/usr", "/etc/x", "/", "/bin/sub"])
def test_a_row_cwd_over_the_runtime_or_the_system_is_refused_with_its_line(tmp_path: Path, cwd: str) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "fine", "cwd": "/app"}) + "\n" + json.dumps({"prompt": "p", "cwd": cwd}) + "\n")
    with pytest.raises(DatasetError) as info:
        load_dataset(data)
    assert f"{data}:2: field 'cwd' " in "\n".join(info.value.problems), info.value.problems
    # in a container the image's own directories are the row's business (nothing of ours loads from them)
    if cwd != "/":
        assert len(load_dataset(data, host_cwd=False).samples) == 2


def test_a_cwd_through_a_host_link_to_the_runtime_is_the_runtime(tmp_path: Path) -> None:
    link = Path("/tmp") / f"trajforge-link-to-runtime-{os.getpid()}"
    link.symlink_to(STDLIB)
    try:
        assert "runtime" in (cwd_policy.problem(str(link / "sub")) or "")
    finally:
        link.unlink()
    assert cwd_policy.problem("/app/sub") is None and cwd_policy.problem("src/lib") is None


def test_a_long_cwd_is_a_clear_refusal_never_a_traceback(tmp_path: Path, clean_env: dict[str, str], server) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "p", "cwd": "/" + "a" * 5000}) + "\n")
    res = subprocess.run(cli("run", "--dataset_file", str(data), "--run_name", "r", "--output_dir", str(tmp_path / "out"),
                             "--base_url", server.url, "--model", "m"), env=clean_env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 1 and f"{data}:1: field 'cwd' is too long" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "out" / "r" / "trajectories.jsonl").exists()


def test_the_sandbox_layer_refuses_such_a_cwd_too(tmp_path: Path) -> None:
    """A row that reaches the sandbox some other way (a task format, a library caller) is refused there."""
    from trajforge.config import RunConfig
    from trajforge.sandbox.factory import SandboxProvider

    async def main() -> None:
        async with SandboxProvider(RunConfig(sandbox="local").sandbox_settings()) as p:
            for cwd in (ABOVE, "//usr/lib", "/" + "x" * 5000):
                with pytest.raises(SandboxError, match="the row's cwd"):
                    await p.create(cwd=cwd, image=None, root=tmp_path)

    asyncio.run(main())


# What a planted module does if it ever runs: leaves a mark the test can see, as the sample.
PAYLOAD = "open('/workspace/PWNED-{name}', 'w').write('ran')\n"
PLANTED = ("unicodedata", "fnmatch", "sre_parse", "_strptime", "locale", "json", "encodings/cp1252", "encodings/idna",
           "encodings/utf_16", "tokenize", "linecache", "string")


@pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root", reason=f"needs root-mode bwrap ({STATUS.detail})")
def test_a_module_planted_where_the_helper_imports_from_never_runs(tmp_path: Path) -> None:
    """The cwd policy is left out here (BwrapSandbox is made directly): the workspace is mounted
    over the runner's standard library, the model plants modules there and drives every file
    operation with what makes Python import lazily. Nothing planted runs; the helper answers."""
    assert cwd_policy.problem(STDLIB) is not None  # (the policy would have refused this row)

    async def main() -> None:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE, cwd=STDLIB, sample_limits=ResourceLimits(disk=64 << 20))
        await sb.start()
        try:
            assert sb.cwd == STDLIB
            for name in PLANTED:
                await sb.write_file(f"{name}.py", PAYLOAD.format(name=name.replace("/", "-")).encode())
            await sb.write_file("encodings/__init__.py", PAYLOAD.format(name="encodings").encode())
            assert "unicodedata.py" in (await sb.exec("ls", timeout=10)).stdout  # planted where sys.path points
            await sb.write_file("text.txt", "caf\u00e9 \u2014 done\n".encode())
            await sb.write_file("latin.txt", b"caf\xe9\n")
            calls = [sb.search(".", pattern) for pattern in
                     ("\\N{EM DASH}", "(?i)CAF\u00c9", "\\w+\\s\\N{EM DASH}", "[[:alpha:]]", "caf\\xe9")]
            for glob in ("*.txt", "**/*.py", "[!a]*", "*.[tT][xX][tT]"):
                calls += [sb.search(".", "done", glob=glob), sb.search(".", "text", target="files", glob=glob)]
            calls += [sb.read_file("latin.txt"), sb.read_file("text.txt", offset=3),
                      sb.write_file("new.txt", "\u2014".encode("utf-16"), how="new")]
            for call in calls:
                try:
                    await call
                except FileOpError:
                    pass  # an error for the model is fine; running the planted module is not
            assert (await sb.exec("echo alive", timeout=10)).stdout == "alive\n"
            leftovers = (await sb.exec("ls PWNED-* 2>/dev/null; true", timeout=10)).stdout
            assert leftovers == "", leftovers
            assert sb._channel is not None and (await sb._channel.inspect())["sealed"] is True
        finally:
            await sb.close()

    asyncio.run(main())


def test_the_seal_refuses_every_new_import_and_keeps_what_is_loaded(tmp_path: Path) -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from trajforge.sandbox.inside import guard\n"
        "guard.preload(); guard.seal()\n"
        "import re, unicodedata; re.compile('\\\\N{EM DASH}')\n"
        "for name in ('json', 'csv', 'planted'):\n"
        "    try:\n"
        "        __import__(name); print('LOADED', name)\n"
        "    except ImportError as e:\n"
        "        print('refused', name)\n"
        "print(b'x'.decode('cp1252', 'replace') if False else 'ok')\n"
        "try:\n"
        "    b'x'.decode('cp1252')\n"
        "except LookupError:\n"
        "    print('codec refused')\n"
    )
    planted = tmp_path
    (planted / "planted.py").write_text("print('PLANTED RAN')\n")
    src = str(Path(guard.__file__).parents[3])
    res = subprocess.run([sys.executable, "-I", "-c", code, src], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin"}, cwd=planted)
    assert res.returncode == 0, res.stderr
    assert "LOADED" not in res.stdout and "PLANTED RAN" not in res.stdout, res.stdout
    refused = [line for line in res.stdout.splitlines() if line.startswith("refused ")]
    assert len(refused) == 3 and "codec refused" in res.stdout and "ok" in res.stdout, res.stdout
