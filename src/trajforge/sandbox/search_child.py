"""search_files matched in a child process, for the backends whose matching would otherwise run
in the runner: local (the walk and the matching) and the container exec fallback (the matching
of the files it copied out).

`re` holds the GIL while it matches, so a pattern that backtracks without end (`(a+)+$` over a
line of a's) in a thread of the runner stalled every session of the run, Ctrl-C included. In a
child, fsops.limited stops it with the child's own alarm, and if even that fails the child is
killed. The child is this package's fsops under `python -I -S`: its start is dear next to a
command's (bench/RESULTS.md), but search_files is rare next to commands, and its cost stays off
the runner's event loop.
"""

from __future__ import annotations

import asyncio
import marshal
import os
import sys
from typing import Any

from trajforge.sandbox.inside import fsops
from trajforge.sandbox.interface import SandboxError, raise_reply
from trajforge.sandbox.process import SAFE_PATH

_CODE = "import sys;sys.path.insert(0,sys.argv[1]);from trajforge.sandbox.inside.fsops import child_main;child_main()"
_SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(fsops.__file__)))))


async def search_in_child(job: dict[str, Any]) -> tuple[list[str], bool]:
    """Run one search (fsops.child_main's `job`: a walk of root/rel, or `entries` already read);
    (results, more exist), or its FileOpError / PathEscapeError / SymlinkError raised here."""
    seconds = fsops.SEARCH_SECONDS  # read at call time: tests shorten it
    job = {**job, "seconds": seconds}
    # Matching files a container sent (`entries`) needs no file at all: as root, the child that
    # reads them does it as nobody, without a privilege (the sandbox package's invariant).
    drop = ["--drop"] if os.geteuid() == 0 and "entries" in job else []
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", _CODE, _SRC, *drop, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": SAFE_PATH}, cwd="/")
    try:
        async with asyncio.timeout(seconds + 10):  # its alarm failed too: a walk stuck in the kernel
            out, err = await proc.communicate(marshal.dumps(job))
    except BaseException as e:  # the timeout, or the sample cancelled: the child goes with it
        if proc.returncode is None:
            proc.kill()
        await asyncio.shield(proc.wait())
        if isinstance(e, TimeoutError):
            raise fsops.FileOpError("timeout", f"the search took over {seconds:g} s, so it was stopped") from None
        raise
    try:
        reply = marshal.loads(out)
    except (EOFError, ValueError, TypeError):
        raise SandboxError(f"the search process failed (exit {proc.returncode}): "
                           f"{err.decode(errors='replace').strip()[-300:]}") from None
    raise_reply(reply)
    return [str(x) for x in reply["found"]], bool(reply["more"])
