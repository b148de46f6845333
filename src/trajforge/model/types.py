"""Typed values that cross the model boundary, and the ModelClient protocol the agent uses."""

from __future__ import annotations

from array import array
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from trajforge.model.policy import PolicyVersion

# The defaults of --model and --base_url, declared once: config's field defaults and the model
# factory's local-model fallback both read them here.
DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model wrote it; the agent parses and validates it


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float = 0.0
    cached_tokens: int = 0  # prompt tokens read from the provider's cache (priced apart; not saved)

    def add(self, other: Usage) -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.reasoning_tokens += other.reasoning_tokens
        self.cost += other.cost
        self.cached_tokens += other.cached_tokens

    def as_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "reasoning_tokens": self.reasoning_tokens, "cost": round(self.cost, 8)}


PER_TOKENS = 1_000_000  # prices are USD per million tokens


@dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens. Cached prompt tokens cost `cached_prompt` (default: `prompt`)."""

    prompt: float
    completion: float
    cached_prompt: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_tokens, usage.prompt_tokens)
        cached_rate = self.prompt if self.cached_prompt is None else self.cached_prompt
        return ((usage.prompt_tokens - cached) * self.prompt + cached * cached_rate
                + usage.completion_tokens * self.completion) / PER_TOKENS


# Why a call's token ids are not recorded (a record's `tokens_missing`): they were not asked for
# (--capture_tokens off), or asked for and the reply came without them (a server that ignores
# the request field).
NOT_REQUESTED = "not_requested"
NOT_RETURNED = "not_returned_by_server"


@dataclass(slots=True)
class TokenCapture:
    """The token ids of one call as the server reported them (or the embedded model used them):
    never a re-tokenization of text. Arrays of 32-bit ids: a third of a list's memory, and
    validated as whole numbers when made."""

    prompt_ids: array  # array('i'): the prompt the model saw, as the server counted it
    completion_ids: array  # array('i'): the ids it generated (its stop token included when it made one)
    logprobs: list[float] | None  # one per completion id; None when the reply had none (or not one per id)


@dataclass(slots=True)
class Completion:
    """One assistant response, normalised from whatever shape the provider used."""

    content: str  # visible text, with <think>/<tool_call> blocks already removed
    reasoning: str | None  # from reasoning / reasoning_content / reasoning_details / <think>
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)
    tokens: TokenCapture | None = None
    tokens_missing: str | None = NOT_REQUESTED  # why `tokens` is None (None when it is not)
    policy_version: int | None = None  # of the policy serving the run when the call was sent (model.policy)


class ModelClient(Protocol):
    """What the agent loop needs from a model: one chat completion with tools offered."""

    model_name: str
    policy: PolicyVersion  # read once per call: the version its Completion carries

    async def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Completion:
        """Return one completion. Raises trajforge.model.errors.ModelCallError subclasses."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class ModelSettings:
    """The part of the run configuration a model client needs (the model never sees RunConfig)."""

    model: str
    base_url: str | None = None  # None: the default remote URL, or the local model without a key
    api_key: str | None = field(default=None, repr=False)  # explicit --api_key; env lookup in the factory
    max_tokens: int | None = None
    request_timeout: float = 600.0
    max_retries: int = 5
    temperature: float | None = None  # sampling: sent only when set
    top_p: float | None = None
    providers_allowed: list[str] | None = None
    providers_ignored: list[str] | None = None
    providers_order: list[str] | None = None
    provider_sort: str | None = None
    reasoning_effort: str | None = None
    reasoning_disabled: bool = False
    local_instances: int = 1
    capture_tokens: bool = False  # ask the server for token ids and logprobs (vLLM's request fields)
    policy_version: int | None = None  # the version calls are stamped with until someone changes it
    # USD per million tokens by model name (config `pricing`), for providers that report no cost.
    pricing: Mapping[str, Price] | None = None
