"""The exception tree: one root, two branches.

    TrajforgeException                 every exception trajforge raises on purpose
    ├── TrajforgeError                 run-fatal: the CLI prints one line and exits `exit_code`
    │   ├── UsageError (2) ── ConfigError, InputError (export's and compress's input)
    │   ├── DatasetError, RunStateError, FatalModelError, OutputError
    └── SampleFailure                  one sample failed: recorded as data under `failure_class`
        ├── ModelCallError (trajforge.model.errors; rate_limit, api_error, timeout, model_error)
        ├── SandboxError (trajforge.sandbox.interface; sandbox)
        └── ToolInfraError (trajforge.tools.tool; sandbox)

Only problems that must stop a whole run are TrajforgeErrors (bad config, bad dataset, auth,
disk). A failed *sample* is data: the sample worker turns a SampleFailure into an outcome with
its failure class (trajforge.sample.outcome.FAILURE_CLASSES), and it never escapes the run.
The subclasses live next to the code that raises them and keep their import paths.
"""

from __future__ import annotations

import errno
from typing import ClassVar


class TrajforgeException(Exception):
    """The root of every exception trajforge raises on purpose."""


class TrajforgeError(TrajforgeException):
    """Base of every error the CLI turns into a clear message and a non-zero exit."""

    exit_code = 1


class SampleFailure(TrajforgeException):
    """One sample failed for a reason outside the model's control; the sample is recorded as failed
    with `failure_class` (retried in-run and on --resume), the run goes on."""

    failure_class: ClassVar[str] = "internal"


class UsageError(TrajforgeError):
    """A flag or config value is invalid (exit code 2, like argparse)."""

    exit_code = 2


class ConfigError(UsageError):
    """A YAML config file is unreadable or holds an unknown key or a wrong type."""


class InputError(UsageError):
    """A file given to `export` or `compress` cannot be read as trajectories (missing, not a
    regular file, a line that is not a record): exit code 2, like every bad argument of a
    command; the message names the file, line and problem."""


class DatasetError(TrajforgeError):
    """The dataset cannot be used; `problems` lists file:line: message entries."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []

    def __str__(self) -> str:
        head = super().__str__()
        if not self.problems:
            return head
        return head + "\n" + "\n".join(f"  {p}" for p in self.problems)


class RunStateError(TrajforgeError):
    """The run directory is locked, or already holds results and --resume was not given."""


class FatalModelError(TrajforgeError):
    """The model API refuses us for good (bad key, no permission): stop before burning the dataset."""


class OutputError(TrajforgeError):
    """A file of the run directory cannot be written (disk full, read-only, I/O error).

    The run stops scheduling, keeps everything already written (batch lines are whole or cut at
    the next start, state files are atomic), and the message names the file and how to continue.
    """

    def __init__(self, path: object, error: OSError, action: str = "write") -> None:
        self.path, self.error = path, error
        reason = error.strerror or str(error)
        if error.errno == errno.ENOSPC or error.errno == errno.EDQUOT:
            way_out = "free some space, then run the same command again with --resume"
        elif error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            way_out = "make it writable (or choose another --output_dir), then run again with --resume"
        else:
            way_out = "fix the cause, then run the same command again with --resume"
        super().__init__(f"cannot {action} {path}: {reason}; nothing already written was lost: {way_out}")
