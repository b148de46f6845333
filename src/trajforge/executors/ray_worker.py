"""The node a `trajforge worker` runs: `ray start --block` supervised rather than exec'd.

Its output tells whether it joined, was rejected (authentication) or lost its head; the raylet is
told to give up on a vanished head after --head_timeout seconds, and `ray start` ends with it. On
the way out (head gone, SIGTERM, Ctrl-C) whatever of the node is left is killed, and waited for:
processes carry a tag in their environment, so even agents orphaned by a dead raylet are found,
and SPT_NOENV keeps it readable (see WorkerNode.run). `stop_node` is shared with the scheduler's head.
"""

from __future__ import annotations

import collections
import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading

from trajforge.errors import TrajforgeError
from trajforge.executors import ray_auth
from trajforge.sandbox.host.tagkill import kill_tagged

KILLED_GONE_SECONDS = 5.0  # at most, for the killed leftovers of a node to exit


def stop_node(proc: subprocess.Popen[str], grace: float, tag: str | None = None) -> None:
    """Stop a `ray start --block` child and everything of its node.

    SIGTERM makes `ray start` drain and stop its node's processes; whatever is left afterwards
    (agents orphaned when the raylet died first) is killed: the processes carrying `tag` in their
    environment, waited for until they are gone, else the child's process group. No Ray process
    outlives the command that started it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    if tag is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        # Bounded: SIGKILLed processes are gone within milliseconds unless stuck in the kernel, and
        # one of those must not hang the command; the wait ends at their exits, not on a timer.
        kill_tagged(tag, wait=KILLED_GONE_SECONDS)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group id is its pid
    proc.wait()


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


HEAD_GONE_SECONDS = 20.0
_JOINED = "Ray runtime started"
_HEAD_GONE = ("Failed to connect to GCS", "GCS may have been killed", "GCS has been unavailable")


class WorkerNode:
    """`ray start --block` as a supervised child rather than exec'd: its output tells whether it
    joined, was rejected (authentication) or lost its head; on the way out, whatever of the node
    is left is killed (found by the tag in its environment). Ray's output is shown only with --verbose."""

    def __init__(self, cmd: list[str], env: dict[str, str], address: str, auth: ray_auth.AuthDecision,
                 verbose: bool) -> None:
        self.cmd, self.env, self.address, self.auth, self.verbose = cmd, env, address, auth, verbose
        self.output: collections.deque[str] = collections.deque(maxlen=40)
        self.joined = self.auth_failed = self.head_gone = False
        self.stopping = False

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            self.output.append(line)
            if self.verbose:
                print(f"[ray] {line}", file=sys.stderr, flush=True)
            if _JOINED in line and not self.joined:
                self.joined = True
                print(f"trajforge: joined the cluster at {self.address}", file=sys.stderr, flush=True)
            self.auth_failed = self.auth_failed or ray_auth.is_auth_failure(line)
            self.head_gone = self.head_gone or any(m in line for m in _HEAD_GONE)

    def run(self) -> int:
        # Same process group as this command, so killing the group (a supervisor's stop, a test)
        # takes the node down at once; the tag finds what escaped the group.
        tag = f"TRAJFORGE_RAY_NODE={secrets.token_hex(8)}"
        # SPT_NOENV: Ray's processes retitle themselves (ray::DashboardAgent, ray::IDLE, ...) with a
        # bundled py-setproctitle, which by default takes the environ block as room for the title and
        # zeroes it, up to the first variable `import ray` rewrote (RAY_CLIENT_MODE). The raylet gives
        # its agents their environment in no fixed order, so in about a third of the runs the tag was
        # in the zeroed part of /proc/<pid>/environ and kill_tagged missed the agents. SPT_NOENV limits
        # the titles to the command line's room and leaves the environ block alone.
        env = {**self.env, "SPT_NOENV": "1", tag.partition("=")[0]: tag.partition("=")[2]}
        proc = subprocess.Popen(self.cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                preexec_fn=_die_with_parent)

        def on_signal(signum: int, frame: object) -> None:
            self.stopping = True
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # `ray start` drains and stops the node

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        reader = threading.Thread(target=self._read, args=(proc,), name="ray-worker-output", daemon=True)
        reader.start()
        try:
            proc.wait()
        finally:
            stop_node(proc, grace=35.0, tag=tag)  # drain takes up to 30 s
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            reader.join(5)
        return self._verdict(proc.returncode)

    def _verdict(self, code: int) -> int:
        if self.stopping:
            print("trajforge: worker stopped; no Ray process of this node is left", file=sys.stderr)
            return 130
        if self.auth_failed:
            raise TrajforgeError(ray_auth.failure_message(f"head {self.address}", self.auth))
        if self.head_gone and self.joined:
            print(f"trajforge: the head at {self.address} went away (its run ended or it stopped); "
                  "this worker stopped too", file=sys.stderr)
            return 0
        tail = "\n".join(self.output)
        if not self.joined:
            raise TrajforgeError(f"could not join the Ray head at {self.address} (ray start exited with {code}):\n{tail}")
        raise TrajforgeError(f"the Ray node stopped unexpectedly (ray start exited with {code}):\n{tail}")
