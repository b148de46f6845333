"""Mutation checks: each guard of the sandbox's invariant, removed, is caught by its test.

The zygote's code reaches the sandboxes as one assembled script (inside/helper.source), so a
mutant is that script with one guard taken out, handed to a fresh runtime in place of the real
one. Each test below runs the guard's own test against the mutant and expects it to fail: a
test that passed with its guard gone would prove nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.sandbox import test_hermetic as hermetic
from tests.sandbox import test_isolation as isolation
from trajforge.sandbox.backends.bwrap import bwrap_start
from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
from trajforge.sandbox.inside import helper

STATUS = asyncio.run(probe())
pytestmark = pytest.mark.skipif(not STATUS.usable or STATUS.mode != "root",
                                reason=f"needs root-mode bwrap ({STATUS.detail})")


def mutate(monkeypatch: pytest.MonkeyPatch, *edits: tuple[str, str]) -> None:
    source = helper.source(zygote=True)
    for old, new in edits:
        assert source.count(old) == 1, old  # the guard is where the mutant expects it
        source = source.replace(old, new)
    monkeypatch.setitem(bwrap_start._SOURCE, True, source.encode())


def test_without_the_import_seal_a_planted_module_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, ("    preload()  # everything a helper", "    pass  # everything a helper"),
           ("            seal()\n", "            pass\n"))
    with pytest.raises(AssertionError):
        hermetic.test_a_module_planted_where_the_helper_imports_from_never_runs(tmp_path)


def test_a_helper_that_keeps_saved_uid_0_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, ("    os.setresuid(uid, uid, uid)  # no uid 0", "    os.setresuid(uid, uid, 0)  # no uid 0"),
           ("    if os.getresuid() != (uid, uid, uid)", "    if False"))
    with pytest.raises(AssertionError):
        isolation.test_the_helper_and_the_commands_hold_no_privilege_and_no_handle(tmp_path, "none")


def test_a_helper_that_keeps_the_zygote_s_descriptors_is_caught(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    mutate(monkeypatch, ("        close_all_but({self.channel})\n", "        pass\n"))
    with pytest.raises(AssertionError):
        isolation.test_the_helper_and_the_commands_hold_no_privilege_and_no_handle(tmp_path, "none")


def test_a_dataset_row_over_the_runtime_passes_without_the_cwd_policy(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge import dataset

    monkeypatch.setattr(dataset, "cwd_problem", lambda cwd, host=True: None)
    with pytest.raises(pytest.fail.Exception):  # DID NOT RAISE: the refusal was the policy's
        hermetic.test_a_row_cwd_over_the_runtime_or_the_system_is_refused_with_its_line(tmp_path, hermetic.STDLIB)


# The sample's seccomp filter (host/seccomp.py): each guard out, the per-call test fails.
SECCOMP_MUTANTS = {
    "not installed when the helper drops its privileges": [("    confine_sample(libc)\n", "")],
    "io_uring allowed": [('SYSCALLS_ALLOWED = frozenset("""\n',
                          'SYSCALLS_ALLOWED = frozenset("""\n    io_uring_setup\n')],
    "clone checked for CLONE_NEWUSER only": [('SYSCALLS_CHECKED = {"clone": ("flags", _SC_NAMESPACES)',
                                              'SYSCALLS_CHECKED = {"clone": ("flags", _SC_NEWUSER)')],
    "any personality": [('"personality": ("only", _SC_PERSONALITIES)', '"personality": _SC_OK')],
}


@pytest.mark.parametrize("edits", SECCOMP_MUTANTS.values(), ids=SECCOMP_MUTANTS.keys())
def test_a_weaker_sample_filter_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          edits: list[tuple[str, str]]) -> None:
    from tests.sandbox import test_seccomp

    mutate(monkeypatch, *edits)
    with pytest.raises(AssertionError):
        test_seccomp.test_a_root_runner_s_bwrap_sample_is_refused_each_call_by_its_filter(tmp_path)
