"""The `moa` toolset: mixture_of_agents asks several reference models, then an aggregator.

This module owns the two-layer Mixture-of-Agents call: every reference model answers the prompt
in parallel (a TaskGroup; a reference that fails is recorded, not fatal, as long as at least
tools.moa.min_successes answer), then the aggregator model synthesises one answer from theirs.
Clients (one per reference entry, one for the aggregator) are created once per run in `build`
and closed by MoaToolset.aclose. Defaults (MoaSettings): on the default API the reference models are
DEFAULT_REFERENCE_MODELS; on any other endpoint the run's --model three times; the aggregator
is the run's --model.

Result: {success, response, models_used, aggregator, failures: [{model, error}]}.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from trajforge.errors import FatalModelError
from trajforge.model.errors import ModelCallError
from trajforge.model.types import Completion, ModelClient
from trajforge.tools.aux_models import ToolUnavailable, is_default_endpoint, record_usage, tool_client
from trajforge.tools.tool import Tool, ToolContext, Toolset, Unavailable, error, ok
from trajforge.catalog.tools_config import MoaSettings

if TYPE_CHECKING:
    from trajforge.tools.tool_settings import ToolSettings

# OpenRouter model names: four strong models from different families, for diverse answers.
DEFAULT_REFERENCE_MODELS = ("anthropic/claude-sonnet-4.6", "google/gemini-2.5-pro", "openai/gpt-5",
                            "deepseek/deepseek-r1")
AGGREGATOR_SYSTEM = (
    "You have been given a user's query and responses to it from several AI models. Synthesise them into "
    "one high-quality answer. Evaluate the responses critically: some may be biased or wrong. Do not simply "
    "copy them; give a refined, accurate, complete and well-structured reply.\n\n"
    "Responses from the models:\n\n{answers}")


class MoaToolset(Toolset):
    def __init__(self, settings: MoaSettings, references: list[tuple[str, ModelClient]],
                 aggregator: tuple[str, ModelClient], clients: list[ModelClient]) -> None:
        self.settings = settings
        self.references = references
        self.aggregator = aggregator
        self._clients = clients
        super().__init__("moa", [MixtureOfAgentsTool(self)])

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


class MixtureOfAgentsTool(Tool):
    name = "mixture_of_agents"
    toolset = "moa"
    description = ("Solve a hard problem with a Mixture of Agents: several frontier models answer in parallel "
                   "and an aggregator model synthesises the best answer. Slow and costly: use for genuinely "
                   "difficult reasoning, math, coding or analysis problems.")
    parameters = {
        "type": "object",
        "properties": {
            "user_prompt": {"type": "string", "description": "The complete problem or question to solve."},
        },
        "required": ["user_prompt"],
    }

    def __init__(self, owner: MoaToolset) -> None:
        self.owner = owner

    async def run(self, args: dict[str, Any], ctx: ToolContext) -> str:
        prompt = str(args.get("user_prompt") or "").strip()
        if not prompt:
            return error("user_prompt must be a non-empty string")
        owner = self.owner
        messages = [{"role": "user", "content": prompt}]
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(_ask(client, messages)) for _, client in owner.references]
        answers: list[tuple[str, str]] = []
        failures: list[dict[str, str]] = []
        for (model, _), task in zip(owner.references, tasks, strict=True):
            outcome = task.result()
            if isinstance(outcome, str):
                failures.append({"model": model, "error": outcome})
            else:
                record_usage(ctx, outcome.usage)
                answers.append((model, outcome.content))
        if len(answers) < owner.settings.min_successes:
            return error(f"only {len(answers)} of {len(owner.references)} reference models answered "
                         f"(need {owner.settings.min_successes})", failures=failures)
        numbered = "\n\n".join(f"{n}. {text}" for n, (_, text) in enumerate(answers, 1))
        agg_model, agg_client = owner.aggregator
        outcome = await _ask(agg_client, [{"role": "system", "content": AGGREGATOR_SYSTEM.format(answers=numbered)},
                                          *messages])
        if isinstance(outcome, str):
            return error(f"aggregator model {agg_model} failed: {outcome}", failures=failures)
        record_usage(ctx, outcome.usage)
        return ok(response=outcome.content, models_used=[m for m, _ in answers], aggregator=agg_model,
                  failures=failures)


async def _ask(client: ModelClient, messages: list[dict[str, Any]]) -> Completion | str:
    """The completion, or the failure as text (an empty answer counts as a failure)."""
    try:
        completion = await client.complete(messages, [])
    except (ModelCallError, FatalModelError) as e:
        return str(e)
    if not completion.content.strip():
        return "empty answer"
    return completion


async def build(run: ToolSettings) -> MoaToolset | Unavailable:
    settings = run.sections.moa
    if settings.reference_models is not None:
        reference_models = list(settings.reference_models)
    elif is_default_endpoint(run, settings.base_url):
        reference_models = list(DEFAULT_REFERENCE_MODELS)
    else:
        reference_models = [run.model.model] * 3
    if not reference_models:
        return Unavailable("moa", "tools.moa.reference_models is empty")
    if settings.min_successes > len(reference_models):
        return Unavailable("moa", f"tools.moa.min_successes ({settings.min_successes}) exceeds the "
                                  f"{len(reference_models)} reference models")
    aggregator_model = settings.aggregator_model or run.model.model
    clients: list[ModelClient] = []

    def client(model: str, temperature: float, max_tokens: int | None) -> ModelClient:
        made = tool_client(run, "moa", model=model, base_url=settings.base_url, api_key_env=settings.api_key_env,
                           max_tokens=max_tokens, temperature=temperature, timeout=settings.timeout)
        clients.append(made)
        return made

    try:
        # One client per reference entry: a model listed twice is sampled twice, independently.
        references = [(m, client(m, settings.reference_temperature, settings.reference_max_tokens))
                      for m in reference_models]
        aggregator = (aggregator_model, client(aggregator_model, settings.aggregator_temperature,
                                               settings.aggregator_max_tokens))
    except ToolUnavailable as e:
        for made in clients:
            await made.aclose()
        return Unavailable("moa", str(e))
    return MoaToolset(settings, references, aggregator, clients)
