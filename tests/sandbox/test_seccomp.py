"""The samples' seccomp filters (sandbox/host/seccomp.py, container/seccomp.py): at least as strict as
Docker's default profile, io_uring included.

Before, the filter refused only user namespaces and keyrings: io_uring_setup, pidfd_open,
process_vm_readv, name_to_handle_at and any personality went through, and some refusals a pass
saw came from this host's sysctls, not from the filter. Here the programs are run as the kernel
runs them over every call of the table (tests/support/seccomp_probe.py), then every refused call
is made from inside a sample: a root runner's bwrap sample, a user-mode one (`nobody` runs it)
and a Podman container, each call by a static program of its own that exits with the call's
errno. For each, the filters the sample's helper (or the container's process) really has are read
from the kernel (PTRACE_SECCOMP_GET_FILTER) and run on that call: the test asserts that they
refuse it, with the errno the program saw. A refusal by a sysctl or a missing capability would
leave the filter's answer ALLOW, so the filter, and nothing else, is what refused it. The mutation
checks weaken one guard each and the same test fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.docs import page
from tests.conftest import REPO
from tests.support.images import busybox_image, podman  # noqa: F401 (fixtures)
from tests.support.seccomp_probe import (
    ALLOW, AUDIT_AARCH64, AUDIT_ARM, AUDIT_I386, AUDIT_X86_64, ERRNO, installed, probe_elf, run, verdict,
)
from trajforge.sandbox.host.seccomp import (
    REFUSED_ERRNO, SYSCALLS_ALLOWED, SYSCALLS_CHECKED, refused, sample_program, syscall_numbers, zygote_program,
)

MACHINES = {"x86_64": (AUDIT_X86_64, AUDIT_I386), "aarch64": (AUDIT_AARCH64, AUDIT_ARM)}
EPERM, ENOSYS = ERRNO | 1, ERRNO | 38
NAMESPACE_FLAGS = {"newns": 0x20000, "newcgroup": 0x2000000, "newuts": 0x4000000, "newipc": 0x8000000,
                   "newuser": 0x10000000, "newpid": 0x20000000, "newnet": 0x40000000}
SIGCHLD, THREAD = 17, 0x3D0F00  # fork's flags; a thread's (VM, FS, FILES, SIGHAND, THREAD, SYSVSEM, SETTLS, *TID)
# What the issue found allowed, and the calls that reach another process or the kernel's own state.
ISSUE = ("io_uring_setup", "io_uring_enter", "io_uring_register", "pidfd_open", "process_vm_readv",
         "process_vm_writev", "name_to_handle_at", "open_by_handle_at")
ALSO = ("unshare", "setns", "mount", "umount2", "pivot_root", "keyctl", "add_key", "request_key", "bpf",
        "perf_event_open", "userfaultfd", "kexec_load", "init_module", "finit_module", "reboot", "swapon", "chroot",
        "pidfd_getfd", "kcmp", "fsopen", "open_tree", "move_mount", "settimeofday", "clock_settime", "acct")


# --- the programs, run as the kernel runs them ----------------------------------------------------

@pytest.mark.parametrize("machine", MACHINES)
def test_a_sample_s_filter_allows_what_it_lists_and_refuses_every_other_call(machine: str) -> None:
    program, numbers = sample_program(machine), syscall_numbers(machine)
    native, compat = MACHINES[machine]
    assert program is not None and len(numbers) > 300
    for name, nr in numbers.items():
        if name not in SYSCALLS_CHECKED:
            assert run(program, nr, native) == (ALLOW if name in SYSCALLS_ALLOWED else EPERM), name
    for name in ISSUE + ALSO:
        assert name in refused(machine) and run(program, numbers[name], native) == EPERM, name
    known = set(numbers.values())
    unknown = [nr for nr in range(max(known) + 64) if nr not in known] + [1 << 30 | numbers["getpid"], 0xFFFFFFFF]
    assert all(run(program, nr, native) == ENOSYS for nr in unknown)  # a newer kernel's, x32's: as without them
    assert all(run(program, nr, compat) == ENOSYS for nr in range(600))  # the 32-bit entry, whole
    assert run(program, numbers["getpid"], 0x1234) == ENOSYS  # any other architecture


@pytest.mark.parametrize("machine", MACHINES)
def test_a_sample_s_filter_checks_the_arguments_that_decide(machine: str) -> None:
    program, numbers = sample_program(machine), syscall_numbers(machine)
    assert program is not None
    native = MACHINES[machine][0]
    clone = numbers["clone"]
    for flag in NAMESPACE_FLAGS.values():
        assert run(program, clone, native, (flag | SIGCHLD,)) == EPERM, hex(flag)
    assert run(program, clone, native, (SIGCHLD,)) == ALLOW and run(program, clone, native, (THREAD,)) == ALLOW
    assert run(program, numbers["clone3"], native) == ENOSYS  # its flags are in memory: the C library falls back
    persona = numbers["personality"]
    for value in (0, 8, 0x20000, 0x20008, 0xFFFFFFFF):
        assert run(program, persona, native, (value,)) == ALLOW, value
    for value in (0x40000, 0x400000, 0x1, 0x8 | 0x40000):  # ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, other domains
        assert run(program, persona, native, (value,)) == EPERM, value
    socket = numbers["socket"]
    assert [run(program, socket, native, (family, 1, 0)) for family in (1, 2, 10, 16, 17, 38, 39, 40, 41)] == \
        [ALLOW] * 5 + [EPERM, ALLOW, EPERM, ALLOW]  # AF_ALG and AF_VSOCK refused


@pytest.mark.parametrize("machine", MACHINES)
def test_the_zygote_s_filter_refuses_only_user_namespaces_and_keyrings(machine: str) -> None:
    """It must leave the zygote what it makes sandboxes with (unshare, setns, mount...)."""
    program, numbers = zygote_program(machine), syscall_numbers(machine)
    assert program is not None
    native, compat = MACHINES[machine]
    compat_numbers = {"x86_64": {"clone": 120, "unshare": 310, "clone3": 435, "keyctl": 288, "mount": 21},
                      "aarch64": {"clone": 120, "unshare": 337, "clone3": 435, "keyctl": 311, "mount": 21}}[machine]
    masks = [0, 1 << 30] if machine == "x86_64" else [0]  # x32's calls: native ones with a bit set
    for arch, nums, bits in ((native, numbers, masks), (compat, compat_numbers, [0])):
        for bit in bits:
            for call in ("clone", "unshare"):
                assert run(program, bit | nums[call], arch, (0x10000000 | SIGCHLD,)) == EPERM
                assert run(program, bit | nums[call], arch, (0x20000 | 0x40000000 | SIGCHLD,)) == ALLOW
            assert run(program, bit | nums["clone3"], arch) == ENOSYS
            assert run(program, bit | nums["keyctl"], arch) == EPERM
            assert run(program, bit | nums["mount"], arch) == ALLOW
    assert all(run(program, nr, native) == ALLOW for name, nr in numbers.items()
               if name not in ("clone", "unshare", "clone3", "add_key", "request_key", "keyctl"))
    assert run(program, numbers["getpid"], 0x1234) == ENOSYS


def readme_refused() -> list[str]:
    text = page("sandboxes.md")
    found = re.search(r"<!-- refused calls: tests/sandbox/test_seccomp.py -->(.*?)<!-- end -->", text, re.S)
    assert found, "the sandboxes page's list of refused calls is missing"
    return re.findall(r"`(\w+)`", found.group(1))


def test_the_readme_lists_every_refused_call() -> None:
    assert readme_refused() == refused("x86_64")
    assert set(refused("aarch64")) <= set(refused("x86_64"))  # aarch64: those of them it has


def test_the_container_profile_is_the_sample_s_filter_as_oci_json() -> None:
    from trajforge.sandbox.backends.container.seccomp import container_profile

    profile = container_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO" and profile["defaultErrnoRet"] == REFUSED_ERRNO
    plain = [r for r in profile["syscalls"] if not r.get("args") and not r.get("includes")]
    assert plain[0] == {"names": sorted(SYSCALLS_ALLOWED), "action": "SCMP_ACT_ALLOW"}
    allowed = {n for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ALLOW" for n in r["names"]}
    for machine in MACHINES:
        assert not set(refused(machine)) - {"chroot"} & allowed, machine
    assert [r for r in profile["syscalls"] if "chroot" in r["names"]] == [
        {"names": ["chroot"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_CHROOT"]}}]  # as in Docker
    checked = {n: [r for r in profile["syscalls"] if r["names"] == [n]] for n in SYSCALLS_CHECKED}
    assert checked["clone"] == [{"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [
        {"index": 0, "value": sum(NAMESPACE_FLAGS.values()), "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]}]
    assert checked["clone3"] == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]
    assert sorted(r["args"][0]["value"] for r in checked["personality"]) == [0, 8, 0x20000, 0x20008, 0xFFFFFFFF]
    assert sorted((r["args"][0]["op"], r["args"][0]["value"]) for r in checked["socket"]) == [
        ("SCMP_CMP_EQ", 39), ("SCMP_CMP_GT", 40), ("SCMP_CMP_LT", 38)]


# --- every refused call, made from inside a sample ------------------------------------------------

@dataclass(frozen=True)
class Probe:
    label: str
    nr: int
    args: tuple[int, ...] = ()
    compat: bool = False
    expect: int = EPERM  # the filter's answer

    @property
    def arch(self) -> int:
        return AUDIT_I386 if self.compat else AUDIT_X86_64


def probes(container: bool = False) -> list[Probe]:
    """Each refused call (its arguments 0: harmless whatever happens), the argument checks, calls
    of no kernel and of the 32-bit entries (not for containers: their profile keeps Docker's
    32-bit calls, and what a number unknown to it gets is the container runtime's choice), and
    calls a sample makes every day, which go through."""
    numbers = syscall_numbers("x86_64")
    out = [Probe(name, numbers[name]) for name in refused("x86_64") if not (container and name == "chroot")]
    out += [Probe(f"clone-{flag}", numbers["clone"], (bit | SIGCHLD,)) for flag, bit in NAMESPACE_FLAGS.items()]
    out += [Probe("clone3", numbers["clone3"], expect=ENOSYS), Probe("personality-no-aslr", numbers["personality"],
            (0x40000,)), Probe("socket-alg", numbers["socket"], (38, 5, 0)), Probe("socket-vsock", numbers["socket"],
                                                                                      (40, 1, 0))]
    if not container:
        out += [Probe("unknown", max(numbers.values()) + 1, expect=ENOSYS), Probe("gap", 400, expect=ENOSYS),
                Probe("x32-getpid", 1 << 30 | numbers["getpid"], expect=ENOSYS),
                Probe("i386-getpid", 20, compat=True, expect=ENOSYS)]
    out += [Probe("getpid", numbers["getpid"], expect=ALLOW), Probe("socket-inet", numbers["socket"], (2, 2, 0),
            expect=ALLOW), Probe("personality-query", numbers["personality"], (0xFFFFFFFF,), expect=ALLOW)]
    return out


RUN = "chmod +x probe-*; for f in probe-*; do ./$f; echo \"${f#probe-} $?\"; done"


async def make_probes(sb: Any, todo: list[Probe]) -> dict[str, int]:
    """Each probe's exit status (its call's errno) from a command of the sample `sb`."""
    for probe in todo:
        await sb.write_file(f"probe-{probe.label}", probe_elf(probe.nr, probe.args, compat=probe.compat))
    res = await sb.exec(RUN, timeout=300)
    return {label: int(code) for label, code in (line.split() for line in res.stdout.splitlines())}


def assert_refused_by_the_filter(filters: list[bytes], codes: dict[str, int], todo: list[Probe],
                                 container: bool = False) -> None:
    """The filters the sample has answer each call as expected, and the call failed with that
    answer's errno (went through when allowed): what refused it is the filter."""
    assert filters, "the sample has no seccomp filter"
    wrong = []
    for probe in todo:
        answer = verdict(filters, probe.nr, probe.arch, probe.args)
        ok = answer == probe.expect or (container and probe.expect == EPERM and answer == ENOSYS)  # runc's stub
        seen = 0 if answer == ALLOW else answer & 0xFFFF
        if not ok or codes.get(probe.label) != seen:
            wrong.append(f"{probe.label}: filter {answer:#x} (wanted {probe.expect:#x}), "
                         f"errno {codes.get(probe.label)}")
    assert not wrong, wrong


