"""The model layer's section of the run's configuration: which model, where, and how it is asked.

The fields are run flags and --config keys by their names (trajforge.config collects this section
into RunConfig); `model_settings()` turns them into the ModelSettings every client reads
(model/types.py), whose defaults are the ones these fields show. The model gate's limits
(model/gate.py, model/limiter.py) and the prices of models whose provider reports no cost
(`pricing`, model/pricing.py) are the model layer's too.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from trajforge.fields import FILE_ONLY, shown
from trajforge.model.types import DEFAULT_MODEL, ModelSettings, Price

ProviderSort = Literal["price", "throughput", "latency"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
_DEFAULT = {f.name: f.default for f in dataclasses.fields(ModelSettings)}  # spelled once, in ModelSettings


class PriceConfig(BaseModel):
    """USD per million tokens of one model (config `pricing`), for providers that report no cost."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)
    cached_prompt: float | None = Field(None, ge=0, description="default: the prompt price")


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(DEFAULT_MODEL,
                       description="model name; 'local' or 'local:/path/model.gguf' runs a GGUF model in-process")
    base_url: str | None = Field(None, description="OpenAI-compatible API base URL", json_schema_extra=shown(
        "https://openrouter.ai/api/v1, or the local model when no API key is set"))
    api_key: SecretStr | None = Field(None, description="API key for the model",
                                      json_schema_extra=shown("$OPENROUTER_API_KEY, then $OPENAI_API_KEY"))
    max_tokens: int | None = Field(None, ge=1, le=10_000_000, description="max tokens per model response",
                                   json_schema_extra=shown("the model's"))
    temperature: float | None = Field(None, ge=0, le=2, description="sampling temperature of the agent's model calls, "
                                      "0-2 (sent only when set)", json_schema_extra=shown("the model's"))
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling of the agent's model calls, above 0 "
                                "and at most 1 (sent only when set)", json_schema_extra=shown("the model's"))
    providers_allowed: list[str] | None = Field(None,
                                                description="comma-separated providers allowed (OpenRouter routing)",
                                                json_schema_extra=shown("all"))
    providers_ignored: list[str] | None = Field(None,
                                                description="comma-separated providers to ignore (OpenRouter routing)",
                                                json_schema_extra=shown("none"))
    providers_order: list[str] | None = Field(None, description="comma-separated preferred provider order "
                                              "(OpenRouter routing)", json_schema_extra=shown("the router's"))
    provider_sort: ProviderSort | None = Field(None, description="sort providers by: {choices}",
                                               json_schema_extra=shown("the router's"))
    reasoning_effort: ReasoningEffort | None = Field(None, description="{choices}",
                                                     json_schema_extra=shown("the model's"))
    reasoning_disabled: bool = Field(_DEFAULT["reasoning_disabled"],
                                     description="disable reasoning/thinking tokens entirely")
    request_timeout: float = Field(_DEFAULT["request_timeout"], gt=0, description="seconds per model request")
    max_retries: int = Field(_DEFAULT["max_retries"], ge=0, le=10_000,
                             description="retries per model request on 429/5xx/timeouts")
    local_instances: int = Field(_DEFAULT["local_instances"], ge=1, le=1_024,
                                 description="model instances of the local backend")
    capture_tokens: bool = Field(_DEFAULT["capture_tokens"], description="record every model call's token ids and "
                                 "logprobs, and build training segments: asks an OpenAI-compatible server for them "
                                 "(vLLM's return_token_ids, logprobs); the local model's prompts then continue its ids")
    policy_version: int | None = Field(_DEFAULT["policy_version"], ge=0, le=(1 << 63) - 1,
                                       description="policy version stamped on every model call (each record's "
                                       "policy_versions)", json_schema_extra=shown("none"))
    # Load control of every model call of the run (model.gate, model.limiter).
    adaptive_concurrency: bool = Field(True, description="true/false: adapt requests in flight to 429s and latency, up "
                                       "to --num_workers", json_schema_extra=shown("true"))
    max_requests_per_minute: float | None = Field(None, gt=0, description="model requests per minute, all calls of the "
                                                  "run (tools' included)", json_schema_extra=shown("no limit"))
    max_tokens_per_minute: float | None = Field(None, gt=0, description="model tokens per minute, all calls of the run "
                                                "(tools' included)", json_schema_extra=shown("no limit"))
    pricing: dict[str, PriceConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)

    @field_validator("providers_allowed", "providers_ignored", "providers_order", mode="before")
    @classmethod
    def _split_csv(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    def model_settings(self, model: str | None = None) -> ModelSettings:
        """What a model client reads; `model`: the one the run decided on, when not --model."""
        return ModelSettings(
            model=model or self.model, base_url=self.base_url,
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            max_tokens=self.max_tokens, request_timeout=self.request_timeout, max_retries=self.max_retries,
            temperature=self.temperature, top_p=self.top_p,
            providers_allowed=self.providers_allowed, providers_ignored=self.providers_ignored,
            providers_order=self.providers_order, provider_sort=self.provider_sort,
            reasoning_effort=self.reasoning_effort, reasoning_disabled=self.reasoning_disabled,
            local_instances=self.local_instances,
            pricing={name: Price(p.prompt, p.completion, p.cached_prompt) for name, p in self.pricing.items()},
        )

    def agent_model_settings(self, model: str | None = None) -> ModelSettings:
        """The agent's own model client's settings: `model_settings`, plus what only the policy's
        calls do (token capture, the policy version); the judge's and the tools' clients never ask
        for ids."""
        return dataclasses.replace(self.model_settings(model), capture_tokens=self.capture_tokens,
                                   policy_version=self.policy_version)
