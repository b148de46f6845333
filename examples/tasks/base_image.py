"""Make `localhost/trajforge-example-base:latest`, the image the example tasks build FROM, offline.

No registry is needed: the image's root filesystem is this host's own bash, dash (as /bin/sh),
coreutils, grep, sed and findutils with the shared libraries they load, imported with
`podman import` (or `docker import`). Run it once before the example tasks:

    python examples/tasks/base_image.py            # podman, else docker
    python examples/tasks/base_image.py --engine docker --tag localhost/my-base:1

The test suite builds the same image with `build()`. Users with a registry would write
`FROM debian:bookworm-slim` (or any image with bash) in their tasks instead.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

TAG = "localhost/trajforge-example-base:latest"
TOOLS = ("bash", "dash", "cat", "ls", "mkdir", "rm", "cp", "mv", "head", "tail", "wc", "sort", "uniq", "tr",
         "cut", "tee", "env", "id", "touch", "chmod", "stat", "dirname", "basename", "pwd", "printf", "echo",
         "sleep", "grep", "sed", "find", "test", "seq", "true", "false", "date", "ln", "readlink", "xargs",
         "tar")  # tar: Harbor's Podman runtime copies files in with it
USERS = (b"root:x:0:0:root:/root:/bin/bash\ntester:x:1000:1000:tester:/home/tester:/bin/bash\n"
         b"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUPS = b"root:x:0:\ntester:x:1000:\nnogroup:x:65534:\n"


def _libraries(binary: str) -> list[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        lib = parts[2] if "=>" in parts and len(parts) > 2 else parts[0] if parts and parts[0].startswith("/") else None
        if lib and lib.startswith("/"):
            libs.append(lib)
    return libs


def rootfs() -> bytes:
    """The image's root filesystem as a tar (usr-merged: /bin, /lib, /lib64 link into /usr)."""
    files: dict[str, str] = {}
    for tool in TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin")
        if path is None:
            raise SystemExit(f"error: {tool} is not installed on this host (apt-get install coreutils grep sed "
                             "findutils bash dash)")
        real = str(Path(path).resolve())
        files[f"usr/bin/{tool}"] = real
        for lib in _libraries(real):
            files["usr/" + lib.lstrip("/").removeprefix("usr/")] = str(Path(lib).resolve())
    buf, now, made = io.BytesIO(), time.time(), set()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add(name: str, kind: bytes, mode: int, data: bytes = b"", link: str = "", uid: int = 0) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname, info.uid, info.gid = kind, mode, now, link, uid, uid
            info.size = len(data) if kind == tarfile.REGTYPE else 0
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)

        def add_dir(name: str, mode: int = 0o755, uid: int = 0) -> None:
            parent = ""
            for part in name.split("/"):
                parent = f"{parent}/{part}" if parent else part
                if parent not in made:
                    made.add(parent)
                    add(parent, tarfile.DIRTYPE, mode if parent == name else 0o755, uid=uid if parent == name else 0)

        for d in ("usr/bin", "usr/lib", "usr/lib64", "etc", "root", "app", "proc", "sys", "dev", "var", "run"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        add_dir("home/tester", 0o755, uid=1000)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")):
            add(link, tarfile.SYMTYPE, 0o777, link=target)
        for name, real in sorted(files.items()):
            add_dir(name.rsplit("/", 1)[0])
            add(name, tarfile.REGTYPE, 0o755, Path(real).read_bytes())
        add("usr/bin/sh", tarfile.SYMTYPE, 0o777, link="dash")
        add("etc/passwd", tarfile.REGTYPE, 0o644, USERS)
        add("etc/group", tarfile.REGTYPE, 0o644, GROUPS)
    return buf.getvalue()


def build(binary: str, env: dict[str, str] | None = None, tag: str = TAG, label: str | None = None) -> str:
    """Import the image with the engine CLI at `binary` (`label`: a LABEL it carries); returns its tag."""
    changes = ["--change", "ENV PATH=/usr/bin:/bin", "--change", "WORKDIR /app"]
    if label is not None:
        changes += ["--change", f"LABEL {label}"]
    proc = subprocess.run([binary, "import", *changes, "-", tag], input=rootfs(), env=env, capture_output=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"error: {binary} import failed: {proc.stderr.decode(errors='replace').strip()}")
    return tag


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("podman", "docker"), help="default: podman, else docker")
    parser.add_argument("--tag", default=TAG)
    args = parser.parse_args()
    binary = shutil.which(args.engine) if args.engine else (shutil.which("podman") or shutil.which("docker"))
    if binary is None:
        print("error: neither podman nor docker is installed", file=sys.stderr)
        return 2
    print(build(binary, tag=args.tag))
    return 0


if __name__ == "__main__":
    sys.exit(main())
