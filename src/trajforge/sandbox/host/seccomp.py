"""The seccomp filters of bwrap samples: stdlib only, part of the zygote's assembled source.

Two filters, built from one table of the kernel's system calls per machine (x86_64, aarch64):

The sample's (`sample_program`), at least as strict as Docker's default profile: every process
that serves a sample or runs its code has it (the root mode's sandbox helper installs it when it
drops its privileges, sandbox_init.py, and so does a container's file helper; bwrap installs it
on a user-mode helper), and every command inherits it. Only the calls of SYSCALLS_ALLOWED go
through (what Docker's default profile allows a container without added capabilities, less a
few calls), with their arguments checked where one decides:
- clone with a namespace flag (CLONE_NEWUSER, NEWNS, NEWPID, NEWNET, NEWIPC, NEWUTS, NEWCGROUP),
  personality other than the execution domains Docker allows (Linux, 32-bit Linux, 2.6-style
  uname, both, and the query) and socket for AF_ALG and AF_VSOCK fail with EPERM; clone3 fails
  with ENOSYS, since its flags sit in memory a filter cannot read: the C library falls back to
  clone, which the filter checks;
- every other call the table names fails with EPERM (`refused` lists them): namespaces and
  mounts, kernel modules, keyrings (not namespaced: a sample's keys would outlive it), io_uring
  (its operations never pass a filter), eBPF, perf events, userfaultfd, other processes' memory
  and file handles (process_vm_readv/writev, pidfd_open, pidfd_getfd, name_to_handle_at,
  open_by_handle_at), the clock, swap, reboot...;
- a number the table does not name (a call of a newer kernel) and the 32-bit entries (i386 and
  x32 on x86_64, arm on aarch64) fail with ENOSYS, as on a kernel without them, so that the C
  library falls back where it can. A 32-bit program does not run in a bwrap sample.
The zygote's (`zygote_program`), which it installs on itself at its start so that nothing it
forks ever runs without a filter, and which must leave it the calls it makes a sandbox with
(unshare and setns without CLONE_NEWUSER, mount...): clone and unshare with CLONE_NEWUSER fail
with EPERM, clone3 with ENOSYS, the keyrings with EPERM, on the native and the 32-bit entries
(x32 with its native numbers), and any other architecture field with ENOSYS for every call. A
sample's process has both filters; the kernel applies the stricter answer.
On another machine architecture no filter is installed (the functions return None or False).
A filter is installed with seccomp(2) and SECCOMP_FILTER_FLAG_SPEC_ALLOW where the kernel knows
the flag: kernels before 5.16 otherwise turn on the speculative store bypass mitigation for
every filtered process, which slows the sample's programs and protects nothing of the host.
The programs are classic BPF: after the architecture, a binary search over the call number (a
few comparisons whatever the call), so the kernel's cache of constant answers (5.11+) skips
running them for every allowed call that does not look at its arguments.
"""

from __future__ import annotations

import ctypes
import functools
import os
import struct

from trajforge.sandbox.host.root_view import checked

_SC_EPERM, _SC_ENOSYS = 1, 38
REFUSED_ERRNO = _SC_EPERM  # what a call a sample may not make fails with, as in Docker's profile
_SC_PR_SET_SECCOMP, _SC_SECCOMP_MODE_FILTER = 22, 2
_SC_SET_MODE_FILTER, _SC_FLAG_SPEC_ALLOW, _SC_EINVAL = 1, 4, 22
_SC_SYSCALL = {"x86_64": 317, "aarch64": 277}  # seccomp(2)
_SC_ALLOW, _SC_ERRNO = 0x7FFF0000, 0x00050000
_SC_LD_ABS, _SC_AND, _SC_JA, _SC_JEQ, _SC_JGE, _SC_JSET, _SC_RET = 0x20, 0x54, 0x05, 0x15, 0x35, 0x45, 0x06
_SC_NR, _SC_ARCH, _SC_ARG0 = 0, 4, 16  # offsets in struct seccomp_data (the low half of an argument: little-endian)
_SC_X32_BIT = 0x40000000
_SC_NEWUSER = 0x10000000
_SC_NAMESPACES = 0x7E020000  # CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET
_SC_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # PER_LINUX, PER_LINUX32, UNAME26, both, query
_SC_SOCKET_FAMILIES = (38, 40)  # AF_ALG, AF_VSOCK: refused
# machine -> (native audit arch, compat audit arch, the compat numbers of the zygote filter's calls:
# clone, unshare, clone3, add_key, request_key, keyctl)
_SC_ARCHES = {"x86_64": (0xC000003E, 0x40000003, (120, 310, 435, 286, 287, 288)),
              "aarch64": (0xC00000B7, 0x40000028, (120, 337, 435, 309, 310, 311))}

