"""One validated run configuration: the RunConfig model and its sections.

This module owns what a run's settings are and which values are valid: RunConfig (field names are
the flag names), its nested sections (`task_types`, `distributions`, `network`, `pricing`), the
size strings of the sandbox limits (size_bytes, kept with the other value checks in
trajforge.config_checks), and the wording of an unknown choice (`unknown_choice`, shared with the
file reader). Reading a YAML file and merging defaults < file < command line, with errors
that name the flag or file key, is trajforge.config_load's. It holds no run logic, and stays
low: it imports the toolset catalog, the model's settings types, netpolicy and its single-value checks
(trajforge.config_checks), never a layer above.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from trajforge.model.pricing import Price
from trajforge.model.types import DEFAULT_MODEL, ModelSettings
from trajforge.catalog import toolset_names
from trajforge.catalog.distributions import Distribution, all_distributions
from trajforge.catalog.settings import ToolsSettings
from trajforge.config_checks import CHECKED_FIELDS, PID_MAX, SIZE_PATTERN, check_value, check_whole_numbers
from trajforge.config_checks import size_bytes  # noqa: F401 -- sample.settings reads sizes from here

ProviderSort = Literal["price", "throughput", "latency"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskTypeConfig(_Strict):
    retry_limit: int = Field(1, ge=0, le=1_000, description="in-run retries of a failed sample of this type")
    # Verification defaults for rows of this type (a row's own field wins); see trajforge.verify.
    check: str | None = Field(None, min_length=1)
    check_timeout: float | None = Field(None, gt=0)
    expected: str | None = None
    match: Literal["exact", "contains", "regex", "number"] | None = None
    rubric: str | None = Field(None, min_length=1)
    judge_threshold: float | None = Field(None, ge=0, le=1)


class PriceConfig(_Strict):
    """USD per million tokens of one model (config `pricing`), for providers that report no cost."""

    prompt: float = Field(ge=0)
    completion: float = Field(ge=0)
    cached_prompt: float | None = Field(None, ge=0, description="default: the prompt price")


class DistributionConfig(_Strict):
    description: str = ""
    toolsets: dict[str, float]

    @field_validator("toolsets", mode="before")
    @classmethod
    def _no_bool_probabilities(cls, v: Any) -> Any:
        # YAML `terminal: yes` would silently become 1%: demand a number.
        if isinstance(v, dict):
            for name, p in v.items():
                if isinstance(p, bool):
                    raise ValueError(f"probability of {name!r} must be a number of percent, got {p}")
        return v

    @field_validator("toolsets")
    @classmethod
    def _known_toolsets(cls, v: dict[str, float]) -> dict[str, float]:
        for name, p in v.items():
            if name not in toolset_names():
                raise ValueError(unknown_choice("toolset", name, list(toolset_names())))
            if not 0 <= p <= 100:
                raise ValueError(f"probability of {name!r} must be within 0..100, got {p:g}")
        if not v:
            raise ValueError("a distribution needs at least one toolset")
        if not any(v.values()):
            raise ValueError("at least one toolset needs a probability above 0")
        return v


class NetworkConfig(_Strict):
    """`network:` section. `allow`: CIDRs, addresses or host names that samples and the runner's
    fetches on their behalf may reach although they are loopback/private/link-local/CGNAT
    (netpolicy.py); host names only apply to the runner's fetches."""

    allow: list[str] = Field(default_factory=list)

    @field_validator("allow")
    @classmethod
    def _valid_entries(cls, v: list[str]) -> list[str]:
        from trajforge.netpolicy import valid_allow_entry

        for entry in v:
            if not valid_allow_entry(entry):
                raise ValueError(f"{entry!r} is neither a CIDR/address nor a host name")
        return v


class UnknownDistribution(ValueError):
    """Raised by RunConfig's whole-model check; config_load pins it on the `distribution` key."""

    def __init__(self, value: str, allowed: list[str]) -> None:
        super().__init__(unknown_choice("distribution", value, allowed))
        self.value, self.allowed = value, allowed


