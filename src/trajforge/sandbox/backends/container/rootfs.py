"""A container's own filesystem on its sample's disk, in a place trajforge owns (rootful Podman).

What a container writes outside its mounts (`/root`, `/usr`, `/var`...) goes to its copy-on-write
layer in the engine's storage, which no engine limits without quota-capable storage. trajforge
never mounts anything inside an engine's storage: the engine manages that tree with mounts of its
own (Podman binds `overlay/` onto itself while a layer is mounted and unbinds it when none is), and
a mount made beneath it ends up under that bind, where no unmount by path reaches it; the engine
then cannot delete the layer, flags it incomplete, and every podman command on the host fails
(`trajforge doctor --repair` mends a storage left so, storage.py). Instead, as root with a sample
disk (host/disk.py), a container runs on a root filesystem of trajforge's (`podman run --rootfs`):

- the image's root, copied once per image ID into a read-only cache (`RootfsCache`: `podman image
  mount`, `cp -a`, `podman image unmount`) that every run on the host shares;
- per sample, an overlay of that copy (shown with the run's user-namespace ids, host/idmap.py) whose
  upper and work directories are on the sample's disk, mounted beside the workspace
  (DiskImage.attach_rootfs).

The workspace and everything the container writes then share the one `sandbox_disk` limit, and
the engine's storage holds nothing of the sample's. With `--rootfs` the engine applies none of
the image's config: its ENV, USER and labels are passed as flags (`ImageRoot.flags`; the working
directory is the sample's cwd and the entrypoint `sleep infinity`, as always). Podman does not
know the user namespace's ids of such a container: the files it makes for it (/etc/hosts,
/etc/resolv.conf, /etc/hostname) are readable inside but no one's there, and `podman cp` into it
writes the archive's ids as host ids (ContainerTaskSandbox.upload shifts them, image_sandbox.py).

Elsewhere (Docker, rootless Podman, no loop devices, SELinux enforcing, a kernel or filesystem
without idmapped overlay layers) a container runs on the engine's layer as before, its own
filesystem unlimited (one warning a run; docs/sandboxes.md lists the cases).

The cache: `<trajforge cache>/rootfs/<image ID>` (0700, root's: an image's setuid files keep their
owners there), made under a temporary name and renamed, so a killed runner leaves at worst a
`.tmp` directory and a `.mount` marker of the image mount it had (both undone by the next runner
once its pid is gone). Each runner holds a shared lock on `<image ID>.lock` while it uses a copy; a
copy whose image the engine no longer has is deleted by the next runner that can take the lock
exclusively.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from trajforge.sandbox.backends.container.argv import ID_RANGE
from trajforge.sandbox.backends.container.engine import Engine, cache_dir, last_line
from trajforge.sandbox.host.disk import DiskImage, pid_alive, rootfs_dir
from trajforge.sandbox.host.idmap import UserNamespace
from trajforge.sandbox.interface import SandboxError
from trajforge.sandbox.process import SAFE_PATH

_log = logging.getLogger("trajforge.sandbox")
_warned: set[str] = set()
# Errors of the mount calls that say the kernel or the cache's filesystem cannot idmap an overlay layer.
_UNSUPPORTED = {errno.EINVAL, errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP}
_LEFTOVER = re.compile(r"\.([0-9a-f]{64})\.(tmp|gone|mount)-(\d+)-[0-9a-f]+")
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")  # the name of a copy (and of its .lock): an image ID
_SELINUX_ENFORCE = Path("/sys/fs/selinux/enforce")


@dataclass(frozen=True, slots=True)
class ContainerImage:
    """What stands for the image in a sample's `run` arguments, and, for a container on trajforge's
    root filesystem, the host ids that `podman cp` must write for files to be its user's."""

    args: list[str]
    cp_owner: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ImageRoot:
    """An image's root filesystem in the cache, and the config the engine would have applied."""

    image_id: str
    path: Path
    env: tuple[str, ...]
    user: str
    labels: tuple[tuple[str, str], ...]

    @property
    def flags(self) -> list[str]:
        """`run` flags giving a `--rootfs` container what the image would have: its environment,
        user and labels (trajforge's own labels are not the image's to set)."""
        flags: list[str] = []
        for entry in self.env:
            flags += ["--env", entry]
        if self.user:
            flags += ["--user", self.user]
        for key, value in self.labels:
            if key != "trajforge" and not key.startswith("trajforge."):
                flags += ["--label", f"{key}={value}"]
        return flags


    def user_ids(self) -> tuple[int, int]:
        """The uid and gid of the image's USER (`name`, `uid`, `name:group`...) as its own /etc/passwd
        and /etc/group say (0 for what they do not name), as `podman cp` gives copied files."""
        user, _, group = self.user.partition(":")
        uid, gid = _lookup(_rows(self.path, "etc/passwd"), user or "0")
        if group:
            gid = _lookup(_rows(self.path, "etc/group"), group)[0]
        return uid, gid