# The kernel's system call numbers on each machine (arch/x86/entry/syscalls/syscall_64.tbl and the
# generic table aarch64 uses, as of Linux 6.19), as runs of consecutive numbers: (first number, names).
# Calls added since Linux 5.1 have one number on every machine.
_SC_SINCE_5_1 = (424, """
    pidfd_send_signal io_uring_setup io_uring_enter io_uring_register open_tree move_mount fsopen fsconfig
    fsmount fspick pidfd_open clone3 close_range openat2 pidfd_getfd faccessat2 process_madvise epoll_pwait2
    mount_setattr quotactl_fd landlock_create_ruleset landlock_add_rule landlock_restrict_self memfd_secret
    process_mrelease futex_waitv set_mempolicy_home_node cachestat fchmodat2 map_shadow_stack futex_wake
    futex_wait futex_requeue statmount listmount lsm_get_self_attr lsm_set_self_attr lsm_list_modules mseal
    setxattrat getxattrat listxattrat removexattrat open_tree_attr file_getattr file_setattr listns
""")
_SC_TABLES = {
    "x86_64": (
        (0, """
            read write open close stat fstat lstat poll lseek mmap mprotect munmap brk rt_sigaction rt_sigprocmask
            rt_sigreturn ioctl pread64 pwrite64 readv writev access pipe select sched_yield mremap msync mincore
            madvise shmget shmat shmctl dup dup2 pause nanosleep getitimer alarm setitimer getpid sendfile socket
            connect accept sendto recvfrom sendmsg recvmsg shutdown bind listen getsockname getpeername socketpair
            setsockopt getsockopt clone fork vfork execve exit wait4 kill uname semget semop semctl shmdt msgget
            msgsnd msgrcv msgctl fcntl flock fsync fdatasync truncate ftruncate getdents getcwd chdir fchdir rename
            mkdir rmdir creat link unlink symlink readlink chmod fchmod chown fchown lchown umask gettimeofday
            getrlimit getrusage sysinfo times ptrace getuid syslog getgid setuid setgid geteuid getegid setpgid
            getppid getpgrp setsid setreuid setregid getgroups setgroups setresuid getresuid setresgid getresgid
            getpgid setfsuid setfsgid getsid capget capset rt_sigpending rt_sigtimedwait rt_sigqueueinfo
            rt_sigsuspend sigaltstack utime mknod uselib personality ustat statfs fstatfs sysfs getpriority
            setpriority sched_setparam sched_getparam sched_setscheduler sched_getscheduler sched_get_priority_max
            sched_get_priority_min sched_rr_get_interval mlock munlock mlockall munlockall vhangup modify_ldt
            pivot_root _sysctl prctl arch_prctl adjtimex setrlimit chroot sync acct settimeofday mount umount2
            swapon swapoff reboot sethostname setdomainname iopl ioperm create_module init_module delete_module
            get_kernel_syms query_module quotactl nfsservctl getpmsg putpmsg afs_syscall tuxcall security gettid
            readahead setxattr lsetxattr fsetxattr getxattr lgetxattr fgetxattr listxattr llistxattr flistxattr
            removexattr lremovexattr fremovexattr tkill time futex sched_setaffinity sched_getaffinity
            set_thread_area io_setup io_destroy io_getevents io_submit io_cancel get_thread_area lookup_dcookie
            epoll_create epoll_ctl_old epoll_wait_old remap_file_pages getdents64 set_tid_address restart_syscall
            semtimedop fadvise64 timer_create timer_settime timer_gettime timer_getoverrun timer_delete
            clock_settime clock_gettime clock_getres clock_nanosleep exit_group epoll_wait epoll_ctl tgkill utimes
            vserver mbind set_mempolicy get_mempolicy mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify
            mq_getsetattr kexec_load waitid add_key request_key keyctl ioprio_set ioprio_get inotify_init
            inotify_add_watch inotify_rm_watch migrate_pages openat mkdirat mknodat fchownat futimesat newfstatat
            unlinkat renameat linkat symlinkat readlinkat fchmodat faccessat pselect6 ppoll unshare set_robust_list
            get_robust_list splice tee sync_file_range vmsplice move_pages utimensat epoll_pwait signalfd
            timerfd_create eventfd fallocate timerfd_settime timerfd_gettime accept4 signalfd4 eventfd2
            epoll_create1 dup3 pipe2 inotify_init1 preadv pwritev rt_tgsigqueueinfo perf_event_open recvmmsg
            fanotify_init fanotify_mark prlimit64 name_to_handle_at open_by_handle_at clock_adjtime syncfs sendmmsg
            setns getcpu process_vm_readv process_vm_writev kcmp finit_module sched_setattr sched_getattr renameat2
            seccomp getrandom memfd_create kexec_file_load bpf execveat userfaultfd membarrier mlock2
            copy_file_range preadv2 pwritev2 pkey_mprotect pkey_alloc pkey_free statx io_pgetevents rseq uretprobe
            uprobe
        """),
        _SC_SINCE_5_1,
    ),
    "aarch64": (
        (0, """
            io_setup io_destroy io_submit io_cancel io_getevents setxattr lsetxattr fsetxattr getxattr lgetxattr
            fgetxattr listxattr llistxattr flistxattr removexattr lremovexattr fremovexattr getcwd lookup_dcookie
            eventfd2 epoll_create1 epoll_ctl epoll_pwait dup dup3 fcntl inotify_init1 inotify_add_watch
            inotify_rm_watch ioctl ioprio_set ioprio_get flock mknodat mkdirat unlinkat symlinkat linkat renameat
            umount2 mount pivot_root nfsservctl statfs fstatfs truncate ftruncate fallocate faccessat chdir fchdir
            chroot fchmod fchmodat fchownat fchown openat close vhangup pipe2 quotactl getdents64 lseek read write
            readv writev pread64 pwrite64 preadv pwritev sendfile pselect6 ppoll signalfd4 vmsplice splice tee
            readlinkat newfstatat fstat sync fsync fdatasync sync_file_range timerfd_create timerfd_settime
            timerfd_gettime utimensat acct capget capset personality exit exit_group waitid set_tid_address unshare
            futex set_robust_list get_robust_list nanosleep getitimer setitimer kexec_load init_module delete_module
            timer_create timer_gettime timer_getoverrun timer_settime timer_delete clock_settime clock_gettime
            clock_getres clock_nanosleep syslog ptrace sched_setparam sched_setscheduler sched_getscheduler
            sched_getparam sched_setaffinity sched_getaffinity sched_yield sched_get_priority_max
            sched_get_priority_min sched_rr_get_interval restart_syscall kill tkill tgkill sigaltstack rt_sigsuspend
            rt_sigaction rt_sigprocmask rt_sigpending rt_sigtimedwait rt_sigqueueinfo rt_sigreturn setpriority
            getpriority reboot setregid setgid setreuid setuid setresuid getresuid setresgid getresgid setfsuid
            setfsgid times setpgid getpgid getsid setsid getgroups setgroups uname sethostname setdomainname
            getrlimit setrlimit getrusage umask prctl getcpu gettimeofday settimeofday adjtimex getpid getppid
            getuid geteuid getgid getegid gettid sysinfo mq_open mq_unlink mq_timedsend mq_timedreceive mq_notify
            mq_getsetattr msgget msgctl msgrcv msgsnd semget semctl semtimedop semop shmget shmctl shmat shmdt
            socket socketpair bind listen accept connect getsockname getpeername sendto recvfrom setsockopt
            getsockopt shutdown sendmsg recvmsg readahead brk munmap mremap add_key request_key keyctl clone execve
            mmap fadvise64 swapon swapoff mprotect msync mlock munlock mlockall munlockall mincore madvise
            remap_file_pages mbind get_mempolicy set_mempolicy migrate_pages move_pages rt_tgsigqueueinfo
            perf_event_open accept4 recvmmsg
        """),
        (260, """
            wait4 prlimit64 fanotify_init fanotify_mark name_to_handle_at open_by_handle_at clock_adjtime syncfs
            setns sendmmsg process_vm_readv process_vm_writev kcmp finit_module sched_setattr sched_getattr
            renameat2 seccomp getrandom memfd_create bpf execveat userfaultfd membarrier mlock2 copy_file_range
            preadv2 pwritev2 pkey_mprotect pkey_alloc pkey_free statx io_pgetevents rseq kexec_file_load
        """),
        _SC_SINCE_5_1,
    ),
}
# What a sample may call, its arguments aside (SYSCALLS_CHECKED): what Docker's default profile allows a
# container without added capabilities (io_uring excepted: it refuses it too), less pidfd_open,
# name_to_handle_at and process_vm_readv/writev (ptrace stays: a debugger's); with the names of the
# 32-bit entries, for containers' profiles (container_seccomp.py), and uprobe beside uretprobe: both
# serve the kernel's own probes, and the kernel passes them through every filter (Linux 6.13, 6.16).
SYSCALLS_ALLOWED = frozenset("""
    _llseek _newselect accept accept4 access adjtimex alarm arch_prctl arm_fadvise64_64 arm_sync_file_range
    bind breakpoint brk cacheflush cachestat capget capset chdir chmod chown chown32 clock_adjtime
    clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
    clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
    epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd
    eventfd2 execve execveat exit exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate
    fanotify_mark fchdir fchmod fchmodat fchmodat2 fchown fchown32 fchownat fcntl fcntl64 fdatasync
    fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstat64 fstatat64 fstatfs fstatfs64 fsync
    ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait futex_waitv futex_wake futimesat
    get_robust_list get_thread_area getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32
    getgid getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority
    getrandom getresgid getresgid32 getresuid getresuid32 getrlimit getrusage getsid getsockname getsockopt
    gettid gettimeofday getuid getuid32 getxattr getxattrat inotify_add_watch inotify_init inotify_init1
    inotify_rm_watch io_cancel io_destroy io_getevents io_pgetevents io_pgetevents_time64 io_setup io_submit
    ioctl ioprio_get ioprio_set ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self
    lchown lchown32 lgetxattr link linkat listen listmount listxattr listxattrat llistxattr lremovexattr
    lseek lsetxattr lstat lstat64 madvise map_shadow_stack membarrier memfd_create memfd_secret mincore
    mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 modify_ldt mprotect mq_getsetattr mq_notify
    mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap mseal
    msgctl msgget msgrcv msgsnd msync munlock munlockall munmap nanosleep newfstatat open openat openat2
    pause pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll ppoll_time64 prctl
    pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 ptrace pwrite64 pwritev
    pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
    remap_file_pages removexattr removexattrat rename renameat renameat2 restart_syscall rmdir rseq
    rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait
    rt_sigtimedwait_time64 rt_tgsigqueueinfo sched_get_priority_max sched_get_priority_min sched_getaffinity
    sched_getattr sched_getparam sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64
    sched_setaffinity sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select semctl
    semget semop semtimedop semtimedop_time64 send sendfile sendfile64 sendmmsg sendmsg sendto
    set_robust_list set_thread_area set_tid_address set_tls setfsgid setfsgid32 setfsuid setfsuid32 setgid
    setgid32 setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid setresgid32
    setresuid setresuid32 setreuid setreuid32 setrlimit setsid setsockopt setuid setuid32 setxattr
    setxattrat shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn
    socketcall socketpair splice stat stat64 statfs statfs64 statmount statx symlink symlinkat sync
    sync_file_range sync_file_range2 syncfs sysinfo tee tgkill time timer_create timer_delete
    timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
    timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate truncate64
    ugetrlimit umask uname unlink unlinkat uprobe uretprobe utime utimensat utimensat_time64 utimes vfork
    vmsplice wait4 waitid waitpid write writev
""".split())

