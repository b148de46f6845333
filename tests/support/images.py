"""Local container images for tests, built without any registry.

`localhost/trajforge-test-busybox` is a `podman import` of a root filesystem made from the
static busybox binary (Debian's busybox-static): /bin/busybox, a relative symlink per applet,
/tmp, a root account, `/image-marker.txt`, a file only this image has (tests prove a command
ran inside the image by reading it), and `/app/readme.txt` (content at a row's cwd). Built once
per test session; skips say exactly which tool is missing.
"""

from __future__ import annotations

import asyncio
import io
import shutil
import struct
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trajforge.sandbox.backends.container.engine import Engine, detect

TEST_IMAGE = "localhost/trajforge-test-busybox:latest"
MARKER = "trajforge test image marker 7f3a\n"
APP_README = "shipped in the image at /app\n"
MISSING_IMAGE = "localhost/trajforge-test-no-such-image:404"
_BUSYBOX_CANDIDATES = ("/bin/busybox", "/usr/bin/busybox")


def _is_static_elf(path: Path) -> bool:
    """True for an ELF executable without a PT_INTERP header (no dynamic loader needed)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only; that is all Debian ships here
            return False
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def static_busybox() -> Path | None:
    for cand in _BUSYBOX_CANDIDATES:
        p = Path(cand)
        if p.is_file() and _is_static_elf(p):
            return p
    return None


def podman_skip_reason() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman runc)"
    if shutil.which("runc") is None and shutil.which("crun") is None:
        return "no OCI runtime for podman (apt-get install runc)"
    if static_busybox() is None:
        return "no static busybox to build the test image from (apt-get install busybox-static)"
    status = asyncio.run(detect("podman"))
    if status.engine is None:
        return f"podman is not usable here: {status.reasons.get('podman')}"
    return None


def podman_engine() -> Engine:
    engine = asyncio.run(detect("podman")).engine
    assert engine is not None
    return engine


def rootfs_tar(busybox: Path, app_owner: int = 0) -> bytes:
    """The image's root filesystem as an uncompressed tar, built in memory; `app_owner` owns /app
    and what is in it (an image whose USER is not root)."""
    applets = subprocess.run([str(busybox), "--list"], capture_output=True, text=True, check=True).stdout.split()
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            if name.startswith("app"):
                info.uid = info.gid = app_owner
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o644) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, now
            if name.startswith("app/"):
                info.uid = info.gid = app_owner
            tar.addfile(info, io.BytesIO(data))

        for d in ("bin", "etc", "root", "app", "proc", "sys", "dev"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        add_file("bin/busybox", busybox.read_bytes(), 0o755)
        for applet in applets:
            if applet != "busybox":
                link = tarfile.TarInfo(f"bin/{applet}")
                link.type, link.linkname, link.mode, link.mtime = tarfile.SYMTYPE, "busybox", 0o777, now
                tar.addfile(link)
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"
                 b"app:x:1000:1000:app:/app:/bin/sh\n")
        add_file("etc/group", b"root:x:0:\nnogroup:x:65534:\napp:x:1000:\n")
        add_file("image-marker.txt", MARKER.encode())
        add_file("app/readme.txt", APP_README.encode())
    return buf.getvalue()


def build_test_image(engine: Engine, tag: str = TEST_IMAGE, user: int | None = None) -> str:
    """`user`: the image's USER, who then owns /app."""
    busybox = static_busybox()
    assert busybox is not None
    changes = ["--change", "ENV PATH=/bin"] + (["--change", f"USER {user}"] if user is not None else [])
    proc = subprocess.run([engine.binary, "import", *changes, "-", tag], input=rootfs_tar(busybox, user or 0),
                          env=engine.env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return tag


def containers_with_label(engine: Engine, label: str) -> list[str]:
    proc = subprocess.run([engine.binary, "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}"],
                          env=engine.env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.fixture(scope="session")
def podman() -> Engine:
    reason = podman_skip_reason()
    if reason:
        pytest.skip(reason)
    return podman_engine()


@pytest.fixture(scope="session")
def busybox_image(podman: Engine) -> Iterator[str]:
    """The test image, imported once per session and left in local storage for the next one."""
    yield build_test_image(podman)


@pytest.fixture(scope="session")
def busybox_user_image(podman: Engine) -> str:
    """The test image with USER 1000 (`app`), who owns /app and its readme."""
    return build_test_image(podman, "localhost/trajforge-test-busybox-user:latest", user=1000)


DEBIAN_TOOLS_IMAGE = "localhost/trajforge-test-debian-tools:latest"
# GNU tools the container backend's file operations and the tests use; copied from the host (Debian).
_DEBIAN_TOOLS = ("dash", "cat", "head", "realpath", "dirname", "basename", "mkdir", "rm", "ls", "echo", "sleep",
                 "mkfifo", "ln", "id", "pwd", "env", "test", "[", "find", "xargs", "tar", "chmod", "touch", "stat")


def debian_rootfs_tar() -> bytes | None:
    """A root filesystem of Debian's own binaries (dash as /bin/sh, coreutils, findutils, GNU tar)
    and the shared libraries they load, from this host; None when a tool is missing."""
    files: dict[str, str] = {}
    for tool in _DEBIAN_TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin")
        if path is None:
            return None
        real = str(Path(path).resolve())
        files[f"usr/bin/{tool}"] = real
        out = subprocess.run(["ldd", real], capture_output=True, text=True).stdout
        for line in out.splitlines():
            parts = line.split()
            lib = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else None
            if lib and lib.startswith("/"):
                files[lib.lstrip("/")] = str(Path(lib).resolve())
    buf = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        made: set[str] = set()

        def add_dir(name: str, mode: int = 0o755) -> None:
            if name in made:
                return
            made.add(name)
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, now
            tar.addfile(info)

        def add_link(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, now
            tar.addfile(info)

        for d in ("usr", "usr/bin", "usr/lib", "usr/lib64", "etc", "root", "app", "proc", "sys", "dev"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            add_link(link, target)
        for name, real in sorted(files.items()):
            name = name.replace("lib/x86_64", "usr/lib/x86_64", 1) if name.startswith("lib/") else name
            name = name.replace("lib64/", "usr/lib64/", 1) if name.startswith("lib64/") else name
            parent = ""
            for part in name.split("/")[:-1]:
                parent = f"{parent}/{part}" if parent else part
                add_dir(parent)
            data = Path(real).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, now
            tar.addfile(info, io.BytesIO(data))
        add_link("usr/bin/sh", "dash")
        for name, data in (("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", b"root:x:0:\n"),
                           ("image-marker.txt", MARKER.encode()), ("app/readme.txt", APP_README.encode())):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="session")
def debian_tools_image(podman: Engine) -> str:
    """An image of Debian's GNU tools (no busybox, no interpreter), built from this host's files."""
    rootfs = debian_rootfs_tar()
    if rootfs is None:
        pytest.skip("the host lacks one of the GNU tools the Debian test image is built from")
    proc = subprocess.run([podman.binary, "import", "--change", "ENV PATH=/usr/bin:/bin", "-", DEBIAN_TOOLS_IMAGE],
                          input=rootfs, env=podman.env, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return DEBIAN_TOOLS_IMAGE