needs_x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the probes are x86_64 machine code")


def bwrap_root_reason() -> str | None:
    from trajforge.sandbox.backends.bwrap.bwrap_backend import probe

    status = asyncio.run(probe())
    return None if status.usable and status.mode == "root" else f"needs root-mode bwrap ({status.detail})"


@needs_x86_64
def test_a_root_runner_s_bwrap_sample_is_refused_each_call_by_its_filter(tmp_path: Path) -> None:
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox

    if (reason := bwrap_root_reason()) is not None:
        pytest.skip(reason)

    async def main() -> tuple[list[bytes], dict[str, int]]:
        sb = BwrapSandbox(tmp_path, network=NetworkMode.NONE)
        await sb.start()
        try:
            codes = await make_probes(sb, probes())
            return installed(sb.helper_pid), codes  # the zygote's filter and the sample's
        finally:
            await sb.close()

    filters, codes = asyncio.run(main())
    assert_refused_by_the_filter(filters, codes, probes())
    assert len(filters) == 2, "the zygote's filter and the sample's"


USER_CHILD = textwrap.dedent("""
    import asyncio, json, sys
    from pathlib import Path
    from trajforge.catalog.sandboxes import NetworkMode
    from trajforge.sandbox.backends.bwrap.bwrap_backend import probe
    from trajforge.sandbox.backends.bwrap.bwrap_sandbox import BwrapSandbox

    async def main():
        root, probes = Path(sys.argv[1]), Path(sys.argv[2])
        if sys.argv[4:] == ["zygote's filter"]:  # the mutation check: the filter samples had before
            from trajforge.sandbox.backends.bwrap import bwrap_start
            from trajforge.sandbox.host.seccomp import zygote_program
            bwrap_start.sample_program = zygote_program
        status = await probe()
        sb = BwrapSandbox(root / "ws", network=NetworkMode.NONE)
        await sb.start()
        try:
            for elf in sorted(probes.iterdir()):
                await sb.write_file(elf.name, elf.read_bytes())
            res = await sb.exec(sys.argv[3], timeout=300)
            bwrap = sb._holder.pid
            with open(f"/proc/{bwrap}/task/{bwrap}/children") as f:
                helper = int(f.read().split()[0])
            print(json.dumps({"mode": status.mode, "out": res.stdout, "helper": helper}), flush=True)
            sys.stdin.readline()  # while the test reads the helper's filters
        finally:
            await sb.close()

    asyncio.run(main())
""")