# Actions: ("ret", value) returns it; ("flags", mask) EPERM when the first argument has a bit of
# mask, else allow; ("only", values) allow when it is one of values, else EPERM; ("not", values)
# EPERM when it is one of values, else allow.
_SC_OK, _SC_DENY, _SC_NONE = ("ret", _SC_ALLOW), ("ret", _SC_ERRNO | _SC_EPERM), ("ret", _SC_ERRNO | _SC_ENOSYS)
# The calls a sample's filter answers by their first argument (module doc).
SYSCALLS_CHECKED = {"clone": ("flags", _SC_NAMESPACES), "clone3": _SC_NONE,
                    "personality": ("only", _SC_PERSONALITIES), "socket": ("not", _SC_SOCKET_FAMILIES)}


@functools.cache
def syscall_numbers(machine: str) -> dict[str, int]:
    """The table of `machine`'s system calls: name -> number (empty for a machine without one)."""
    return {name: start + i for start, names in _SC_TABLES.get(machine, ()) for i, name in enumerate(names.split())}


def refused(machine: str) -> list[str]:
    """The calls of the table that a sample's filter always refuses (EPERM), sorted."""
    return sorted(n for n in syscall_numbers(machine) if n not in SYSCALLS_ALLOWED and n not in SYSCALLS_CHECKED)


