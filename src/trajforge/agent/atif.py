"""The Agent Trajectory Interchange Format (ATIF v1.7), built from OpenAI-shaped messages (pure).

ATIF is the trajectory format of Harbor's task ecosystem: a document with the agent (name,
version, model, tool definitions), `steps` (system, user, and one agent step per model reply,
with its reasoning, tool calls and the observations that answer them, paired by call id),
per-step metrics where they are known and `final_metrics`. Two callers: the task verifier writes
a sample's trajectory to /logs/agent/trajectory.json from its session (`messages_of`), and
`trajforge export --format atif` writes one document per saved record (from export.convert's
messages, which carry no per-step usage: those steps have no metrics).
"""

from __future__ import annotations

from typing import Any

import orjson

from trajforge import __version__
from trajforge.agent.loop import SessionResult
from trajforge.agent.prompts import RUNTIME_SYSTEM_PROMPT
from trajforge.model.types import Usage

SCHEMA_VERSION = "ATIF-v1.7"
AGENT_NAME = "trajforge"


def messages_of(session: SessionResult) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
    """(messages, each assistant message's usage) of a finished session, as the model saw them
    (the runtime system prompt without the ephemeral prompt or prefill, which are never saved)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": RUNTIME_SYSTEM_PROMPT},
                                      {"role": "user", "content": session.prompt}]
    usage: list[dict[str, Any] | None] = []
    for turn in session.turns:
        msg: dict[str, Any] = {"role": "assistant", "content": turn.content or ""}
        if turn.reasoning:
            msg["reasoning_content"] = turn.reasoning
        if turn.tool_calls:
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments or "{}"}}
                                 for c in turn.tool_calls]
        messages.append(msg)
        usage.append(_usage(turn.usage))
        by_id = {r.call.id: r for r in turn.results}
        for call in turn.tool_calls:
            res = by_id.get(call.id)
            if res is not None:
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.result})
    return messages, usage


def _usage(u: Usage | None) -> dict[str, Any] | None:
    return None if u is None else u.as_dict()


def _arguments(text: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """ATIF wants an object: what the model wrote, or {} with its raw text kept in `extra`."""
    try:
        value = orjson.loads(text) if text.strip() else {}
    except orjson.JSONDecodeError:
        value = None
    return (value, None) if isinstance(value, dict) else ({}, {"raw_arguments": text})


def _metrics(u: dict[str, Any] | None) -> dict[str, Any] | None:
    if not u:
        return None
    out: dict[str, Any] = {"prompt_tokens": int(u.get("prompt_tokens", 0)),
                           "completion_tokens": int(u.get("completion_tokens", 0)),
                           "cost_usd": float(u.get("cost", 0.0))}
    if u.get("reasoning_tokens"):
        out["extra"] = {"reasoning_tokens": int(u["reasoning_tokens"])}
    return out


def document(messages: list[dict[str, Any]], tools: list[dict[str, Any]], *, session_id: str, model: str,
             step_usage: list[dict[str, Any] | None] | None = None, total_usage: dict[str, Any] | None = None,
             llm_calls: bool = True, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One ATIF document. `step_usage`: per assistant message, in order (None where unknown);
    `llm_calls` False for steps no model made (the oracle's): they say so (llm_call_count 0)."""
    steps: list[dict[str, Any]] = []
    agent_steps = 0
    for msg in messages:
        role = msg.get("role")
        if role in ("system", "user"):
            steps.append({"step_id": len(steps) + 1, "source": role, "message": msg.get("content") or ""})
        elif role == "assistant":
            step: dict[str, Any] = {"step_id": len(steps) + 1, "source": "agent", "message": msg.get("content") or ""}
            if llm_calls:
                step["model_name"] = model
                step["llm_call_count"] = 1
                if msg.get("reasoning_content"):
                    step["reasoning_content"] = msg["reasoning_content"]
                u = step_usage[agent_steps] if step_usage is not None and agent_steps < len(step_usage) else None
                if (metrics := _metrics(u)) is not None:
                    step["metrics"] = metrics
            else:
                step["llm_call_count"] = 0
            calls = []
            for c in msg.get("tool_calls") or ():
                args, raw = _arguments(c["function"]["arguments"])
                call = {"tool_call_id": c["id"], "function_name": c["function"]["name"], "arguments": args}
                if raw is not None:
                    call["extra"] = raw
                calls.append(call)
            if calls:
                step["tool_calls"] = calls
            steps.append(step)
            agent_steps += 1
        elif role == "tool":
            last = steps[-1] if steps else None
            ids = {c["tool_call_id"] for c in (last or {}).get("tool_calls", ())}
            result: dict[str, Any] = {"content": msg.get("content") or ""}
            if msg.get("tool_call_id") in ids:
                result["source_call_id"] = msg["tool_call_id"]
            else:  # answers no call of the step before it: kept, unpaired
                result["extra"] = {"tool_call_id": msg.get("tool_call_id")}
            if last is None or last["source"] != "agent":
                continue
            last.setdefault("observation", {"results": []})["results"].append(result)
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION, "session_id": session_id, "trajectory_id": session_id,
        "agent": {"name": AGENT_NAME, "version": __version__, "model_name": model, "tool_definitions": tools},
        "steps": steps,
    }
    final: dict[str, Any] = {"total_steps": len(steps)}
    if total_usage:
        final.update(total_prompt_tokens=int(total_usage.get("prompt_tokens", 0)),
                     total_completion_tokens=int(total_usage.get("completion_tokens", 0)),
                     total_cost_usd=float(total_usage.get("cost", 0.0)))
        if total_usage.get("reasoning_tokens"):
            final["extra"] = {"total_reasoning_tokens": int(total_usage["reasoning_tokens"])}
    doc["final_metrics"] = final
    if extra:
        doc["extra"] = extra
    return doc
