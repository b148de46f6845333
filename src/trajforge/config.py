"""One validated run configuration: defaults < YAML file (--config) < command line.

This module owns the RunConfig model, the YAML file format (flat flag-named keys plus the nested
`parallelism` / `task_types` / `distributions` sections) and turning validation failures into
messages that name the flag or file key. It holds no run logic.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from trajforge.errors import ConfigError, UsageError
from trajforge.model.types import ModelSettings
from trajforge.tools.distributions import TOOLSETS, Distribution, all_distributions
from trajforge.tools.settings import ToolsSettings

DEFAULT_MODEL = "anthropic/claude-sonnet-4.6"
DEFAULT_BASE_URL = "https://openrouter.ai/api/v1"
ProviderSort = Literal["price", "throughput", "latency"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskTypeConfig(_Strict):
    retry_limit: int = Field(1, ge=0, description="in-run retries of a failed sample of this type")


class DistributionConfig(_Strict):
    description: str = ""
    toolsets: dict[str, float]

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, v: dict[str, float]) -> dict[str, float]:
        for name, p in v.items():
            if name not in TOOLSETS:
                raise ValueError(f"unknown toolset {name!r} (known: {', '.join(TOOLSETS)})")
            if not 0 <= p <= 100:
                raise ValueError(f"probability of {name!r} must be within 0..100, got {p}")
        if not v:
            raise ValueError("a distribution needs at least one toolset")
        return v


class RunConfig(_Strict):
    """Every setting of a run. Field names are the flag names (SPEC section 2)."""

    dataset_file: Path | None = None
    batch_size: int | None = Field(None, ge=1)
    run_name: str | None = Field(None, min_length=1)
    distribution: str = "default"
    model: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key: SecretStr | None = None
    max_turns: int = Field(10, ge=1)
    num_workers: int = Field(4, ge=1, le=100_000)
    resume: bool = False
    overwrite: bool = False
    verbose: bool = False
    max_samples: int | None = Field(None, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    providers_allowed: list[str] | None = None
    providers_ignored: list[str] | None = None
    providers_order: list[str] | None = None
    provider_sort: ProviderSort | None = None
    reasoning_effort: ReasoningEffort | None = None
    reasoning_disabled: bool = False
    ephemeral_system_prompt: str | None = None
    log_prefix_chars: int = Field(100, ge=0)
    prefill_messages_file: Path | None = None
    output_dir: Path = Path("data")
    timeout: float | None = Field(None, gt=0, description="wall-clock seconds per sample")
    tool_timeout: float = Field(120.0, gt=0, description="seconds per terminal command")
    request_timeout: float = Field(600.0, gt=0, description="seconds per model request")
    max_retries: int = Field(5, ge=0, description="attempts per model request after the first")
    seed: int = 0
    skip_invalid: bool = False
    keep_no_reasoning: bool = False
    keep_workspaces: bool = False
    sandbox: Literal["auto", "local", "bwrap", "container"] = "auto"
    sandbox_network: Literal["on", "none"] = "on"
    max_sandboxes: int = Field(16, ge=1)
    local_instances: int = Field(1, ge=1)
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    task_types: dict[str, TaskTypeConfig] = Field(default_factory=dict)
    distributions: dict[str, DistributionConfig] = Field(default_factory=dict)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)

    @field_validator("providers_allowed", "providers_ignored", "providers_order", mode="before")
    @classmethod
    def _split_csv(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p.strip() for p in v.split(",") if p.strip()]
        return v

    @model_validator(mode="after")
    def _known_distribution(self) -> RunConfig:
        known = self.all_distributions()
        if self.distribution not in known:
            raise ValueError(_unknown_choice("distribution", self.distribution, list(known)))
        return self

    def all_distributions(self) -> dict[str, Distribution]:
        custom = {
            name: Distribution(name, d.description or "custom (config file)", dict(d.toolsets))
            for name, d in self.distributions.items()
        }
        return all_distributions(custom)

    def retry_limit(self, task_type: str | None) -> int:
        tt = self.task_types.get(task_type or "")
        return tt.retry_limit if tt else 1

    def model_settings(self) -> ModelSettings:
        return ModelSettings(
            model=self.model, base_url=self.base_url,
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            max_tokens=self.max_tokens, request_timeout=self.request_timeout, max_retries=self.max_retries,
            providers_allowed=self.providers_allowed, providers_ignored=self.providers_ignored,
            providers_order=self.providers_order, provider_sort=self.provider_sort,
            reasoning_effort=self.reasoning_effort, reasoning_disabled=self.reasoning_disabled,
            local_instances=self.local_instances,
        )

    def masked(self) -> dict[str, Any]:
        """The resolved configuration as JSON-able data with the API key masked."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = "***"
        return data


def _unknown_choice(what: str, value: str, allowed: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(value, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {what} {value!r}{hint} (allowed: {', '.join(allowed)})"


_NESTED_PARALLELISM = {"max_workers": "num_workers", "batch_size": "batch_size", "timeout": "timeout"}


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file into flat RunConfig keys; errors name the file and key."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid YAML: {e}".splitlines()[0]) from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys, got {type(raw).__name__}")
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        key = str(key).replace("-", "_")
        if key == "parallelism":
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: key 'parallelism' must be a mapping")
            for sub, v in value.items():
                if sub not in _NESTED_PARALLELISM:
                    raise ConfigError(
                        f"{path}: unknown key 'parallelism.{sub}' (allowed: {', '.join(_NESTED_PARALLELISM)})"
                    )
                flat[_NESTED_PARALLELISM[sub]] = v
        elif key in RunConfig.model_fields:
            flat[key] = value
        else:
            raise ConfigError(f"{path}: {_unknown_choice('key', key, list(RunConfig.model_fields))}")
    return flat


def build_config(cli_values: dict[str, Any], config_file: Path | None = None) -> RunConfig:
    """Merge defaults < YAML < CLI and validate; errors name the flag (or file key) and value."""
    file_values = read_yaml(config_file) if config_file else {}
    merged = {**file_values, **cli_values}
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as e:
        raise UsageError(_describe(e, cli_values, config_file)) from None


def _describe(e: ValidationError, cli_values: dict[str, Any], config_file: Path | None) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        top = str(err["loc"][0]) if err["loc"] else ""
        msg = err["msg"].removeprefix("Value error, ")
        if "expected" in err.get("ctx", {}):
            msg = f"must be one of {err['ctx']['expected']}"
        value = err.get("input")
        where = f"--{top}" if top in cli_values else (f"{config_file}: key '{loc}'" if config_file else f"--{top}")
        if not top:
            lines.append(msg)
        else:
            shown = "***" if top == "api_key" else repr(value)
            lines.append(f"{where}: invalid value {shown}: {msg}")
    return "\n".join(lines)