def _sc_runs(rules: dict[int, tuple], default: tuple) -> list[tuple[int, tuple]]:  # type: ignore[type-arg]
    """[(first number, action)] for every number: consecutive numbers with one action make one run,
    numbers without a rule take `default`."""
    runs: list[tuple[int, tuple]] = []  # type: ignore[type-arg]

    def add(first: int, action: tuple) -> None:  # type: ignore[type-arg]
        if not runs or runs[-1][1] != action:
            runs.append((first, action))

    expect = 0
    for nr in sorted(rules):
        if nr != expect:
            add(expect, default)
        add(nr, rules[nr])
        expect = nr + 1
    add(expect, default)
    return runs


def _sc_assemble(sections: list, other: tuple) -> bytes:  # type: ignore[type-arg]
    """A program: for each (audit arch, number mask or None, {number: action}, default action)
    section, a binary search over the call number; `other` for every other architecture."""
    code: list[tuple[int, int, int, object]] = []  # (op, jt, jf, k); a JA's k is a label
    labels: dict[object, int] = {}
    blocks: dict[tuple, str] = {}  # type: ignore[type-arg]

    def leaf(action: tuple) -> None:  # type: ignore[type-arg]
        if action[0] == "ret":
            code.append((_SC_RET, 0, 0, action[1]))
        else:
            code.append((_SC_JA, 0, 0, blocks.setdefault(action, f"block{len(blocks)}")))

    def search(runs: list[tuple[int, tuple]]) -> None:  # type: ignore[type-arg]
        if len(runs) == 1:
            return leaf(runs[0][1])
        mid, right = len(runs) // 2, object()
        code.extend([(_SC_JGE, 0, 1, runs[mid][0]), (_SC_JA, 0, 0, right)])  # a JA jumps any distance
        search(runs[:mid])
        labels[right] = len(code)
        search(runs[mid:])

    code.append((_SC_LD_ABS, 0, 0, _SC_ARCH))
    for i, (arch, _mask, _rules, _default) in enumerate(sections):
        code.extend([(_SC_JEQ, 0, 1, arch), (_SC_JA, 0, 0, ("section", i))])
    leaf(other)
    for i, (_arch, mask, rules, default) in enumerate(sections):
        labels[("section", i)] = len(code)
        code.append((_SC_LD_ABS, 0, 0, _SC_NR))
        if mask is not None:
            code.append((_SC_AND, 0, 0, mask))
        search(_sc_runs(rules, default))
    for action, label in blocks.items():
        labels[label] = len(code)
        kind, arg = action
        code.append((_SC_LD_ABS, 0, 0, _SC_ARG0))
        if kind == "flags":
            code.extend([(_SC_JSET, 0, 1, arg), (_SC_RET, 0, 0, _SC_DENY[1]), (_SC_RET, 0, 0, _SC_ALLOW)])
        else:
            hit, miss = (_SC_ALLOW, _SC_DENY[1]) if kind == "only" else (_SC_DENY[1], _SC_ALLOW)
            for value in arg:
                code.extend([(_SC_JEQ, 0, 1, value), (_SC_RET, 0, 0, hit)])
            code.append((_SC_RET, 0, 0, miss))
    return b"".join(struct.pack("=HBBI", op, jt, jf, labels[k] - at - 1 if op == _SC_JA else k)
                    for at, (op, jt, jf, k) in enumerate(code))


