"""--verbose tracing of one sample's steps, with the `[B<batch>:P<prompt>]` prefix of the reference logs.

Built by SampleWorker itself, so every executor (in-process or a Ray actor) logs the same lines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from trajforge.dataset import Sample
from trajforge.sample.outcome import batch_number

log = logging.getLogger("trajforge.agent")


def tracer(sample: Sample, batch_size: int | None, chars: int) -> Callable[[str, Any], None]:
    prefix = f"[B{batch_number(sample.index, batch_size)}:P{sample.index}]"

    def cut(text: str) -> str:
        text = " ".join(text.split())
        return text if len(text) <= chars else text[:chars] + "..."

    def trace(kind: str, item: Any) -> None:
        if kind == "model":
            calls = ", ".join(c.name for c in item.tool_calls) or "none"
            log.info("%s model: %s | tool calls: %s", prefix, cut(item.content or ""), calls)
        else:
            status = "failed" if item.failed else "ok"
            log.info("%s tool %s %s: %s", prefix, item.call.name, status, cut(item.result))

    return trace
