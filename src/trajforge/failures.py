"""Every way a sample or its verification ends without a result of its own, who can cause it, and
what it becomes: one table (data), read by task verification, the run's statistics, the README's
table (tests/test_failures.py checks they agree) and anything that hands results to a trainer
(the rollout service: trajforge.service). A leaf: it imports nothing of trajforge.

Four causes. `infrastructure`: the provider, the engine, the host, trajforge itself; `task`: the
task's own build or tests; `budget`: a limit the run's settings put on a sample (a budget); `agent`:
the sample's own actions (the policy's). What a failure becomes follows from who could have
caused it, never from what the message says:
- `failed`: the sample has no record (it is retried in-run where that can help, and by
  `--resume`); a trainer must mask it, since no policy action led to it;
- `error`: the record has a verification with `passed`/`reward` null and `error` naming the kind:
  there is no verdict, and it is counted apart from passes and fails;
- `reward 0`: the record's verification is a fail with reward 0 and `failure` naming the kind: the
  agent could have caused it, so leaving it out of a mean would reward the sabotage;
- `partial`: the record is kept, marked partial (its `end_reason` names the limit), and verified
  like any other;
- `dropped`: the record is left out of trajectories.jsonl (and of a trainer's stream) by the
  run's filters, and counted.

A trainer masks what it cannot blame on the policy (`masks`: every cause but `agent`), and scores
the rest with its reward: `rollout_class` says which row of the table, if any, decides a rollout.

Task verification runs in one of two modes (the README's "Task environments"): `default`, the
tests in the container the agent had (it may have replaced any program they use), and `sealed`,
the tests in a fresh container of the task's image with only the agent's outputs copied in. A
verifier that times out, crashes or writes no usable reward is then the agent's doing in the
first and the task's in the second.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

AGENT, TASK, INFRASTRUCTURE, BUDGET = "agent", "task", "infrastructure", "budget"
FAILED, ERROR, REWARD_0, PARTIAL, DROPPED = "failed", "error", "reward 0", "partial", "dropped"
DEFAULT, SEALED = "default", "sealed"  # task verification modes
MODES = (DEFAULT, SEALED)
# stages: where in a sample's life the row applies
SAMPLE, VERIFICATION, END, FILTER = "sample", "verification", "end", "filter"
SERVICE = "service"  # a rollout the rollout service did not start (its failure is no exception of a sample's)


@dataclass(frozen=True, slots=True)
class FailureClass:
    name: str
    # SAMPLE (no record), SERVICE (not started: no record), VERIFICATION (of the record), END (its
    # end_reason), FILTER (left out)
    stage: str
    mode: str | None  # the verification mode it applies to; None: any
    cause: str  # AGENT, TASK, INFRASTRUCTURE or BUDGET
    becomes: str  # FAILED, ERROR, REWARD_0, PARTIAL or DROPPED
    when: str


def _verifier(name: str, when: str) -> tuple[FailureClass, FailureClass]:
    return (FailureClass(name, VERIFICATION, DEFAULT, AGENT, REWARD_0, when),
            FailureClass(name, VERIFICATION, SEALED, TASK, ERROR, when))


TABLE: tuple[FailureClass, ...] = (
    FailureClass("rate_limit", SAMPLE, None, INFRASTRUCTURE, FAILED, "the provider kept refusing calls (429)"),
    FailureClass("api_error", SAMPLE, None, INFRASTRUCTURE, FAILED, "the provider failed (5xx, bad reply)"),
    FailureClass("timeout", SAMPLE, None, INFRASTRUCTURE, FAILED,
                 "a model call or the sample's working time ran out (--timeout)"),
    FailureClass("model_error", SAMPLE, None, INFRASTRUCTURE, FAILED, "the provider's output could not be used"),
    FailureClass("sandbox", SAMPLE, None, INFRASTRUCTURE, FAILED,
                 "the sandbox could not be made or the engine failed"),
    FailureClass("build", SAMPLE, None, TASK, FAILED, "the task's image did not build"),
    FailureClass("internal", SAMPLE, None, INFRASTRUCTURE, FAILED, "a bug of trajforge"),
    FailureClass("stale", SERVICE, None, BUDGET, FAILED,
                 "the rollout service's max_staleness: its group would have mixed too many policy versions"),
    FailureClass("closed", SERVICE, None, BUDGET, FAILED,
                 "the rollout service did not start it: its group had been delivered or cancelled"),
    FailureClass("deferred", SERVICE, None, BUDGET, FAILED,
                 "the rollout service's policy endpoint changed before it started: the next pass runs it"),
    *_verifier("verifier_timeout", "the tests passed [verifier].timeout_sec"),
    *_verifier("verifier_crashed", "the tests wrote no reward and exited non-zero"),
    *_verifier("reward_missing", "the tests wrote no reward and exited 0"),
    *_verifier("reward_invalid", "the reward file is empty, not a number, not finite, or has no main reward"),
    FailureClass("container_stopped", VERIFICATION, DEFAULT, AGENT, REWARD_0,
                 "the agent's container had stopped before its tests (its main process killed, out of memory)"),
    FailureClass("disk_full", VERIFICATION, None, AGENT, REWARD_0,
                 "the sample's disk was full, so the tests (or the agent's outputs) could not be copied in"),
    FailureClass("reset_failed", VERIFICATION, DEFAULT, AGENT, REWARD_0,
                 "/tests or /logs could not be made anew in the agent's container"),
    FailureClass("outputs_too_large", VERIFICATION, SEALED, AGENT, REWARD_0,
                 "the agent's outputs are larger than the sandbox disk limit"),
    # a row's own verification (check / expected / rubric: the README's "Verified trajectories")
    FailureClass("check_timeout", VERIFICATION, None, INFRASTRUCTURE, ERROR,
                 "the row's check ran past its check_timeout"),
    FailureClass("check_error", VERIFICATION, None, INFRASTRUCTURE, ERROR, "the row's check could not be run"),
    FailureClass("judge_failed", VERIFICATION, None, INFRASTRUCTURE, ERROR,
                 "the judge's calls failed after the client's retries"),
    FailureClass("judge_invalid", VERIFICATION, None, INFRASTRUCTURE, ERROR, "the judge's reply held no valid score"),
    # how the agent's session ended, when not with an answer
    FailureClass("max_tokens_per_sample", END, None, BUDGET, PARTIAL, "the sample's --max_tokens_per_sample budget"),
    FailureClass("max_cost_per_sample", END, None, BUDGET, PARTIAL, "the sample's --max_cost_per_sample budget"),
    FailureClass("max_turns", END, None, AGENT, PARTIAL, "the agent used --max_turns without answering"),
    FailureClass("length", END, None, AGENT, PARTIAL, "a reply was cut at max_tokens or the context's end"),
    FailureClass("max_tool_output", END, None, AGENT, PARTIAL, "the sample's tool results passed 16 M characters"),
    FailureClass("agent_timeout", END, None, AGENT, PARTIAL, "a task's [agent].timeout_sec ran out"),
    # the run's filters (the README's "Resume, limits, filters")
    FailureClass("hallucinated_tool", FILTER, None, AGENT, DROPPED, "the agent called a tool it was not offered"),
    FailureClass("no_reasoning", FILTER, None, AGENT, DROPPED,
                 "the agent never reasoned (kept with --keep_no_reasoning)"),
    FailureClass("not_kept", FILTER, None, AGENT, DROPPED, "--keep passed, and the rollout did not pass"),
)


def failure_class(name: str, mode: str | None = None) -> FailureClass:
    """The row for `name` (and, for a verification kind, the mode it ran in). KeyError for an unknown one."""
    for row in TABLE:
        if row.name == name and (row.mode is None or mode is None or row.mode == mode):
            return row
    raise KeyError(name)


def verification_kinds(mode: str) -> tuple[str, ...]:
    """The verification kinds of `mode`, in table order."""
    return tuple(r.name for r in TABLE if r.stage == VERIFICATION and r.mode in (None, mode))


SAMPLE_CLASSES = tuple(r.name for r in TABLE if r.stage == SAMPLE)
STALE = "stale"
CLOSED = "closed"
DEFERRED = "deferred"


def masks(row: FailureClass) -> bool:
    """Whether a trainer masks a rollout this row decides: it cannot be blamed on the policy."""
    return row.cause != AGENT


_BY_STAGE = {(r.stage, r.name): r for r in TABLE if r.stage != VERIFICATION}  # one row each (no modes there)


def _named(name: Any, stage: str) -> FailureClass | None:
    return _BY_STAGE.get((stage, name)) if isinstance(name, str) else None


def rollout_class(status: str, reason: str | None, record: Mapping[str, Any] | None) -> FailureClass | None:
    """The row that decides a sample's end as a trainer takes it, None for a plain result (an
    answer, verified or not). `status`: the outcome's (done, failed, discarded); `reason`: its
    failure class or discard reason (or the filter that leaves a done record out); `record`: a done
    sample's record. An unknown failure class counts as `internal` (masked)."""
    if status == "failed":
        return _named(reason, SAMPLE) or _named(reason, SERVICE) or failure_class("internal")
    if reason is not None:  # discarded, or a done record a filter leaves out
        return _named(reason, FILTER)
    record = record or {}
    verification = record.get("verification")
    if isinstance(verification, Mapping):
        # error: no verdict (masked whatever the kind); failure: a fail the agent could have caused (scored 0)
        for key, becomes in (("error", ERROR), ("failure", REWARD_0)):
            name = verification.get(key)
            if not isinstance(name, str):
                continue
            row = next((r for r in TABLE if r.name == name and r.stage == VERIFICATION and r.becomes == becomes), None)
            return row or FailureClass(name, VERIFICATION, None, AGENT if becomes == REWARD_0 else INFRASTRUCTURE,
                                       becomes, "a kind this version of trajforge does not know")
    return _named(record.get("end_reason"), END)
