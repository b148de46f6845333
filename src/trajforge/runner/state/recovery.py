"""What a killed invocation finished but never saved in checkpoint.json, put back at the next start.

Records are written to the batch files as samples finish; the checkpoint's journal is committed
only every second or so (runner.state.checkpoint). A run killed between the two (SIGKILL, OOM,
power) leaves finished samples whose records exist but that the checkpoint does not call
finished, and whose spend is missing from the invocation's `spent`, the budget's prior. At the
next start (`restore`), before any sample runs, each such sample gets a `done` entry and its
record's cost is added to the new invocation's `recovered_spent`, so both reach the file at the
first save and the next start finds nothing left to repair.

A sample that was in flight at the last save already had part of its spend counted then: the
killed invocation's `in_flight` says how much its current attempt had cost (runner.scheduling.budget), and
only the rest of the record's cost is added (`missed_spend`). What was spent after the last save
on samples that left no record (failed, discarded, or killed mid-flight) is not known anywhere and
stays uncounted beyond that partial spend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from trajforge.errors import OutputError
from trajforge.runner.state import store
from trajforge.runner.state.checkpoint import Checkpoint


@dataclass(frozen=True)
class Restored:
    samples: int = 0  # finished samples added back to the checkpoint
    spent: float = 0.0  # USD of theirs that no invocation's `spent` held


def unsaved(checkpoint: Checkpoint, identity: str) -> bool:
    """Whether a sample with a record in the batch files lacks its outcome in the checkpoint: no
    entry, or a failure that a later attempt (killed before the next save) made good."""
    return checkpoint.status(identity) not in ("done", "discarded")


def record_cost(record: object) -> float:
    """USD a record says its sample's finishing attempt cost (`usage.cost`); 0 when it says nothing
    usable, as model.pricing treats an impossible cost."""
    usage = record.get("usage") if isinstance(record, dict) else None
    cost = usage.get("cost") if isinstance(usage, dict) else None
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost < 0:
        return 0.0
    return float(cost)


def missed_spend(costs: Mapping[str, float], in_flight: Mapping[str, float]) -> float:
    """USD of recovered samples (`costs`: identity -> record cost) that the checkpoint does not hold:
    each record's cost less what the killed invocation's last save counted of that attempt already
    (`in_flight`). Never negative: a record cannot give back spend counted elsewhere."""
    return sum(max(0.0, cost - in_flight.get(identity, 0.0)) for identity, cost in costs.items())


def restore(checkpoint: Checkpoint, refs: list[store.LineRef]) -> Restored:
    """Give the sample of every record of `refs` (each one `unsaved`) a done entry and return what
    they spent beyond the killed invocation's `spent`. That invocation is the checkpoint's last
    one: every start restores what the one before it left and saves it before any sample runs."""
    if not refs:
        return Restored()
    in_flight = checkpoint.invocations[-1].in_flight if checkpoint.invocations else {}
    try:  # store.scan parsed each of these very lines as a whole record
        costs = {ref.identity: record_cost(orjson.loads(line))
                 for ref, line in store.read_at(checkpoint.layout, refs, store.LineRef.location)}
    except OSError as e:
        raise OutputError(e.filename, e, "read") from None
    for ref in refs:
        checkpoint.finished(ref.identity, ref.batch, ref.offset, ref.length)
    return Restored(len(refs), round(missed_spend(costs, in_flight), 8))