class RunConfig(_Strict):
    """Every setting of a run. Field names are the flag names (SPEC section 2).

    Immutable once validated: a value decided later (the sandbox `auto` resolves to, the local
    model chosen for want of a key) makes a copy with model_copy(update=...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Every whole number has an upper bound (le=): one beyond 64 bits crashed the run after it began.
    dataset_file: Path | None = None
    # Harbor-format task directories instead of a dataset (trajforge.tasks); exclusive with dataset_file.
    tasks: Path | None = None
    agent: Literal["model", "oracle"] = "model"  # oracle: each task's solution/solve.sh, no model
    pass_threshold: float = Field(1.0, ge=-1e12, le=1e12, description="a task passes when its reward is at least this")
    timeout_multiplier: float = Field(1.0, gt=0, le=1_000, description="scales every task's agent, verifier and "
                                      "build timeouts")
    task_max_cpus: float | None = Field(None, gt=0, le=100_000, description="cap on a task's [environment].cpus")
    task_max_memory: str | None = Field(None, pattern=SIZE_PATTERN, description="cap on a task's memory")
    task_max_storage: str | None = Field(None, pattern=SIZE_PATTERN, description="cap on a task's storage")
    batch_size: int | None = Field(None, ge=1, le=1_000_000)
    run_name: str | None = Field(None, min_length=1)
    distribution: str = "default"
    model: str = DEFAULT_MODEL
    base_url: str | None = None
    api_key: SecretStr | None = None
    max_turns: int = Field(10, ge=1, le=10_000)
    num_workers: int = Field(4, ge=1, le=100_000)
    resume: bool = False
    overwrite: bool = False
    verbose: bool = False
    max_samples: int | None = Field(None, ge=1, le=1_000_000_000)
    max_tokens: int | None = Field(None, ge=1, le=10_000_000)
    temperature: float | None = Field(None, ge=0, le=2, description="sampling temperature of the agent's calls")
    top_p: float | None = Field(None, gt=0, le=1, description="nucleus sampling of the agent's calls")
    providers_allowed: list[str] | None = None
    providers_ignored: list[str] | None = None
    providers_order: list[str] | None = None
    provider_sort: ProviderSort | None = None
    reasoning_effort: ReasoningEffort | None = None
    reasoning_disabled: bool = False
    ephemeral_system_prompt: str | None = None
    log_prefix_chars: int = Field(100, ge=0, le=1_000_000)
    prefill_messages_file: Path | None = None
    output_dir: Path = Path("data")
    timeout: float | None = Field(1800.0, gt=0, description="working seconds per sample (model.working)")
    sample_wall_timeout: float | None = Field(None, gt=0, description="wall-clock seconds per sample (off: None)")
    tool_timeout: float = Field(120.0, gt=0, description="seconds per terminal command")
    request_timeout: float = Field(600.0, gt=0, description="seconds per model request")
    max_retries: int = Field(5, ge=0, le=10_000, description="attempts per model request after the first")
    seed: int = Field(0, ge=-(1 << 63), le=(1 << 63) - 1)
    skip_invalid: bool = False
    keep_no_reasoning: bool = False
    keep_workspaces: bool = False
    retry_sandbox_limits: bool = False  # retry in-run a sample that hit its memory, /tmp or disk limit
    sandbox: Literal["auto", "local", "bwrap", "container"] = "auto"
    # egress: own network namespace, internet only (sandbox/network.py); "on" is the old name of host.
    sandbox_network: Literal["auto", "egress", "host", "none"] = "auto"
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    sandbox_memory: str = Field("4g", pattern=SIZE_PATTERN, description="memory of one sample (bwrap: cgroup)")
    sandbox_tmp_size: str = Field("1g", pattern=SIZE_PATTERN, description="size of a sample's /tmp (tmpfs)")
    sandbox_shm_size: str = Field("256m", pattern=SIZE_PATTERN, description="size of a sample's /dev/shm")
    sandbox_disk: str = Field("10g", pattern=SIZE_PATTERN, description="bytes a sample may write to its workspace")
    sandbox_cpu_seconds: int | None = Field(600, ge=1, le=10**7, description="CPU seconds per process of a command")
    sandbox_cpus: float | None = Field(1.0, gt=0, le=4096, description="CPUs one sample may keep busy (cgroup CPU quota)")
    max_sandboxes: int = Field(16, ge=1, le=100_000)
    sandbox_nproc: int = Field(512, ge=16, le=PID_MAX, description="processes of one bwrap sample (enforced as root)")
    container_engine: Literal["auto", "podman", "docker"] = "auto"
    container_image: str | None = Field(None, description="image of --sandbox container rows without an image")
    container_memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$",
                                         description="memory limit per container (default: sandbox_memory)")
    container_pids_limit: int = Field(1024, ge=16, le=PID_MAX, description="processes per container")
    container_cpus: float | None = Field(None, gt=0, description="CPUs per container (default: sandbox_cpus)")
    image_pull_timeout: float = Field(300.0, gt=0, description="seconds to pull one missing image")
    local_instances: int = Field(1, ge=1, le=1_024)
    fail_on_error: float = Field(1, gt=0, description="failed samples that make the exit code 3: a count "
                                 "(1, 2, ...) or a fraction of the samples (0 < x < 1)")
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    samples_per_prompt: int = Field(1, ge=1, le=10_000, description="independent rollouts of every row")
    # at most samples_per_prompt (_passes_within_rollouts), so bounded like it
    stop_after_passes: int | None = Field(None, ge=1, description="rollouts of a row not started after K passes")
    keep: Literal["all", "passed"] = "all"
    check_timeout: float = Field(300.0, gt=0, description="seconds a row's check may run")
    judge_model: str | None = Field(None, min_length=1)
    judge_base_url: str | None = Field(None, min_length=1)
    judge_api_key_env: str | None = Field(None, min_length=1)
    judge_threshold: float = Field(0.5, ge=0, le=1)
    task_types: dict[str, TaskTypeConfig] = Field(default_factory=dict)
    distributions: dict[str, DistributionConfig] = Field(default_factory=dict)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)
    # Spend and load control (runner.budget, model.gate).
    max_cost: float | None = Field(None, gt=0, description="USD for the whole run, over all invocations")
    max_cost_per_sample: float | None = Field(None, gt=0)
    max_tokens_per_sample: int | None = Field(None, ge=1, le=1_000_000_000)
    adaptive_concurrency: bool = True
    max_requests_per_minute: float | None = Field(None, gt=0)
    max_tokens_per_minute: float | None = Field(None, gt=0)
    pricing: dict[str, PriceConfig] = Field(default_factory=dict)

    @field_validator("batch_size", "max_turns", "num_workers", "max_samples", "max_tokens", "log_prefix_chars",
                     "timeout", "sample_wall_timeout", "tool_timeout", "request_timeout", "max_retries", "seed",
                     "max_sandboxes", "sandbox_nproc", "container_pids_limit", "container_cpus", "image_pull_timeout",
                     "local_instances", "samples_per_prompt", "stop_after_passes", "check_timeout",
                     "judge_threshold", "temperature", "top_p", "max_cost", "max_cost_per_sample",
                     "max_tokens_per_sample", "max_requests_per_minute", "max_tokens_per_minute", "fail_on_error",
                     "sandbox_cpu_seconds", "sandbox_cpus", "pass_threshold", "timeout_multiplier", "task_max_cpus",
                     mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any) -> Any:
        # pydantic's lax mode reads True as 1; `max_turns: yes` in a config file is a mistake.
        if isinstance(v, bool):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        return v

    @field_validator(*CHECKED_FIELDS, mode="before")
    @classmethod
    def _checked(cls, v: Any, info: ValidationInfo) -> Any:
        check_value(info.field_name or "", v)  # a path, URL or size that could only fail (or harm) later
        return v

    @field_validator("tools")
    @classmethod
    def _tools_bounded(cls, v: ToolsSettings) -> ToolsSettings:
        check_whole_numbers(v, [])  # catalog.settings bounds them from below; config_checks from above
        return v

    @field_validator("fail_on_error")
    @classmethod
    def _count_or_fraction(cls, v: float) -> float:
        if v >= 1 and v != int(v):
            raise ValueError("must be a whole count of samples (1, 2, ...) or a fraction between 0 and 1")
        return v

    @field_validator("sandbox_network", mode="before")
    @classmethod
    def _network_alias(cls, v: Any) -> Any:
        return "host" if v == "on" else v  # configs written before egress existed keep working

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
            raise UnknownDistribution(self.distribution, list(known))
        return self

    @model_validator(mode="after")
    def _passes_within_rollouts(self) -> RunConfig:
        if self.stop_after_passes is not None and self.stop_after_passes > self.samples_per_prompt:
            raise ValueError(f"--stop_after_passes ({self.stop_after_passes}) must be at most "
                             f"--samples_per_prompt ({self.samples_per_prompt})")
        return self

    @model_validator(mode="after")
    def _one_input(self) -> RunConfig:
        if self.tasks is not None and self.dataset_file is not None:
            raise ValueError("--tasks and --dataset_file are exclusive: give one input")
        if self.agent == "oracle" and self.tasks is None:
            raise ValueError("--agent oracle runs each task's solution/solve.sh: it needs --tasks")
        return self

    def all_distributions(self) -> dict[str, Distribution]:
        custom = {
            name: Distribution(name, d.description or "custom (config file)", dict(d.toolsets))
            for name, d in self.distributions.items()
        }
        return all_distributions(custom)

    def task_type(self, name: str | None) -> TaskTypeConfig | None:
        """A row's `task_types` section: its type's own, else `default` (rows without a type too)."""
        return self.task_types.get(name or "") or self.task_types.get("default")

    def retry_limit(self, task_type: str | None) -> int:
        tt = self.task_type(task_type)
        return tt.retry_limit if tt else 1

    def model_settings(self) -> ModelSettings:
        return ModelSettings(
            model=self.model, base_url=self.base_url,
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            max_tokens=self.max_tokens, request_timeout=self.request_timeout, max_retries=self.max_retries,
            temperature=self.temperature, top_p=self.top_p,
            providers_allowed=self.providers_allowed, providers_ignored=self.providers_ignored,
            providers_order=self.providers_order, provider_sort=self.provider_sort,
            reasoning_effort=self.reasoning_effort, reasoning_disabled=self.reasoning_disabled,
            local_instances=self.local_instances,
            pricing={name: Price(p.prompt, p.completion, p.cached_prompt) for name, p in self.pricing.items()},
        )

    def masked(self) -> dict[str, Any]:
        """The resolved configuration as JSON-able data with the API key masked."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = "***"
        return data


def suggest(value: str, allowed: list[str]) -> str:
    """'; did you mean 'x'? (allowed: a, b)': the closest name first, for typos."""
    close = difflib.get_close_matches(value, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (allowed: {', '.join(allowed)})"


def unknown_choice(what: str, value: str, allowed: list[str]) -> str:
    return f"unknown {what} {value!r}{suggest(value, allowed)}"
