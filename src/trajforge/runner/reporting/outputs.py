"""What the merge writes: every kept record goes to each registered run output, in dataset order.

A run output is a class taking the binary stream of its file and offering `write(line, record)`
(RunOutput), plus one line in RUN_OUTPUTS (a spec named by the file name in the run directory,
whose target is the class).
trajectories.jsonl, the built-in output, is the saved line itself. Each file is written through
jsonio.atomic_writer, so a reader sees the previous complete file or the new one, never a part;
a failing merge leaves every output as it was. Converting records for trainers after the run
(OpenAI messages, Parquet, Hugging Face) is `trajforge export`'s job (trajforge.export).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, BinaryIO, Protocol

from trajforge.jsonio import atomic_writer
from trajforge.registry import Registry, Spec
from trajforge.run_layout import TRAJECTORIES, RunLayout


class RunOutput(Protocol):
    def write(self, line: bytes, record: dict[str, Any]) -> None:
        """Add one kept record: `line` is its JSON line as saved (ending in a newline)."""


class JsonlOutput:
    """trajectories.jsonl: one saved line per kept record."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def write(self, line: bytes, record: dict[str, Any]) -> None:
        self._stream.write(line)


# Named by the file in the run directory; tests register their own the same way.
RUN_OUTPUTS: Registry[None] = Registry("run output")
RUN_OUTPUTS.register(Spec(TRAJECTORIES, "trajforge.runner.reporting.outputs:JsonlOutput", "the kept records as saved"))


@contextlib.contextmanager
def open_outputs(layout: RunLayout) -> Iterator[list[RunOutput]]:
    """Every registered output, open on its staged file; all are renamed into place when the block
    ends without an error."""
    with contextlib.ExitStack() as stack:
        outputs: list[RunOutput] = []
        for spec in RUN_OUTPUTS.specs():
            stream = stack.enter_context(atomic_writer(layout.output(spec.name), buffering=1 << 20))
            outputs.append(spec.load()(stream))
        yield outputs