@functools.cache
def sample_program(machine: str) -> bytes | None:
    """The sample's filter (module doc) as struct sock_filter[]; None for a machine without a
    table. Made once per process (the zygote's forks inherit it made)."""
    numbers = syscall_numbers(machine)
    if not numbers:
        return None
    rules = {nr: SYSCALLS_CHECKED.get(name, _SC_OK if name in SYSCALLS_ALLOWED else _SC_DENY)
             for name, nr in numbers.items()}
    return _sc_assemble([(_SC_ARCHES[machine][0], None, rules, _SC_NONE)], _SC_NONE)


@functools.cache
def zygote_program(machine: str) -> bytes | None:
    """The zygote's filter (module doc); None for a machine without a table."""
    numbers = syscall_numbers(machine)
    if not numbers:
        return None
    native, compat, compat_numbers = _SC_ARCHES[machine]
    actions = (("flags", _SC_NEWUSER), ("flags", _SC_NEWUSER), _SC_NONE, _SC_DENY, _SC_DENY, _SC_DENY)
    names = ("clone", "unshare", "clone3", "add_key", "request_key", "keyctl")
    mask = ~_SC_X32_BIT & 0xFFFFFFFF if machine == "x86_64" else None  # x32's calls: native ones with a bit set
    return _sc_assemble([(native, mask, {numbers[n]: a for n, a in zip(names, actions)}, _SC_OK),
                         (compat, None, dict(zip(compat_numbers, actions)), _SC_OK)], _SC_NONE)