@needs_x86_64
def test_a_user_mode_bwrap_sample_is_refused_each_call_by_its_filter(mutant: tuple[str, ...] = ()) -> None:
    from tests.sandbox.test_bwrap_user import SYSTEM_PY, _skip_reason

    if (reason := _skip_reason()) is not None:
        pytest.skip(reason)
    todo = probes()
    with tempfile.TemporaryDirectory(prefix="trajforge-seccomp-") as tmp:  # `nobody` must reach it
        os.chmod(tmp, 0o755)
        (Path(tmp) / "ws").mkdir()
        os.chmod(Path(tmp) / "ws", 0o777)
        (Path(tmp) / "probes").mkdir()
        for probe in todo:
            (Path(tmp) / "probes" / f"probe-{probe.label}").write_bytes(probe_elf(probe.nr, probe.args,
                                                                                  compat=probe.compat))
        env = {"PATH": "/usr/bin:/bin", "HOME": tmp, "PYTHONPATH": str(REPO / "src")}
        child = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", SYSTEM_PY, "-c",
                                  USER_CHILD, tmp, f"{tmp}/probes", RUN, *mutant], env=env, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout is not None and child.stdin is not None
            line = child.stdout.readline()
            assert line, "the user-mode child failed"
            out = json.loads(line)
            filters = installed(out["helper"])
            child.stdin.write("done\n")
            child.stdin.close()
        finally:
            child.wait(timeout=120)
    assert child.returncode == 0 and out["mode"] == "user"
    codes = {label: int(code) for label, code in (line.split() for line in out["out"].splitlines())}
    assert_refused_by_the_filter(filters, codes, todo)
    assert len(filters) == 1  # bwrap's --seccomp: the sample's filter alone