def _lookup(rows: list[list[str]], name: str) -> tuple[int, int]:
    """(the id, the primary group: passwd only) of `name` in the rows of a passwd or group file."""
    if name.isdigit():
        return int(name), next((int(r[3]) for r in rows if len(r) > 3 and r[2] == name and r[3].isdigit()), int(name))
    for row in rows:
        if len(row) > 2 and row[0] == name and row[2].isdigit():
            return int(row[2]), int(row[3]) if len(row) > 3 and row[3].isdigit() else int(row[2])
    return 0, 0


def _rows(root: Path, name: str) -> list[list[str]]:
    """The colon-separated rows of the image's file `name`; none when it is missing or a link leads
    out of the copy (resolved on the host, an image's link would name a host file)."""
    real = Path(os.path.realpath(root / name))
    if not real.is_relative_to(root.resolve()) or not real.is_file():
        return []
    try:
        return [line.split(":") for line in real.read_text(encoding="utf-8", errors="replace").splitlines()]
    except OSError:
        return []


def parse_inspect(text: str) -> tuple[str, tuple[str, ...], str, tuple[tuple[str, str], ...]]:
    """(image ID, ENV entries, USER, labels) from `image inspect --format '{{.Id}}\\t{{json .Config}}'`."""
    image_id, _, config_text = text.strip().partition("\t")
    if re.fullmatch(r"[0-9a-f]{64}", image_id) is None:
        raise ValueError(f"not an image ID: {image_id[:80]!r}")
    config = json.loads(config_text or "{}") or {}
    env = tuple(e for e in config.get("Env") or () if isinstance(e, str) and "=" in e)
    labels = tuple(sorted((str(k), str(v)) for k, v in (config.get("Labels") or {}).items()))
    return image_id, env, str(config.get("User") or ""), labels


