"""The container engine's storage as `trajforge doctor` sees it: wedged or healthy, and the repair.

A storage is wedged when a mount beneath it is hidden: a directory above it (Podman binds its
`overlay/` onto itself whenever a layer is mounted) was mounted on later, so the path now leads
into that newer mount and no unmount by path reaches the hidden one. The engine then cannot delete
the directory the hidden mount sits on (`unlinkat ...: device or resource busy`), flags the layer
incomplete, and every podman command on the host fails trying to delete it again. trajforge
releases before the rootfs mechanism (rootfs.py) made such mounts (a sample's disk bound over a
container's layer); any program can.

`inspect` finds it from the engine's own words (its `podman info` error, and its graph and run
roots, which Podman names in its debug log even when it fails) and the kernel's mount table
(/proc/self/mountinfo, which lists hidden mounts too, with their parents). `repair` touches only
what it found broken, in the order that frees it: the covering self-bind first (or, when live
containers' mounts sit in it, moved aside and back), then the hidden mount, then a `podman info`
so the engine deletes the incomplete layer itself; it says each step it took. The mount table's
logic is pure (`parse_mountinfo`, `hidden`); commands run at the edges.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trajforge.sandbox.backends.container.container_engine import engine_env, last_line
from trajforge.sandbox.process import SAFE_PATH, run_argv

_BUSY = re.compile(r"unlinkat (\S+?): device or resource busy")
_ROOTS = re.compile(r'msg="Using (graph|run) root ([^"]+)"')


@dataclass(frozen=True, slots=True)
class Mount:
    """One line of /proc/self/mountinfo."""

    id: int
    parent: int
    device: str  # major:minor
    root: str  # the path, within its filesystem, that is mounted
    point: str
    fstype: str
    source: str


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        mounts.append(Mount(int(fields[0]), int(fields[1]), fields[2], _unescape(fields[3]), _unescape(fields[4]),
                            fields[sep + 1], _unescape(fields[sep + 2])))
    return mounts


def _beneath(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def hidden(mounts: list[Mount], dirs: tuple[str, ...]) -> list[tuple[Mount, Mount]]:
    """(hidden mount, the mount covering it) for each mount at or beneath `dirs` that its path no
    longer reaches: a mount not among its ancestors sits on its path, at or above its mount
    point, in one of its ancestors (made after it)."""
    by_id = {m.id: m for m in mounts}
    found = []
    for m in mounts:
        if not any(_beneath(m.point, d) for d in dirs):
            continue
        chain, parent = [], by_id.get(m.parent)
        while parent is not None and parent.id not in chain:
            chain.append(parent.id)
            parent = by_id.get(parent.parent)
        for other in mounts:
            if other.id != m.id and other.id not in chain and other.parent in chain and _beneath(m.point, other.point):
                found.append((m, other))
                break
    return found


def is_self_bind(m: Mount) -> bool:
    """A directory bound onto itself, as Podman does with `overlay/` (from a filesystem mounted at /
    or above the directory)."""
    return m.point.endswith(m.root) and m.root != "/" and m.fstype not in ("overlay", "tmpfs", "proc")


def describe(m: Mount) -> str:
    what = f"{m.fstype} {m.source}"
    if m.source.startswith("/dev/loop"):
        try:
            backing = Path(f"/sys/block/{Path(m.source).name}/loop/backing_file").read_text().strip()
            what += f", a disk image: {backing}"
        except OSError:
            pass
    if m.root != "/":
        what += f", its {m.root}"
    return what


@dataclass(slots=True)
class StorageReport:
    """What `inspect` found: the engine's roots, its error if `podman info` failed, what is wedged."""

    binary: str
    graph_root: str = ""
    run_root: str = ""
    info_error: str = ""
    wedged: list[tuple[Mount, Mount]] = field(default_factory=list)  # (hidden, covering)
    busy: list[Mount] = field(default_factory=list)  # visible mounts on a path the engine cannot delete

    @property
    def healthy(self) -> bool:
        return not self.wedged and not self.busy and not _BUSY.search(self.info_error)

    def lines(self) -> list[str]:
        """`doctor`'s explanation (nothing when healthy)."""
        if self.healthy:
            return []
        out = [f"storage WEDGED ({self.graph_root or 'graph root unknown'}): every podman command fails"]
        if self.info_error:
            out.append(f"    podman says: {self.info_error}")
        for m, cover in self.wedged:
            out.append(f"    {m.point} holds a mount ({describe(m)}) hidden under a later mount of {cover.point} "
                       f"({describe(cover)}): no unmount by path reaches it, so the engine cannot delete the directory")
        for m in self.busy:
            out.append(f"    {m.point} is a mount point ({describe(m)}) the engine cannot delete")
        out.append("    fix: trajforge doctor --repair (unmounts the covering bind, then the hidden mount; the engine "
                   "then deletes the incomplete layer)")
        return out

    def row(self) -> dict[str, object]:
        return {"healthy": self.healthy, "graph_root": self.graph_root, "run_root": self.run_root,
                "info_error": self.info_error, "wedged": [[m.point, c.point] for m, c in self.wedged],
                "busy": [m.point for m in self.busy]}


def podman_binary() -> str | None:
    return shutil.which("podman", path=os.environ.get("PATH", SAFE_PATH) + os.pathsep + SAFE_PATH)


