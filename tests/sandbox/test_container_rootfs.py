"""A container's own root filesystem of trajforge's (backends/container/rootfs.py): the image's config
applied with `--rootfs`, the read-only cache of image roots and what a killed runner leaves in it,
and `podman cp` into such a container giving files to the image's user."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.images import (  # noqa: F401 (fixtures)
    busybox_image, busybox_user_image, podman, rootfs_tar, static_busybox,
)
from tests.support.sandboxes import create_sandbox
from trajforge.config import RunConfig
from trajforge.sandbox.backends.container.container_engine import Engine
from trajforge.sandbox.backends.container.container_ops import copy_in, root_sh
from trajforge.sandbox.backends.container.rootfs import ImageRoot, RootfsCache, parse_inspect
from trajforge.sandbox.host.disk import disk_usable

needs_disk = pytest.mark.skipif(os.geteuid() != 0 or disk_usable() is not None,
                                reason=f"needs a root runner with loop devices ({disk_usable()})")
ID = "a" * 64


def test_the_image_s_config_becomes_run_flags() -> None:
    image_id, env, user, labels = parse_inspect(
        ID + '\t{"Env":["PATH=/bin","LANG=C.UTF-8","JUNK"],"User":"app:staff","WorkingDir":"/srv",'
             '"Labels":{"org.x":"1=2","trajforge":"image-says","trajforge.run":"not-yours"}}\n')
    assert (image_id, env, user) == (ID, ("PATH=/bin", "LANG=C.UTF-8"), "app:staff")
    root = ImageRoot(image_id, Path("/nowhere"), env, user, labels)
    # trajforge's own labels are never the image's to set (the sweep finds containers by them)
    assert root.flags == ["--env", "PATH=/bin", "--env", "LANG=C.UTF-8", "--user", "app:staff", "--label", "org.x=1=2"]
    assert parse_inspect(ID + "\tnull\n")[1:] == ((), "", ())
    for bad in ("", "sha256:" + ID + "\t{}", "Error: no such image"):
        with pytest.raises(ValueError):
            parse_inspect(bad)


def test_the_image_s_user_is_looked_up_in_its_own_files_only(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\napp:x:1000:1001::/app:/bin/sh\n")
    (tmp_path / "etc" / "group").write_text("root:x:0:\nstaff:x:50:\n")

    def ids(user: str) -> tuple[int, int]:
        return ImageRoot(ID, tmp_path, (), user, ()).user_ids()

    assert [ids(u) for u in ("", "app", "1000", "app:staff", "1000:50", "7", "ghost")] == \
        [(0, 0), (1000, 1001), (1000, 1001), (1000, 50), (1000, 50), (7, 7), (0, 0)]
    (tmp_path / "etc" / "passwd").unlink()
    (tmp_path / "etc" / "passwd").symlink_to("/etc/passwd")  # resolved on the host: the host's file
    assert ids("root") == ids("daemon") == (0, 0)


def _mounted_images(podman: Engine) -> list[str]:  # noqa: F811
    out = subprocess.run([podman.binary, "image", "mount", "--format", "json"], env=podman.env, capture_output=True,
                         text=True, timeout=60).stdout
    return [m["id"] for m in json.loads(out or "[]")]


@needs_disk
def test_an_image_root_is_copied_once_shared_and_never_left_mounted(tmp_path: Path, busybox_image: str,  # noqa: F811
                                                                    podman: Engine) -> None:  # noqa: F811
    async def body() -> tuple[ImageRoot, ImageRoot]:
        first, second = RootfsCache(podman, tmp_path / "rootfs"), RootfsCache(podman, tmp_path / "rootfs")
        try:
            return await first.root(busybox_image), await second.root(busybox_image)
        finally:
            first.close()
            second.close()

    a, b = asyncio.run(body())
    assert a == b and a.path.parent == tmp_path / "rootfs"
    assert os.stat(tmp_path / "rootfs").st_mode & 0o777 == 0o700  # setuid files of images stay root's alone
    assert (a.path / "image-marker.txt").read_text().startswith("trajforge test image marker")
    assert sorted(p.name for p in (tmp_path / "rootfs").iterdir()) == [a.image_id, f"{a.image_id}.lock"]
    assert a.image_id not in _mounted_images(podman)


@needs_disk
def test_what_a_killed_runner_left_in_the_cache_is_undone(tmp_path: Path, busybox_image: str,  # noqa: F811
                                                         podman: Engine) -> None:  # noqa: F811
    """Its half-made copy and its image mount (the engine counts it) go; a copy whose image is gone
    goes unless another runner uses it (holds its lock)."""
    where = tmp_path / "rootfs"
    where.mkdir(mode=0o700)
    image_id = parse_inspect(subprocess.run([podman.binary, "image", "inspect", "--format", "{{.Id}}\t{{json .Config}}",
                                             busybox_image], env=podman.env, capture_output=True, text=True,
                                            timeout=60).stdout)[0]
    dead = subprocess.Popen(["true"])
    dead.wait()
    subprocess.run([podman.binary, "image", "mount", image_id], env=podman.env, check=True, capture_output=True)
    assert image_id in _mounted_images(podman)
    (where / f".{image_id}.mount-{dead.pid}-ab").touch()
    (where / f".{image_id}.tmp-{dead.pid}-ab" / "half").mkdir(parents=True)
    gone, used = "b" * 64, "c" * 64  # images the engine does not have
    for stale in (gone, used):
        (where / stale).mkdir()
        (where / f"{stale}.lock").touch()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
                               "fcntl.flock(fd, fcntl.LOCK_SH); print('held', flush=True); sys.stdin.read()",
                               str(where / f"{used}.lock")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        cache = RootfsCache(podman, where)
        try:
            asyncio.run(cache.root(busybox_image))
        finally:
            cache.close()
    finally:
        holder.communicate("")
    assert sorted(p.name for p in where.iterdir()) == sorted([image_id, f"{image_id}.lock", used, f"{used}.lock",
                                                              f"{gone}.lock"])
    assert image_id not in _mounted_images(podman)
    fd = os.open(where / f"{used}.lock", os.O_RDWR)
    try:  # the evicting runner never held the lock in use
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def _labelled_image(podman: Engine) -> str:  # noqa: F811
    busybox = static_busybox()
    assert busybox is not None
    tag = "localhost/trajforge-test-busybox-config:latest"
    proc = subprocess.run([podman.binary, "import", "--change", "ENV PATH=/bin", "--change", "ENV GREETING=from the image",
                           "--change", "USER 1000", "--change", "LABEL org.example.task=count", "-", tag],
                          input=rootfs_tar(busybox, 1000), env=podman.env, capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return tag


@needs_disk
def test_a_container_on_its_own_root_gets_the_image_s_config_and_copied_files_are_its_user_s(
        tmp_path: Path, podman: Engine) -> None:  # noqa: F811
    image = _labelled_image(podman)
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "t.txt").write_text("for the user\n")
    os.chmod(source, 0o700)  # a private host directory: its own mode is not copied onto the destination

    async def body() -> None:
        sb = await create_sandbox(RunConfig(container_engine="podman", run_name=f"ctest-rootfs-{os.getpid()}",
                                            sandbox_network="none"), cwd="/app", image=image, root=tmp_path / "ws")
        try:
            assert sb.name is not None and sb.cp_owner is not None  # on trajforge's root filesystem
            res = await sb.exec("id -u; echo $GREETING; touch /app/mine && stat -c '%u' /app/mine", timeout=30)
            assert res.stdout == "1000\nfrom the image\n1000\n", res
            labels = await podman.run("inspect", "--format", "{{index .Config.Labels \"org.example.task\"}} "
                                      "{{index .Config.Labels \"trajforge\"}}", sb.name)
            assert labels.stdout.strip() == "count 1", labels
            await root_sh(sb, "mkdir -p /opt/in && chmod 755 /opt/in")  # on the root filesystem, root's
            await copy_in(sb, source, "/opt/in")
            res = await sb.exec("stat -c '%u:%g %a %n' /opt/in /opt/in/sub /opt/in/sub/t.txt; cat /opt/in/sub/t.txt",
                                timeout=30)
            assert res.stdout == ("0:0 755 /opt/in\n1000:1000 755 /opt/in/sub\n1000:1000 644 /opt/in/sub/t.txt\n"
                                  "for the user\n"), res
        finally:
            await sb.close()

    asyncio.run(body())
