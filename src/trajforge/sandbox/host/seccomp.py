"""A seccomp filter for bwrap samples: no user namespaces, no kernel keyrings. Stdlib only.

In a user namespace of its own a process is root there and can mount, make network devices and
reach kernel code that is otherwise root-only: a large attack surface, and the usual first step
of a kernel escape. Nothing a tool-using agent runs needs one (Chromium runs with --no-sandbox,
tools/browser/toolset.py). The root mode's zygote (zygote.py) installs this filter on itself when it
starts, so every sandbox it forks and every command of every sample inherits it; the
zygote's and the sandboxes' own unshare and setns calls carry no CLONE_NEWUSER and pass. As in
Docker's default profile:
- clone and unshare with CLONE_NEWUSER fail with EPERM;
- clone3 fails with ENOSYS, since its flags sit in memory a filter cannot read: the C library
  falls back to clone, which the filter can check;
- add_key, request_key and keyctl fail with EPERM: kernel keyrings are not namespaced, so a
  sample's keys could outlive it in the kernel, and nothing an agent runs needs them;
- for x86_64 the x32 numbering and the 32-bit (i386) entry are covered with their own numbers,
  for aarch64 the 32-bit (arm) one; any other architecture field gets ENOSYS for every call.
On another machine architecture no filter is installed (`forbid_user_namespaces` returns False).
The zygote installs it with seccomp(2) and SECCOMP_FILTER_FLAG_SPEC_ALLOW where the kernel
knows the flag: kernels before 5.16 otherwise turn on the speculative store bypass mitigation
for every filtered process, which slows the sample's programs and protects nothing of the host.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

from trajforge.sandbox.host.root_view import checked

_SC_NEWUSER = 0x10000000
_SC_EPERM, _SC_ENOSYS = 1, 38
_SC_PR_SET_SECCOMP, _SC_SECCOMP_MODE_FILTER = 22, 2
_SC_SET_MODE_FILTER, _SC_FLAG_SPEC_ALLOW, _SC_EINVAL = 1, 4, 22
_SC_SYSCALL = {"x86_64": 317, "aarch64": 277}  # seccomp(2)
_SC_ALLOW, _SC_ERRNO = 0x7FFF0000, 0x00050000
_SC_LD_ABS, _SC_AND, _SC_JEQ, _SC_JSET, _SC_RET = 0x20, 0x54, 0x15, 0x45, 0x06
_SC_X32_BIT = 0x40000000
# machine -> (native audit arch, number mask, its calls, compat arch, its calls); calls are
# (clone, unshare, clone3, (add_key, request_key, keyctl))
_SC_ARCHES = {
    "x86_64": (0xC000003E, ~_SC_X32_BIT & 0xFFFFFFFF, (56, 272, 435, (248, 249, 250)),
               0x40000003, (120, 310, 435, (286, 287, 288))),
    "aarch64": (0xC00000B7, 0xFFFFFFFF, (220, 97, 435, (217, 218, 219)),
                0x40000028, (120, 337, 435, (309, 310, 311))),
}


@functools.cache
def seccomp_program(machine: str) -> bytes | None:
    """The filter's instructions (struct sock_filter[]), None for a machine without a table. Made
    once per process."""
    if machine not in _SC_ARCHES:
        return None
    native, mask, calls, compat, compat_calls = _SC_ARCHES[machine]
    code: list[tuple[int, object, object, int]] = []  # jump targets are labels until resolved below
    labels: dict[str, int] = {}

    def block(calls: tuple) -> None:  # type: ignore[type-arg]
        clone, unshare, clone3, keys = calls
        code.append((_SC_JEQ, "enosys", 0, clone3))
        code.append((_SC_JEQ, "flags", 0, clone))
        code.append((_SC_JEQ, "flags", 0, unshare))
        code.extend((_SC_JEQ, "eperm", 0, nr) for nr in keys)
        code.append((_SC_RET, 0, 0, _SC_ALLOW))

    code += [(_SC_LD_ABS, 0, 0, 4), (_SC_JEQ, 0, "compat", native),  # the architecture
             (_SC_LD_ABS, 0, 0, 0), (_SC_AND, 0, 0, mask)]  # the number; x32's are native ones with a bit set
    block(calls)
    labels["compat"] = len(code)
    code += [(_SC_JEQ, 0, "enosys", compat), (_SC_LD_ABS, 0, 0, 0)]  # the architecture is still loaded
    block(compat_calls)
    labels["flags"] = len(code)  # the low half of the first argument (little-endian)
    code += [(_SC_LD_ABS, 0, 0, 16), (_SC_JSET, "eperm", 0, _SC_NEWUSER), (_SC_RET, 0, 0, _SC_ALLOW)]
    labels["eperm"] = len(code)
    code.append((_SC_RET, 0, 0, _SC_ERRNO | _SC_EPERM))
    labels["enosys"] = len(code)
    code.append((_SC_RET, 0, 0, _SC_ERRNO | _SC_ENOSYS))

    def offset(target: object, at: int) -> int:  # a jump counts from the next instruction
        return labels[target] - at - 1 if isinstance(target, str) else int(target)  # type: ignore[call-overload]

    return b"".join(struct.pack("=HBBI", op, offset(jt, at), offset(jf, at), k)
                    for at, (op, jt, jf, k) in enumerate(code))


class _Fprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def forbid_user_namespaces(libc) -> bool:  # type: ignore[no-untyped-def]
    """Install the filter on this process (no_new_privs must be set); False where there is no
    table for this machine. Raises OSError when the kernel refuses it."""
    machine = os.uname().machine
    prog = seccomp_program(machine)
    if prog is None:
        return False
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    done = libc.syscall(_SC_SYSCALL[machine], _SC_SET_MODE_FILTER, _SC_FLAG_SPEC_ALLOW, ctypes.byref(fprog))
    if done < 0 and ctypes.get_errno() == _SC_EINVAL:  # a kernel that does not know the flag
        done = libc.prctl(_SC_PR_SET_SECCOMP, _SC_SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    checked(done, "seccomp filter")
    return True