async def inspect(binary: str, env: dict[str, str] | None = None) -> StorageReport:
    """The storage of the Podman at `binary` (rootful or the user's), with the environment trajforge
    gives the engine."""
    env = env or engine_env()
    res = await run_argv([binary, "--log-level=debug", "info", "--format", "{{.Store.GraphRoot}}"], timeout=120,
                         cwd="/", env=env, output_cap=1 << 20)
    report = StorageReport(binary)
    for kind, path in _ROOTS.findall(res.stderr):
        if kind == "graph":
            report.graph_root = path
        else:
            report.run_root = path
    if res.exit_code != 0:
        report.info_error = last_line(res)
    dirs = tuple(d for d in (report.graph_root, report.run_root) if d)
    if not dirs:
        return report
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    report.wedged = hidden(mounts, dirs)
    hidden_ids = {m.id for m, _ in report.wedged}
    for busy in _BUSY.findall(res.stderr):
        report.busy += [m for m in mounts if m.point == busy and m.id not in hidden_ids
                        and any(_beneath(busy, d) for d in dirs) and m not in report.busy]
    return report


async def _run(*argv: str) -> tuple[bool, str]:
    """(it worked, what it said)."""
    res = await run_argv(list(argv), timeout=120, cwd="/", env={"PATH": SAFE_PATH})
    return res.exit_code == 0, last_line(res) if res.exit_code != 0 else ""


async def _unmount(point: str, what: str, done: list[str]) -> bool:
    ok, why = await _run("umount", point)
    if ok:
        done.append(f"unmounted {point} ({what})")
        return True
    if "busy" in why.lower():  # a process still works in it: detached now, freed when it lets go
        ok, why = await _run("umount", "-l", point)
        if ok:
            done.append(f"detached {point} ({what}); a process still used it, the kernel frees it when it lets go")
            return True
    done.append(f"could not unmount {point} ({what}): {why}")
    return False


async def _free(m: Mount, cover: Mount, mounts: list[Mount], done: list[str]) -> bool:
    """Unmount the hidden `m`: `cover` out of the way first (unmounted, or moved aside and back
    when mounts of live containers are in it), then `m`."""
    if not is_self_bind(cover):
        done.append(f"left {m.point} alone: it is hidden under {cover.point} ({describe(cover)}), which is not "
                    "the engine's bind of a directory onto itself; unmount that yourself if it is not needed")
        return False
    what = f"{describe(m)}, hidden under {cover.point}"
    if not any(x.parent == cover.id for x in mounts):
        ok, why = await _run("umount", cover.point)
        if ok:
            done.append(f"unmounted {cover.point} (the engine's bind of it onto itself; it makes it again when needed)")
            return await _unmount(m.point, what, done)
        done.append(f"could not unmount {cover.point}: {why}")
        return False
    # Live containers' mounts are in the bind: move it (with them) aside, free the hidden mount, move it back.
    aside = tempfile.mkdtemp(prefix="trajforge-repair-")
    try:
        ok, why = await _run("mount", "--move", cover.point, aside)
        if not ok:
            done.append(f"could not move {cover.point} aside (mounts of running containers are in it): {why}; "
                        f"stop those containers' processes, then run trajforge doctor --repair again")
            return False
        done.append(f"moved {cover.point} (the engine's bind of it onto itself, with its running containers' "
                    f"mounts) aside to {aside}")
        freed = await _unmount(m.point, what, done)
        ok, why = await _run("mount", "--move", aside, cover.point)
        if ok:
            done.append(f"moved it back to {cover.point}")
        else:
            done.append(f"could not move the engine's bind back from {aside} to {cover.point}: {why}; "
                        f"run: mount --move {aside} {cover.point}")
            return False
        return freed
    finally:
        if os.path.isdir(aside) and not os.path.ismount(aside):
            os.rmdir(aside)


async def repair(report: StorageReport, env: dict[str, str] | None = None) -> tuple[StorageReport, list[str]]:
    """Free what `report` found wedged; the storage as found afterwards, and each step taken."""
    done: list[str] = []
    if report.healthy:
        return report, done
    if os.geteuid() != 0:
        return report, ["not repaired: unmounting needs root"]
    for _ in range(8):  # a hidden mount may hide another
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
        if not report.wedged and not report.busy:
            break
        progress = False
        for m, cover in report.wedged:
            progress |= await _free(m, cover, mounts, done)
            break  # the table changed: read it again
        else:
            for m in report.busy:
                progress |= await _unmount(m.point, f"{describe(m)}, on a path the engine must delete", done)
        report = await inspect(report.binary, env)
        if not progress:
            break
    if not report.info_error:
        done.append("podman info works again (the engine deleted what it had flagged incomplete)")
    return report, done


async def storage_report(env: dict[str, str] | None = None) -> StorageReport | None:
    """The storage of the Podman on PATH; None when there is none."""
    binary = podman_binary()
    return None if binary is None else await inspect(binary, env)


async def doctor_repair(env: dict[str, str] | None = None) -> tuple[bool, list[str]]:
    """`trajforge doctor --repair` for Podman: (healthy afterwards, each step taken and what is left)."""
    report = await storage_report(env)
    if report is None:
        return True, []
    after, done = await repair(report, env)
    return after.healthy, [*done, *after.lines()]