class _Fprog(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _sc_install(libc, machine: str, prog: bytes | None) -> bool:  # type: ignore[no-untyped-def]
    if prog is None:
        return False
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _Fprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    done = libc.syscall(_SC_SYSCALL[machine], _SC_SET_MODE_FILTER, _SC_FLAG_SPEC_ALLOW, ctypes.byref(fprog))
    if done < 0 and ctypes.get_errno() == _SC_EINVAL:  # a kernel that does not know the flag
        done = libc.prctl(_SC_PR_SET_SECCOMP, _SC_SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0)
    checked(done, "seccomp filter")
    return True


def forbid_user_namespaces(libc) -> bool:  # type: ignore[no-untyped-def]
    """Install the zygote's filter on this process (no_new_privs must be set); False where there
    is no table for this machine. Raises OSError when the kernel refuses it."""
    machine = os.uname().machine
    sample_program(machine)  # made here, once: every sandbox the zygote forks inherits it made
    return _sc_install(libc, machine, zygote_program(machine))


def confine_sample(libc) -> bool:  # type: ignore[no-untyped-def]
    """Install the sample's filter on this process, whose every child inherits it (no_new_privs
    must be set); False where there is no table for this machine. Raises OSError when refused."""
    machine = os.uname().machine
    return _sc_install(libc, machine, sample_program(machine))
