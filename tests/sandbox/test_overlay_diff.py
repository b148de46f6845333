"""The changes of a container on trajforge's root filesystem, read from its overlay's upper
directory (sandbox/backends/container/overlay_diff.py), on directories made the way overlayfs
makes them: real whiteouts and opaque directories need root (mknod, trusted.* xattrs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trajforge.sandbox.backends.container.overlay_diff import overlay_changes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="whiteouts and trusted.* xattrs need root")


def _tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_added_changed_deleted_and_an_opaque_directory(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    _tree(lower, {"usr/bin/python3": "image", "usr/bin/ls": "image", "etc/profile": "image",
                  "opt/lib/a.py": "image", "opt/lib/b.py": "image"})
    _tree(upper, {"usr/bin/python3": "agent", "usr/lib/python3/site-packages/evil.pth": "agent",
                  "opt/lib/c.py": "agent"})
    os.mknod(upper / "usr/bin/ls", 0o600 | 0o020000, os.makedev(0, 0))  # a whiteout: ls deleted
    os.mknod(upper / "etc", 0o600 | 0o020000, os.makedev(0, 0))  # a whole directory deleted
    os.setxattr(upper / "opt/lib", "trusted.overlay.opaque", b"y")  # rm -rf /opt/lib; mkdir /opt/lib
    os.symlink("/etc/shadow", upper / "usr/bin/link")  # listed, never followed
    changes = {(c.kind, c.path) for c in overlay_changes(lower, upper, lambda p: True)}
    assert changes == {
        ("C", "/usr"), ("C", "/usr/bin"), ("C", "/usr/bin/python3"), ("D", "/usr/bin/ls"), ("A", "/usr/bin/link"),
        ("A", "/usr/lib"), ("A", "/usr/lib/python3"), ("A", "/usr/lib/python3/site-packages"),
        ("A", "/usr/lib/python3/site-packages/evil.pth"), ("D", "/etc"),
        ("C", "/opt"), ("C", "/opt/lib"), ("A", "/opt/lib/c.py"), ("D", "/opt/lib/a.py"), ("D", "/opt/lib/b.py")}


def test_only_the_wanted_paths_are_listed(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    _tree(lower, {"bin/sh": "image"})
    _tree(upper, {"bin/sh": "agent", "app/out.txt": "agent"})
    assert [(c.kind, c.path) for c in overlay_changes(lower, upper, lambda p: p.startswith("/bin/"))] == \
        [("C", "/bin/sh")]


def test_a_directory_swapped_for_a_link_during_the_walk_leads_nowhere(tmp_path: Path) -> None:
    """A process of the sample still running could swap a directory the walk has listed for a
    link to a host directory before the walk goes into it: the walk opens each level from its
    parent's descriptor without following a link, so it lists the host directory's files never.
    (A walk that opened `upper/deep` by its path listed /deep/host-secret.)"""
    lower, upper, host = tmp_path / "lower", tmp_path / "upper", tmp_path / "host"
    _tree(upper, {"deep/mine.txt": "agent"})
    _tree(host, {"host-secret": "host"})

    def swap_when_listed(path: str) -> bool:
        if path == "/deep":  # noted while its parent is read, before the walk goes into it
            (upper / "deep").rename(upper / "moved")
            os.symlink(host, upper / "deep")
        return True

    changes = {(c.kind, c.path) for c in overlay_changes(lower, upper, swap_when_listed)}
    assert ("A", "/deep") in changes
    assert not any("host-secret" in p for _, p in changes), changes
