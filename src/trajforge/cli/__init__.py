"""Command line: the entry point, the subcommand registry and the error guard. No run logic here.

Each subcommand is a module of its own (the run flags: trajforge.cli.run); all build their
flags with trajforge.cli.flags, so every flag accepts `--a_b=v`, `--a_b v` and `--a-b v`, and errors
are one line naming the flag, the value and what is allowed, with exit code 2.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

from trajforge import __version__, redact
from trajforge.allocator import tune_allocator
from trajforge.errors import TrajforgeError, UsageError
from trajforge.registry import NotInstalled, Registry, Spec, did_you_mean

# A subcommand: a spec whose target is "module:function", the function taking argv and returning the
# exit code. Adding one is one module (flags from trajforge.cli.flags) plus one line here; modules are
# imported only when their command runs, so an optional extra missing (Ray, ...) breaks only its command.
SUBCOMMANDS: Registry[None] = Registry("command")
for _spec in (
    Spec("run", "trajforge.cli.run:main", "run the agent over a dataset or tasks"),
    Spec("distributions", "trajforge.cli.distributions:main", "list the toolset distributions"),
    Spec("validate", "trajforge.cli.validate:main", "check a dataset file and report its problems"),
    Spec("export", "trajforge.cli.export:main", "export trajectories for training"),
    Spec("doctor", "trajforge.cli.doctor:main", "show which sandbox backends work here"),
    Spec("compress", "trajforge.cli.compress:main", "compress trajectories to a token budget"),
    Spec("scheduler", "trajforge.cli.cluster:scheduler_main", "start a Ray head and run a job on it",
         needs=("ray",), extra="ray"),
    Spec("worker", "trajforge.cli.cluster:worker_main", "join a Ray head as a worker node", needs=("ray",), extra="ray"),
    Spec("view", "trajforge.cli.view:main", "browse a run's trajectories in a web page"),
):
    SUBCOMMANDS.register(_spec)


def _subcommands() -> dict[str, Callable[[list[str]], int]]:
    return {spec.name: _lazy(spec) for spec in SUBCOMMANDS.specs()}


def _lazy(spec: Spec[None]) -> Callable[[list[str]], int]:
    def call(argv: list[str]) -> int:
        try:
            function = spec.load()
        except NotInstalled as e:
            raise UsageError(f"'trajforge {spec.name}' is not available: {e}") from None
        return int(function(argv))

    return call


def _our_error(e: BaseException) -> TrajforgeError | None:
    """The TrajforgeError inside an exception group raised out of a TaskGroup, if that is all it holds."""
    if isinstance(e, TrajforgeError):
        return e
    if isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        return _our_error(e.exceptions[0])
    return None


def _run_guarded(fn: Callable[[], int], verbose: bool = False) -> int:
    """Run a command; turn our errors into `error: ...` lines and an exit code, never a traceback
    (one only with --verbose, for a bug)."""
    try:
        code = fn()
        sys.stdout.flush()
        return code
    except (TrajforgeError, BaseExceptionGroup) as caught:
        e = _our_error(caught)
        if e is None:
            return _unexpected(caught, verbose)
        text = redact.REGISTRY.text(str(e))
        if isinstance(e, UsageError):  # one problem per line, each a complete message
            text = "\nerror: ".join(text.splitlines())
        print(f"error: {text}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # argparse's --help, --version and usage errors: a code, for in-process callers
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`--list_distributions | head -1`): not our error. Point stdout at
        # /dev/null so the interpreter's final flush does not print a traceback, and exit like a
        # process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:
        return _unexpected(e, verbose)


def _unexpected(e: BaseException, verbose: bool) -> int:
    """A bug or an unforeseen OS error: one line (the traceback only with --verbose), exit 1."""
    if verbose:
        import traceback

        text = "".join(traceback.format_exception(e))
        print(redact.REGISTRY.text(text), file=sys.stderr, end="")
    leaf = e
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, OSError) and leaf.filename is not None:
        what = f"{leaf.filename}: {leaf.strerror or leaf}"
    else:
        what = f"{type(leaf).__name__}: {leaf}"
    hint = "" if verbose else " (run with --verbose for the traceback)"
    print(redact.REGISTRY.text(f"error: unexpected problem: {what}{hint}"), file=sys.stderr)
    return 1


def _verbose(argv: list[str]) -> bool:
    return any(a == "--verbose" or a.startswith("--verbose=") for a in argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = _subcommands()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        return _run_guarded(lambda: _usage(argv, cmds))
    if argv[0] not in cmds:
        if argv[0].startswith("--"):  # `trajforge --dataset_file=...` behaves like batch_runner.py
            return batch_runner_main(argv)
        hint = did_you_mean(argv[0], cmds)
        print(f"trajforge: error: unknown command {argv[0]!r}{hint} (commands: {', '.join(cmds)})", file=sys.stderr)
        return 2
    return _run_guarded(lambda: cmds[argv[0]](argv[1:]), _verbose(argv))


def entry() -> NoReturn:
    """The `trajforge` command (and `python -m trajforge`): main(), then exit_now."""
    open_closed_std_streams()
    tune_allocator()
    exit_now(main())


def batch_runner_entry() -> NoReturn:
    """`python batch_runner.py`: batch_runner_main(), then exit_now."""
    open_closed_std_streams()
    tune_allocator()
    exit_now(batch_runner_main())


def open_closed_std_streams() -> None:
    """A process started with stdin, stdout or stderr closed (`2>&-` from cron or a service) gets
    /dev/null there: the next file it opens would otherwise take that descriptor, and a library or
    a child writing to "stderr" would write into a run's file. Status output is then dropped."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: this one
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False, encoding="utf-8", errors="backslashreplace"))


