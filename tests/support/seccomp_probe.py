"""What a seccomp filter answers, what filters a process has, and a program that makes one call:
for the tests of the sandboxes' filters (tests/sandbox/test_seccomp.py).

- `run(program, nr, arch, args)`: a classic BPF program run as the kernel runs a seccomp filter
  over struct seccomp_data; `verdict(programs, ...)` the kernel's answer for a process that has
  several (the strictest action; on a tie, the newest filter's);
- `installed(pid)`: the filters of a process, newest first, as the kernel hands them to a tracer
  (PTRACE_SECCOMP_GET_FILTER: root and CONFIG_CHECKPOINT_RESTORE), read by a child process that
  attaches, reads and detaches (a tracer is a thread: never pytest's);
- `probe_elf(nr, args, compat)`: a static x86_64 executable of a few hundred bytes that makes one
  system call (through `syscall`, or the 32-bit entry `int 0x80`) and exits with its errno, 0 when
  it succeeded. It needs no loader and no library, so it runs in any image.
"""

from __future__ import annotations

import struct
import subprocess
import sys
from collections.abc import Sequence

ALLOW, ERRNO, ACTION = 0x7FFF0000, 0x00050000, 0xFFFF0000
AUDIT_X86_64, AUDIT_I386, AUDIT_AARCH64, AUDIT_ARM = 0xC000003E, 0x40000003, 0xC00000B7, 0x40000028
_M32 = 0xFFFFFFFF


def run(program: bytes, nr: int, arch: int, args: Sequence[int] = (), ip: int = 0) -> int:
    """The value `program` returns for a call `nr` of `arch` with `args` (missing ones are 0)."""
    full = [a & 0xFFFFFFFFFFFFFFFF for a in (*args, *[0] * (6 - len(args)))]
    data = struct.pack("=IIQ6Q", nr & _M32, arch, ip, *full)
    code = [struct.unpack_from("=HBBI", program, i) for i in range(0, len(program), 8)]
    a = x = pc = 0
    mem = [0] * 16
    while True:
        op, jt, jf, k = code[pc]
        pc += 1
        cls = op & 0x07
        if cls in (0x00, 0x01):  # LD, LDX
            mode = op & 0xE0
            value = (struct.unpack_from("=I", data, k)[0] if mode == 0x20 else k if mode == 0x00
                     else mem[k] if mode == 0x60 else len(data))
            if cls == 0x00:
                a = value
            else:
                x = value
        elif cls == 0x02:  # ST
            mem[k] = a
        elif cls == 0x03:  # STX
            mem[k] = x
        elif cls == 0x04:  # ALU
            src, alu = (x if op & 0x08 else k), op & 0xF0
            a = {0x00: lambda: a + src, 0x10: lambda: a - src, 0x20: lambda: a * src, 0x30: lambda: a // src,
                 0x40: lambda: a | src, 0x50: lambda: a & src, 0x60: lambda: a << src, 0x70: lambda: a >> src,
                 0x80: lambda: -a, 0x90: lambda: a % src, 0xA0: lambda: a ^ src}[alu]() & _M32
        elif cls == 0x05:  # JMP
            src, jmp = (x if op & 0x08 else k), op & 0xF0
            if jmp == 0x00:
                pc += k
            else:
                taken = {0x10: a == src, 0x20: a > src, 0x30: a >= src, 0x40: bool(a & src)}[jmp]
                pc += jt if taken else jf
        elif cls == 0x06:  # RET
            return a if op & 0x18 == 0x10 else k
        else:  # MISC: TAX, TXA
            if op & 0xF8 == 0x00:
                x = a
            else:
                a = x


def _strictness(value: int) -> int:
    """The kernel compares actions as signed ints: the lower, the stricter (KILL_PROCESS first)."""
    action = value & ACTION
    return action - (1 << 32) if action & 0x80000000 else action


def verdict(programs: Sequence[bytes], nr: int, arch: int, args: Sequence[int] = ()) -> int:
    """What the kernel does for a process with `programs` (newest first): the strictest answer."""
    best = ALLOW
    for program in programs:
        got = run(program, nr, arch, args)
        if _strictness(got) < _strictness(best):
            best = got
    return best


_DUMP = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
    sys.exit(f"attach: {os.strerror(ctypes.get_errno())}")
os.waitpid(pid, 0x40000000)  # __WALL: stopped
try:
    for i in range(64):
        n = libc.ptrace(0x420C, pid, i, None)  # PTRACE_SECCOMP_GET_FILTER: its length first
        if n < 0:
            if ctypes.get_errno() == 2:  # ENOENT: no more
                break
            sys.exit(f"get filter: {os.strerror(ctypes.get_errno())}")
        buf = ctypes.create_string_buffer(n * 8)
        libc.ptrace(0x420C, pid, i, buf)
        print(buf.raw.hex())
finally:
    libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
"""


def installed(pid: int) -> list[bytes]:
    """The seccomp filters of process `pid`, newest first (root only). The kernel numbers them
    from the oldest, whatever ptrace(2) says."""
    out = subprocess.run([sys.executable, "-c", _DUMP, str(pid)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [bytes.fromhex(line) for line in reversed(out.stdout.split())]


def probe_elf(nr: int, args: Sequence[int] = (), *, compat: bool = False) -> bytes:
    """A static x86_64 ELF executable: call `nr` with `args` (through `int 0x80` with i386's
    registers when `compat`), exit with the call's errno (0 when it returned a value)."""
    if compat:  # eax: the number; ebx, ecx, edx, esi, edi: the arguments
        code = b"\xb8" + struct.pack("<I", nr)
        for opcode, value in zip(b"\xbb\xb9\xba\xbe\xbf", (*args, *[0] * (5 - len(args)))):
            code += bytes((opcode,)) + struct.pack("<I", value & _M32)
        code += b"\xcd\x80\x48\x63\xc0"  # int 0x80; movsxd rax, eax
    else:  # rax: the number; rdi, rsi, rdx, r10, r8, r9: the arguments
        code = b"\x48\xc7\xc0" + struct.pack("<i", nr)
        for prefix, value in zip((b"\x48\xbf", b"\x48\xbe", b"\x48\xba", b"\x49\xba", b"\x49\xb8", b"\x49\xb9"),
                                 (*args, *[0] * (6 - len(args)))):
            code += prefix + struct.pack("<Q", value & 0xFFFFFFFFFFFFFFFF)
        code += b"\x0f\x05"  # syscall
    # neg rax; cmp rax, 4095; jbe +2; xor eax, eax; mov edi, eax; mov eax, 231 (exit_group); syscall
    code += b"\x48\xf7\xd8\x48\x3d\xff\x0f\x00\x00\x76\x02\x31\xc0\x89\xc7\xb8\xe7\x00\x00\x00\x0f\x05"
    base, start = 0x400000, 64 + 56
    size = start + len(code)
    header = (b"\x7fELF\x02\x01\x01" + bytes(9)
              + struct.pack("<HHIQQQIHHHHHH", 2, 0x3E, 1, base + start, 64, 0, 0, 64, 56, 1, 0, 0, 0))
    segment = struct.pack("<IIQQQQQQ", 1, 5, 0, base, base, size, size, 0x1000)  # PT_LOAD, R+X
    return header + segment + code
