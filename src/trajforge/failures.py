"""Every way a sample or its verification ends without a result of its own, who can cause it, and
what it becomes: one table (data), read by task verification, the run's statistics, the README's
table (tests/test_readme_audit.py checks they agree) and anything that hands results to a
trainer. A leaf: it imports nothing of trajforge.

Three causes. `infrastructure`: the provider, the engine, the host, trajforge itself; `task`: the
task's own build or tests; `agent`: the sample's own actions (the policy's). What a failure
becomes follows from who could have caused it, never from what the message says:
- `failed`: the sample has no record (it is retried in-run where that can help, and by
  `--resume`); a trainer must mask it, since no policy action led to it;
- `error`: the record has a verification with `passed`/`reward` null and `error` naming the kind:
  there is no verdict, and it is counted apart from passes and fails;
- `reward 0`: the record's verification is a fail with reward 0 and `failure` naming the kind: the
  agent could have caused it, so leaving it out of a mean would reward the sabotage.

Task verification runs in one of two modes (the README's "Task environments"): `default`, the
tests in the container the agent had (it may have replaced any program they use), and `sealed`,
the tests in a fresh container of the task's image with only the agent's outputs copied in. A
verifier that times out, crashes or writes no usable reward is then the agent's doing in the
first and the task's in the second.
"""

from __future__ import annotations

from dataclasses import dataclass

AGENT, TASK, INFRASTRUCTURE = "agent", "task", "infrastructure"
FAILED, ERROR, REWARD_0 = "failed", "error", "reward 0"
DEFAULT, SEALED = "default", "sealed"  # task verification modes
MODES = (DEFAULT, SEALED)


@dataclass(frozen=True, slots=True)
class FailureClass:
    name: str
    stage: str  # "sample" (no record) or "verification" (of a task's record)
    mode: str | None  # the verification mode it applies to; None: any
    cause: str  # AGENT, TASK or INFRASTRUCTURE
    becomes: str  # FAILED, ERROR or REWARD_0
    when: str


def _verifier(name: str, when: str) -> tuple[FailureClass, FailureClass]:
    return (FailureClass(name, "verification", DEFAULT, AGENT, REWARD_0, when),
            FailureClass(name, "verification", SEALED, TASK, ERROR, when))


TABLE: tuple[FailureClass, ...] = (
    FailureClass("rate_limit", "sample", None, INFRASTRUCTURE, FAILED, "the provider kept refusing calls (429)"),
    FailureClass("api_error", "sample", None, INFRASTRUCTURE, FAILED, "the provider failed (5xx, bad reply)"),
    FailureClass("timeout", "sample", None, INFRASTRUCTURE, FAILED,
                 "a model call or the sample's working time ran out (--timeout)"),
    FailureClass("model_error", "sample", None, INFRASTRUCTURE, FAILED, "the provider's output could not be used"),
    FailureClass("sandbox", "sample", None, INFRASTRUCTURE, FAILED,
                 "the sandbox could not be made or the engine failed"),
    FailureClass("build", "sample", None, TASK, FAILED, "the task's image did not build"),
    FailureClass("internal", "sample", None, INFRASTRUCTURE, FAILED, "a bug of trajforge"),
    *_verifier("verifier_timeout", "the tests passed [verifier].timeout_sec"),
    *_verifier("verifier_crashed", "the tests wrote no reward and exited non-zero"),
    *_verifier("reward_missing", "the tests wrote no reward and exited 0"),
    *_verifier("reward_invalid", "the reward file is empty, not a number, not finite, or has no main reward"),
    FailureClass("container_stopped", "verification", DEFAULT, AGENT, REWARD_0,
                 "the agent's container had stopped before its tests (its main process killed, out of memory)"),
    FailureClass("disk_full", "verification", None, AGENT, REWARD_0,
                 "the sample's disk was full, so the tests (or the agent's outputs) could not be copied in"),
    FailureClass("reset_failed", "verification", DEFAULT, AGENT, REWARD_0,
                 "/tests or /logs could not be made anew in the agent's container"),
    FailureClass("outputs_too_large", "verification", SEALED, AGENT, REWARD_0,
                 "the agent's outputs are larger than the sandbox disk limit"),
)


def failure_class(name: str, mode: str | None = None) -> FailureClass:
    """The row for `name` (and, for a verification kind, the mode it ran in). KeyError for an unknown one."""
    for row in TABLE:
        if row.name == name and (row.mode is None or mode is None or row.mode == mode):
            return row
    raise KeyError(name)


def verification_kinds(mode: str) -> tuple[str, ...]:
    """The verification kinds of `mode`, in table order."""
    return tuple(r.name for r in TABLE if r.stage == "verification" and r.mode in (None, mode))


SAMPLE_CLASSES = tuple(r.name for r in TABLE if r.stage == "sample")