@needs_x86_64
def test_a_container_sample_is_refused_each_call_by_its_profile(tmp_path: Path, busybox_image: str,  # noqa: F811
                                                                 podman: Any) -> None:  # noqa: F811
    from tests.support.sandboxes import create_sandbox
    from trajforge.config import RunConfig

    if os.geteuid() != 0:
        pytest.skip("reading a container process's filters takes root")
    cfg = RunConfig(container_engine="podman", run_name=f"seccomp-{os.getpid()}", sandbox_network="none")
    todo = probes(container=True)

    async def main() -> tuple[list[bytes], dict[str, int]]:
        sb = await create_sandbox(cfg, cwd=None, image=busybox_image, root=tmp_path)
        try:
            codes = await make_probes(sb, todo)
            pid = (await sb.engine.run("inspect", "--format", "{{.State.Pid}}", sb.name or "", timeout=30)).stdout
            return installed(int(pid)), codes
        finally:
            await sb.close()

    filters, codes = asyncio.run(main())
    assert_refused_by_the_filter(filters, codes, todo, container=True)


def test_the_user_mode_test_fails_with_the_filter_samples_had_before() -> None:
    with pytest.raises(AssertionError):
        test_a_user_mode_bwrap_sample_is_refused_each_call_by_its_filter(("zygote's filter",))


@needs_x86_64
def test_the_container_test_fails_with_io_uring_allowed(tmp_path: Path, busybox_image: str, podman: Any,  # noqa: F811
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from trajforge.sandbox.backends.container import seccomp as container_seccomp

    real = container_seccomp.container_profile

    def io_uring_allowed() -> dict[str, Any]:
        profile = real()
        profile["syscalls"][0]["names"].append("io_uring_setup")
        return profile

    monkeypatch.setattr(container_seccomp, "container_profile", io_uring_allowed)
    with pytest.raises(AssertionError, match="io_uring_setup"):
        test_a_container_sample_is_refused_each_call_by_its_profile(tmp_path, busybox_image, podman)
