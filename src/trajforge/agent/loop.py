"""The agent loop: ask the model, run the tools it calls, feed results back, until it answers.

The loop records each assistant turn with its tool calls and their results as `Turn` values;
conversion to the saved format happens elsewhere (agent.sharegpt). Messages that exist only at
run time (ephemeral system prompt, prefill) are sent to the model but never recorded.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from trajforge.agent.args import parse_arguments
from trajforge.agent.limits import SpendLimits
from trajforge.agent.prompts import runtime_system_message
from trajforge.agent.segments import Segments
from trajforge.model.errors import APIFailure, ModelOutputError
from trajforge.model.types import Completion, ModelClient, ToolCall, Usage
from trajforge.redact import REGISTRY
from trajforge.tools.tool import Tool, ToolContext, ToolInfraError, error, result_failed

log = logging.getLogger("trajforge.agent")

# What one sample may make the runner hold, whatever its model replies (its memory is outside
# every sandbox limit, and each request re-sends the whole conversation): calls past
# MAX_CALLS_PER_TURN in one reply get _NOT_RUN, and a sample whose tool results pass
# MAX_TOOL_OUTPUT characters in all ends after that turn, saved as partial ("max_tool_output").
MAX_CALLS_PER_TURN = 64
MAX_TOOL_OUTPUT = 16 << 20
_NOT_RUN = error(f"not run: one reply may make at most {MAX_CALLS_PER_TURN} tool calls; make the rest in "
                 "your next reply")


@dataclass(slots=True)
class ToolResult:
    call: ToolCall
    result: str
    failed: bool
    offered: bool = True  # False: the model called a tool that this sample was not given


@dataclass(slots=True)
class Turn:
    """One assistant response and the results of the tools it called."""

    content: str
    reasoning: str | None
    tool_calls: list[ToolCall]
    results: list[ToolResult] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage | None = None  # of this turn's model call (the ATIF trajectory's per-step metrics)
    policy_version: int | None = None  # of the policy that served the call (model.policy)


@dataclass(slots=True)
class SessionResult:
    prompt: str
    tools: list[dict[str, Any]]  # schemas offered to the model
    turns: list[Turn]
    completed: bool
    partial: bool
    api_calls: int
    usage: Usage
    end_reason: str  # "answer" | "length" | "max_turns" | "max_tokens_per_sample" | "max_cost_per_sample" |
    # "max_tool_output" | "agent_timeout"
    segments: Segments = field(default_factory=Segments)  # the calls' token ids (agent.segments)


def _assistant_message(c: Completion) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant", "content": c.content or ""}
    if c.tokens is not None and c.reasoning:
        # The ids are being recorded for training: the next prompt should hold what the model
        # wrote, and templates that keep a tool loop's reasoning read it from this field.
        msg["reasoning_content"] = c.reasoning
    if c.tool_calls:
        msg["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments or "{}"}}
            for tc in c.tool_calls
        ]
    return msg


async def call_tool(call: ToolCall, tools: dict[str, Tool], ctx: ToolContext) -> ToolResult:
    """Run one tool call; anything the model did wrong becomes an error result it can read."""
    tool = tools.get(call.name)
    if tool is None:
        offered = ", ".join(tools) or "none"
        return ToolResult(call, error(f"unknown tool {call.name!r}; available tools: {offered}"), True, False)
    args, problem = parse_arguments(call.arguments, tool.parameters)
    if problem is not None:
        return ToolResult(call, error(problem), True)
    try:
        result = await tool.run(args, ctx)  # type: ignore[arg-type]
    except ToolInfraError:
        raise
    except Exception as e:  # a tool bug must not kill the sample; the model sees what happened
        log.exception("tool %s raised", call.name)
        result = error(f"tool {call.name} failed: {type(e).__name__}: {e}")
    # A command that read the runner's keys (its /proc entry under the local sandbox) shows the
    # model a marker instead: no key of the run goes to the model's provider or into the record.
    result = REGISTRY.text(result)
    return ToolResult(call, result, result_failed(result))


async def run_session(
    prompt: str,
    model: ModelClient,
    tools: list[Tool],
    ctx: ToolContext,
    *,
    max_turns: int,
    ephemeral_system_prompt: str | None = None,
    prefill: list[dict[str, Any]] | None = None,
    trace: Any = None,
    limits: SpendLimits | None = None,
    time_limit: float | None = None,
) -> SessionResult:
    """Run the loop for one prompt. Model errors propagate (the runner classifies them).

    `time_limit` (a task's [agent].timeout_sec): seconds after which the session ends where it is,
    like max_turns, as partial with end_reason `agent_timeout` (a model call or tool call cut
    short leaves no result); the turns so far are kept."""
    by_name = {t.name: t for t in tools}
    schemas = [t.schema() for t in tools]
    messages: list[dict[str, Any]] = [runtime_system_message(ephemeral_system_prompt), *(prefill or []),
                                      {"role": "user", "content": prompt}]
    session = SessionResult(prompt, schemas, [], False, True, 0, Usage(), "max_turns")
    limit = asyncio.timeout(time_limit)
    try:
        async with limit:
            session.end_reason = await _turns(messages, model, schemas, by_name, ctx, session, max_turns, trace,
                                              limits)
    except TimeoutError:
        if not limit.expired():  # a timeout of something inside (a model request): not the agent's limit
            raise
        session.end_reason = "agent_timeout"
    session.completed = session.end_reason == "answer"
    session.partial = not session.completed
    session.api_calls = len(session.turns)
    return session


async def _turns(messages: list[dict[str, Any]], model: ModelClient, schemas: list[dict[str, Any]],
                 by_name: dict[str, Tool], ctx: ToolContext, session: SessionResult, max_turns: int,
                 trace: Any, limits: SpendLimits | None) -> str:
    """The loop itself, adding to the session's turns, usage and segments as it goes; returns the end reason."""
    end_reason = "max_turns"
    output = 0  # characters of tool results so far
    turns, usage = session.turns, session.usage
    for _ in range(max_turns):
        completion = await model.complete(messages, schemas)
        usage.add(completion.usage)
        session.segments.add(completion)
        turn = Turn(completion.content, completion.reasoning, completion.tool_calls,
                    finish_reason=completion.finish_reason, usage=completion.usage,
                    policy_version=completion.policy_version)
        turns.append(turn)
        if trace is not None:
            trace("model", turn)
        if completion.finish_reason == "error":  # the provider failed mid-generation: retry the sample
            raise APIFailure("the provider reported an error during generation (finish_reason 'error')")
        if completion.finish_reason == "content_filter":
            raise ModelOutputError("the provider's content filter stopped the response")
        if completion.finish_reason == "length":
            end_reason = "length"
            break
        if not completion.tool_calls:
            end_reason = "answer"
            break
        messages.append(_assistant_message(completion))
        for n, call in enumerate(completion.tool_calls):  # in order: calls of one step may depend on each other
            res = await call_tool(call, by_name, ctx) if n < MAX_CALLS_PER_TURN else ToolResult(call, _NOT_RUN, True)
            turn.results.append(res)
            output += len(res.result)
            if trace is not None:
                trace("tool", res)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": res.result})
        reached = limits.reached(usage, ctx.state.get("tool_model_usage")) if limits is not None else None
        if reached is None and output > MAX_TOOL_OUTPUT:
            reached = "max_tool_output"
        if reached is not None:
            end_reason = reached
            break
    return end_reason
