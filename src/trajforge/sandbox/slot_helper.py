"""The helper of a root-mode slot: one warm process that serves sample after sample.

The zygote forks it once per slot (zygote.op_slot) as pid 1 of the slot's pid namespace, in the
slot's network namespace, memory cgroup and cgroup namespace, with an empty bounding set and
no_new_privs (nothing it starts can gain a privilege), not dumpable. (A Python helper forked per
sample would cost more CPU than the rest of a one-command sample.) Once per slot: a private
mount namespace copied from the run's template (bwrap_root.py) with the slot's /proc (/proc/sys,
/proc/sysrq-trigger, /proc/irq and /proc/bus read-only, as in bwrap's), /dev/pts, /dev/mqueue,
and an IPC namespace (slot_mounts.SlotMounts).

`op_begin`, as root: the sample's workspace (a detached clone of its host directory made while
the host's view is entered: open_tree, move_mount) and, the first time, sized /tmp and /dev/shm;
then real and effective uid and gid become the sample's, the saved ones stay 0. Its effective
capabilities are then empty, so file operations are checked as the sample's own would be, and
commands carry the sample's uid. The sample's processes share that uid but cannot touch the
helper: their pid namespace's init ignores their signals and, not dumpable with saved uid 0, can
be neither ptraced nor read. Every request but `begin` and `end` carries the sample's token
(`tok`, given at `begin`): one not of the current sample is refused (`idle`), never run.

Parking (`after_command`): as a command the runner sent with `park` exits, the helper checks
that the sample holds nothing here: no process, command or job, no request waiting on the
channel, its workspace as `op_begin` made it (entries, modes, owners, extended attributes:
fsops.tree_state), nothing in /tmp, /dev/shm or IPC. If so it ends the sample as `op_end` does
and says so in the exit event; the runner gives the slot to another sample (bwrap.py).

`op_end`: root again, SIGKILL to every other process of the pid namespace (`kill(-1)` from its
init) until none is left, every job log and descriptor of the sample closed, its workspace
unmounted, and /tmp, /dev/shm and the IPC namespace renewed if it left anything in them. Nothing
else of the namespace is the sample's to change (no capabilities: no mount or unmount; every
other directory is root's and read-only to it). It answers {"clean": false} when a process would
not die in time: the runner then destroys the slot.
"""

from __future__ import annotations

import _socket
import os
import time

from trajforge.sandbox.fsops import tree_state
from trajforge.sandbox.helper import Helper
from trajforge.sandbox.slot_mounts import SlotMounts

KILL_SECONDS = 5.0


class SlotHelper(Helper):
    def __init__(self, sock, mounts: SlotMounts) -> None:  # type: ignore[no-untyped-def]
        super().__init__(sock)
        self.mounts = mounts
        self.uid: int | None = None
        self.devnull = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        self.saved_limits: list = []
        self.made: list | None = None  # the sample's workspace as op_begin made it (tree_state)
        self.token: object = None  # the sample's, carried by its every request

    def handle(self, meta: dict, payload: bytes) -> None:
        if meta["op"] not in ("begin", "end") and (self.uid is None or meta.get("tok") != self.token):
            self.send({"id": meta["id"], "error": "idle", "msg": "this sample is not in this slot"})
            return
        super().handle(meta, payload)

    def after_command(self) -> dict:
        """End the sample if it holds nothing in the slot (module doc); else change nothing."""
        if self.uid is None or self.procs or self.captures or self.logs or self.buf:
            return {}
        try:  # a request waiting to be read is the sample's: it must run in this slot
            self.sock.recv(1, _socket.MSG_PEEK | _socket.MSG_DONTWAIT)
            return {}  # (or the runner has gone)
        except BlockingIOError:
            pass
        try:  # WNOWAIT: only look. A child left means a process of the sample still runs.
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            return {}
        except ChildProcessError:
            pass
        if not self.mounts.pristine(self.cfg["workdir"], self.made):
            return {}
        reply, _ = self._end(empty=True)
        return {"parked": True, "clean": reply["clean"]}

    def _root(self) -> None:
        os.setresuid(-1, 0, -1)  # the saved uid is 0: the effective one may return to it
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)

    def op_begin(self, m: dict, _p: bytes) -> tuple[dict, bytes]:
        if self.uid is not None:
            raise ValueError("a sample is already in this slot")
        self._root()
        self.mounts.enter(m["mounts"], m.get("tmp"), m.get("shm"))
        self.made = tree_state(m["workdir"])
        self.token = m.get("tok")
        import resource

        self.saved_limits = [(res, resource.getrlimit(res)) for res, _s, _h in m.get("limits", ())]
        for res, soft, hard in m.get("limits", ()):  # a shell other than bash: the helper's own, inherited
            resource.setrlimit(res, (soft, hard))
        self.cfg = m
        uid = m["uid"]
        os.setresgid(uid, uid, 0)
        os.setresuid(uid, uid, 0)  # effective uid not 0: the kernel empties the effective capabilities
        self.uid = uid
        return {"uid": os.getuid()}, b""

    def op_end(self, _m: dict, _p: bytes) -> tuple[dict, bytes]:
        return self._end(empty=False)

    def _end(self, *, empty: bool) -> tuple[dict, bytes]:
        """`empty`: the sample was just found holding nothing (after_command): /tmp, /dev/shm and
        IPC need no second look."""
        self._root()
        clean = self.kill_all()
        self.drop_commands()
        import resource

        for res, pair in self.saved_limits:
            resource.setrlimit(res, pair)
        self.saved_limits = []
        self.mounts.leave(empty=empty)
        self.uid, self.made, self.token = None, None, None
        return {"clean": clean}, b""

    def kill_all(self) -> bool:
        """SIGKILL every other process of this pid namespace until there is none; False if one
        would not go within KILL_SECONDS (stuck in the kernel).

        Every process of the namespace descends from its init, and an orphan becomes the init's
        child before its parent can be reaped: so once the helper has no child, the namespace is
        empty, and a sample whose commands all ended costs no `kill(-1)` (which walks every
        process of the host)."""
        deadline = time.monotonic() + KILL_SECONDS
        while True:
            self.reap()
            try:  # WNOWAIT: only look; reap() collects (and reports) every exit
                running = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
            except ChildProcessError:
                return True
            if time.monotonic() > deadline:
                return False
            if running:
                try:
                    os.kill(-1, 9)  # from the namespace's init: every process in it but itself
                except ProcessLookupError:
                    pass
                time.sleep(0.001)  # still dying: bounded by the deadline


def run_slot_helper(fd: int, mounts: SlotMounts) -> None:
    """Serve a slot's channel until the runner closes it (the slot is destroyed then)."""
    import _socket

    os.set_inheritable(fd, False)
    sock = _socket.socket(fileno=fd)
    sock.setblocking(True)
    helper = SlotHelper(sock, mounts)
    mounts.setup()
    try:
        helper.serve()
    except (EOFError, ConnectionError):
        os._exit(0)
