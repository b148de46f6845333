"""Binding a context variable for the length of a block.

The run hands what belongs to a task, and to the tasks it starts, through context variables: the
model gate (model.gate), the running sample's meter (model.spend) and its working clock
(model.working), so that a model client deep inside a toolset reaches them without being handed
them. Each binds the same way, here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


@contextmanager
def bound(var: ContextVar[T], value: T) -> Iterator[T]:
    """`var` is `value` in this task (and in the tasks it starts) until the block ends."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