_fast_exit_code: int | None = None


@atexit.register  # registered when this module is imported, which the entry points do first: runs last
def _fast_exit() -> None:
    """The last atexit handler: once exit_now asked for it, flush the streams and end the process
    before the interpreter's teardown (a no-op for every other exit, e.g. in-process callers)."""
    if _fast_exit_code is None:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: started without that stream (a detached process)
                stream.flush()
        except (OSError, ValueError):  # closed, or a pipe whose reader left: nothing more to say
            pass
    os._exit(_fast_exit_code)


def exit_now(code: int) -> NoReturn:
    """End the process with `code` once every result is out, without the interpreter's teardown.

    A run ends with tens of MB of objects whose one-by-one deallocation took a noticeable part of
    the finish phase after the last file was written and the summary printed (bench/RESULTS.md,
    "The collector and the exit"). What the teardown
    does that matters still happens, through the ordinary exit: threads other than daemon ones are
    joined, the atexit handlers run (logging, temporary directories, the containers a run left,
    weakref finalizers), and the last of them, `_fast_exit`, flushes the streams and ends the
    process before the deallocation starts. It runs last because atexit runs handlers in the
    reverse order of registration and this module registers it on import, before anything else
    of trajforge or the standard library's logging registers one (a handler registered before that
    import would be skipped). In-process callers use main()."""
    global _fast_exit_code
    _fast_exit_code = code
    raise SystemExit(code)


def _usage(argv: list[str], cmds: dict[str, Callable[[list[str]], int]]) -> int:
    if argv and argv[0] == "--version":
        print(f"trajforge {__version__}")
        return 0
    out = sys.stdout if argv else sys.stderr
    print("usage: trajforge {" + ",".join(cmds) + "} [flags]   (trajforge run --help for run flags)", file=out)
    print("       trajforge --version", file=out)
    if argv:  # --help: what each command does
        width = max(map(len, cmds))
        print("\ncommands:", file=out)
        for spec in SUBCOMMANDS.specs():
            print(f"  {spec.name:<{width}}  {spec.help}", file=out)
    return 0 if argv else 2


def batch_runner_main(argv: list[str] | None = None) -> int:
    """`python batch_runner.py --flag=value ...`: the reference interface, required flags enforced."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from trajforge.cli.run import run_command

    return _run_guarded(lambda: run_command(argv, "batch_runner.py", strict_required=True), _verbose(argv))
