"""Mutation checks of the sandbox view's guards (root_view.py, etc_copy.py): each guard taken out
of the zygote's assembled script (or the runtime), its own test fails. The pattern of
test_mutations.py: a test that passed with its guard gone would prove nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sandbox import test_shared_inodes as shared
from tests.sandbox.test_mutations import STATUS, mutate
from trajforge.sandbox.backends.bwrap import bwrap_runtime

pytestmark = pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root",
                                reason=f"needs root-mode bwrap ({STATUS.detail})")
OVERLAY = ('''                        self.mount("overlay", new, "overlay", _MS_RDONLY | _MS_NOSUID | _MS_NODEV,
                                   f"lowerdir={empty}:{entry.path}")''',
           '''                        self.mount(entry.path, new, None, _MS_BIND | _MS_REC)''')


def test_system_directories_bound_instead_of_overlaid_are_caught(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, OVERLAY)
    with pytest.raises(AssertionError):
        shared.test_a_sample_s_locks_never_land_on_an_inode_of_the_host(tmp_path)
    with pytest.raises(AssertionError):
        shared.test_no_lock_open_or_write_of_one_sample_reaches_another("flock on /etc/passwd")
    with pytest.raises(AssertionError):
        shared.test_no_lock_open_or_write_of_one_sample_reaches_another("inotify IN_OPEN on /usr/bin/true")


def test_the_template_s_device_nodes_instead_of_its_own_are_caught(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: bwrap's /dev in the template (binds of the host's nodes), bound into each sandbox."""
    argv = bwrap_runtime.bwrap_argv
    monkeypatch.setattr(bwrap_runtime, "bwrap_argv", lambda *args, **kwargs: argv(*args, **{**kwargs, "mounts": True}))
    mutate(monkeypatch, ('''                    if name not in _FRESH:''', '''                    if name == "dev":
                        self.mount(entry.path, new, None, _MS_BIND | _MS_REC)
                    elif name not in _FRESH:'''), ("        self._dev()\n", "        pass\n"),
           ("        self._mqueue()\n", "        pass  # bwrap's /dev has no mount point for it\n"))
    with pytest.raises(AssertionError):
        shared.test_a_sample_s_locks_never_land_on_an_inode_of_the_host(tmp_path)
    with pytest.raises(AssertionError):
        shared.test_no_lock_open_or_write_of_one_sample_reaches_another("flock on /dev/null")


def test_the_host_s_etc_instead_of_the_run_s_copy_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bwrap_runtime, "ETC", "not-etc")  # the host's /etc bound, no tmpfs over it
    monkeypatch.setattr(bwrap_runtime, "copy_etc", lambda *args, **kwargs: None)
    with pytest.raises(AssertionError):
        shared.test_etc_is_the_run_s_copy_of_what_a_sample_may_read(tmp_path)