class RootfsCache:
    """Image roots copied out of the engine once per image ID, shared read-only by every run."""

    def __init__(self, engine: Engine, directory: Path | None = None) -> None:
        self.engine = engine
        self.dir = directory or cache_dir() / "rootfs"
        self._roots: dict[str, asyncio.Task[ImageRoot]] = {}
        self._locks: dict[str, int] = {}  # image ID -> descriptor holding the shared lock
        self._swept = False

    async def root(self, image: str) -> ImageRoot:
        """`image`'s root in the cache, made if missing; SandboxError when it cannot be."""
        task = self._roots.get(image)
        if task is None or (task.done() and (task.cancelled() or task.exception() is not None)):
            task = asyncio.get_running_loop().create_task(self._make(image), name=f"image-root {image}")
            self._roots[image] = task
        return await asyncio.shield(task)

    def _directory(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = os.stat(self.dir)
        if st.st_uid != os.geteuid():
            raise SandboxError(f"{self.dir} belongs to uid {st.st_uid}, not this runner's: it holds copies of "
                               "images' root filesystems, owners and setuid bits kept, and must be root's alone")
        if st.st_mode & 0o077:
            os.chmod(self.dir, 0o700)
        return self.dir

    async def _make(self, image: str) -> ImageRoot:
        res = await self.engine.run("image", "inspect", "--format", "{{.Id}}\t{{json .Config}}", image, timeout=60)
        try:
            if res.exit_code != 0:
                raise ValueError(last_line(res))
            image_id, env, user, labels = parse_inspect(res.stdout)
        except ValueError as e:
            raise SandboxError(f"cannot read the config of image {image!r}: {e}") from None
        try:
            where = self._directory()
            if not self._swept:
                self._swept = True
                await self._sweep(where)
            path = where / image_id
            if image_id not in self._locks:
                fd = os.open(where / f"{image_id}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:  # shared; a runner deleting the copy holds it exclusively only around a rename
                    fcntl.flock(fd, fcntl.LOCK_SH)
                except OSError:
                    os.close(fd)
                    raise
                self._locks[image_id] = fd
            if not path.is_dir():
                await self._copy(image_id, path)
        except OSError as e:
            raise SandboxError(f"cannot keep the root filesystem of image {image!r} in {self.dir}: {e}") from e
        return ImageRoot(image_id, path, env, user, labels)

    async def _copy(self, image_id: str, path: Path) -> None:
        token = f"{os.getpid()}-{secrets.token_hex(4)}"
        # Says the engine counts a mount of the image for this runner: if it is killed before the
        # unmount, the next runner's sweep unmounts it once (the window before the mount is a count
        # taken from another runner's copy at worst: its copy then fails and is made again).
        marker = path.with_name(f".{image_id}.mount-{token}")
        marker.touch(0o600)
        mounted = await self.engine.run("image", "mount", image_id, timeout=300)
        source = mounted.stdout.strip()
        if mounted.exit_code != 0 or not source.startswith("/"):
            marker.unlink()
            raise SandboxError(f"cannot read image {image_id[:12]}'s root filesystem ({self.engine.kind} image "
                               f"mount): {last_line(mounted)}")
        tmp = path.with_name(f".{image_id}.tmp-{token}")
        try:
            proc = await asyncio.create_subprocess_exec(
                "cp", "-a", "--", source, str(tmp), stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH}, cwd="/")
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise SandboxError(f"cannot copy image {image_id[:12]}'s root filesystem into {self.dir}: "
                                   f"{err.decode(errors='replace').strip()[-300:]}")
            try:
                os.rename(tmp, path)
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):  # another runner made it first: fine
                    raise
        finally:
            unmounted = await self.engine.run("image", "unmount", image_id, timeout=120)
            if unmounted.exit_code == 0:
                marker.unlink()
            if tmp.exists():
                await asyncio.to_thread(shutil.rmtree, tmp, True)

    async def _sweep(self, where: Path) -> None:
        """Undo what killed runners left (`.tmp`/`.gone` directories, `.mount` markers of dead pids)
        and delete the copies of images the engine no longer has that no runner uses (exclusive lock)."""
        doomed: list[Path] = []
        for entry in os.scandir(where):
            leftover = _LEFTOVER.fullmatch(entry.name)
            if leftover is not None:
                image_id, kind, pid = leftover.groups()
                if pid_alive(int(pid)):
                    continue
                if kind == "mount":  # its image mount, counted by the engine
                    await self.engine.run("image", "unmount", image_id, timeout=120)
                    os.unlink(entry.path)
                else:
                    doomed.append(Path(entry.path))
                continue
            if not entry.name.endswith(".lock"):
                continue
            image_id = entry.name.removesuffix(".lock")
            if image_id in self._locks or not _IMAGE_ID.fullmatch(image_id):
                continue
            # One lookup per cached copy, not a listing of the engine's images: a shared build host
            # holds hundreds, and `podman images -a` then takes a minute of CPU (its exit code:
            # 0 present, 1 absent, anything else a failure of the engine, when nothing is evicted).
            res = await self.engine.run("image", "exists", image_id, timeout=60)
            if res.exit_code != 1:
                continue
            gone = self._evict(where, image_id)
            if gone is not None:
                doomed.append(gone)
        for path in doomed:
            await asyncio.to_thread(shutil.rmtree, path, True)

    @staticmethod
    def _evict(where: Path, image_id: str) -> Path | None:
        """Rename the copy of `image_id` away if no runner holds its lock; the renamed path."""
        try:
            fd = os.open(where / f"{image_id}.lock", os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            gone = where / f".{image_id}.gone-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                os.rename(where / image_id, gone)
            except FileNotFoundError:
                return None
            return gone
        except OSError:  # in use
            return None
        finally:
            os.close(fd)

    def close(self) -> None:
        for fd in self._locks.values():
            os.close(fd)
        self._locks.clear()


def _why_not(engine: Engine, disk: DiskImage | None) -> str | None:
    if disk is None:
        return "no sample disk"
    if engine.kind != "podman":
        return f"{engine.kind} has no --rootfs"
    with contextlib.suppress(OSError):
        if _SELINUX_ENFORCE.read_text().strip() == "1":
            return "SELinux is enforcing (a root filesystem outside the engine's storage lacks its labels)"
    return None


def _warn(why: str) -> None:
    if why not in _warned:
        _warned.add(why)
        _log.warning("containers' own filesystems are not size-limited: %s (sandbox_disk limits their workspaces "
                     "only)", why)


class OwnRootfs:
    """A run's containers on root filesystems of trajforge's: the cache, the user namespace whose ids
    the overlays show, and whether this host can do it at all (decided at the first sample)."""

    def __init__(self, engine: Engine, idmap: int | None) -> None:
        self.engine, self.idmap = engine, idmap
        self.cache = RootfsCache(engine)
        self.userns: UserNamespace | None = None
        self.where: Path | None = None  # host/disk.rootfs_dir, made at the first sample
        self.unusable: str | None = None
        self.worked = False

    async def mount(self, image: str, disk: DiskImage | None) -> ContainerImage:
        """What stands for `image` (present) in the `run` arguments: `--rootfs` with an overlay on
        `disk` and the image's config, or just the image (the engine's layer, unlimited)."""
        why = self.unusable or _why_not(self.engine, disk)
        if why is not None:
            if disk is not None:  # without a disk nothing is limited anyway: nothing to say
                _warn(why)
            return ContainerImage([image])
        assert disk is not None
        root = await self.cache.root(image)
        if self.idmap is not None and self.userns is None:
            self.userns = UserNamespace(self.idmap, ID_RANGE)
        if self.where is None:
            try:
                self.where = rootfs_dir(self.idmap if self.idmap is not None else os.geteuid())
            except (OSError, SandboxError) as e:
                self.unusable = str(e)
                _warn(self.unusable)
                return ContainerImage([image])
        try:
            merged = await disk.attach_rootfs(root.path, self.userns, self.where)
        except SandboxError as e:
            cause = e.__cause__
            if self.worked or not isinstance(cause, OSError) or cause.errno not in _UNSUPPORTED:
                raise
            self.unusable = f"this kernel cannot mount an idmapped overlay of {root.path} ({cause})"
            _warn(self.unusable)
            return ContainerImage([image])
        self.worked = True
        shift = self.idmap or 0
        uid, gid = root.user_ids()
        return ContainerImage([*root.flags, "--rootfs", str(merged)], (uid + shift, gid + shift))

    def close(self) -> None:
        self.cache.close()
        if self.where is not None:  # empty once every sample closed; the sweep takes it otherwise
            with contextlib.suppress(OSError):
                self.where.rmdir()
            self.where = None
        if self.userns is not None:
            self.userns.close()
            self.userns = None
