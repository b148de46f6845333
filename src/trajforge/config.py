"""One validated run configuration: the RunConfig model.

This module owns what a run's settings are and which values are valid: RunConfig (field names are
the flag names); its nested sections (`task_types`, `distributions`, `network`, `pricing`) and the
wording of an unknown choice are config_sections.py's; the size strings of the sandbox limits (size_bytes, kept with the other value checks in
trajforge.config_checks), and the wording of an unknown choice (`unknown_choice`, shared with the
file reader). Reading a YAML file and merging defaults < file < command line, with errors
that name the flag or file key, is trajforge.config_load's. It holds no run logic, and stays
low: it imports the toolset catalog, the model's settings types, netpolicy and its single-value checks
(trajforge.config_checks), never a layer above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from trajforge.model.pricing import Price
from trajforge.model.types import DEFAULT_MODEL, ModelSettings
from trajforge.catalog.distributions import Distribution, all_distributions
from trajforge.catalog.executors import EXECUTORS
from trajforge.catalog.sandboxes import AUTO, OLD_NAMES, backend_choices, network_choices, network_help
from trajforge.catalog.tools_config import ToolsConfig
from trajforge.config_checks import (
    CHECKED_FIELDS, PID_MAX, SIZE_FIELDS, SIZE_PATTERN, OneOf, check_value, check_whole_numbers, size_text,
)
from trajforge.config_checks import size_bytes  # noqa: F401 -- sample.lower_settings reads sizes from here
from trajforge.config_sections import (  # noqa: F401 -- the sections are RunConfig's, imported from here
    DistributionConfig, NetworkConfig, PriceConfig, TaskTypeConfig, UnknownDistribution, _Strict, suggest, unknown_choice,
)

ProviderSort = Literal["price", "throughput", "latency"]
# A RunConfig field's `json_schema_extra`: FILE_ONLY, a key of the --config file with no flag; shown(words),
# the default as --help words it when the value itself (often None) says nothing.
FILE_ONLY = {"flag": False}


def shown(words: str) -> dict[str, Any]:
    return {"shown_default": words}

ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class RunConfig(_Strict):
    """Every setting of a run. Field names are the flag names (SPEC section 2), and each flag's
    --help is its field's description (commands/run.py builds the flags from the fields:
    `{choices}` stands for the field's allowed values, FILE_ONLY marks a key with no flag).

    Immutable once validated: a value decided later (the sandbox `auto` resolves to, the local
    model chosen for want of a key) makes a copy with model_copy(update=...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Every whole number has an upper bound (le=): one beyond 64 bits crashed the run after it began.
    dataset_file: Path | None = Field(None, description="JSONL dataset path (or --tasks)",
                                      json_schema_extra=shown("required"))
    # Harbor-format task directories instead of a dataset (trajforge.tasks); exclusive with dataset_file.
    tasks: Path | None = Field(None, description="Harbor-format task directory, or a directory of them, instead of "
                               "--dataset_file", json_schema_extra=shown("none"))
    agent: Literal["model", "oracle"] = Field(
        "model", description="model, or oracle: run each task's solution/solve.sh instead of a model")
    pass_threshold: float = Field(1.0, ge=-1e12, le=1e12, description="a task passes when its reward is at least this")
    timeout_multiplier: float = Field(1.0, gt=0, le=1_000,
                                      description="scales every task's agent, verifier and build timeouts")
    task_max_cpus: float | None = Field(None, gt=0, le=100_000,
                                        description="cap on the CPUs a task's [environment] asks for",
                                        json_schema_extra=shown("no cap"))
    task_max_memory: str | None = Field(None, pattern=SIZE_PATTERN,
                                        description="cap on the memory a task's [environment] asks for (e.g. 8g)",
                                        json_schema_extra=shown("no cap"))
    task_max_storage: str | None = Field(None, pattern=SIZE_PATTERN,
                                         description="cap on the storage a task's [environment] asks for (e.g. 20g)",
                                         json_schema_extra=shown("no cap"))
    batch_size: int | None = Field(None, ge=1, le=1_000_000,
                                   description="prompts per batch: one batch_N.jsonl per batch")
    run_name: str | None = Field(None, min_length=1, description="run name: output goes to <output_dir>/<run_name>/")
    distribution: str = Field("default", description="toolset distribution to sample from (see --list_distributions)")
    model: str = Field(DEFAULT_MODEL,
                       description="model name; 'local' or 'local:/path/model.gguf' runs a GGUF model in-process")
    base_url: str | None = Field(None, description="OpenAI-compatible API base URL", json_schema_extra=shown(
        "https://openrouter.ai/api/v1, or the local model when no API key is set"))
    api_key: SecretStr | None = Field(None, description="API key for the model",
                                      json_schema_extra=shown("$OPENROUTER_API_KEY, then $OPENAI_API_KEY"))
    max_turns: int = Field(10, ge=1, le=10_000, description="max tool-calling iterations per prompt")
    num_workers: int = Field(4, ge=1, le=100_000, description="agent sessions in flight at once")
    resume: bool = Field(False, description="resume the run: skip finished samples, retry failed ones")
    overwrite: bool = Field(False, description="delete the run's own files (batch files, trajectories, checkpoint, "
                            "statistics, config, kept workspaces) and start over; other files in its directory stay")
    verbose: bool = Field(False, description="log every step of every sample, and print the resolved configuration")
    max_samples: int | None = Field(None, ge=1, le=1_000_000_000,
                                    description="only the first N valid samples of the dataset",
                                    json_schema_extra=shown("all"))
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
    reasoning_disabled: bool = Field(False, description="disable reasoning/thinking tokens entirely")
    ephemeral_system_prompt: str | None = Field(None, description="system prompt used at run time but never saved",
                                                json_schema_extra=shown("none"))
    log_prefix_chars: int = Field(100, ge=0, le=1_000_000, description="characters shown in log previews")
    prefill_messages_file: Path | None = Field(None,
                                               description="JSON file with a list of {role, content} few-shot messages",
                                               json_schema_extra=shown("none"))
    output_dir: Path = Field(Path("data"), description="parent directory of run directories")
    timeout: float | None = Field(1800.0, gt=0, description="working seconds per sample before it is killed (waits for "
                                  "the model gate, a Retry-After, rate budgets, retry backoff and its sandbox do not "
                                  "count)")
    sample_wall_timeout: float | None = Field(None, gt=0, description="wall-clock seconds per sample before it is "
                                              "killed, waits included", json_schema_extra=shown("no limit"))
    tool_timeout: float = Field(120.0, gt=0, description="seconds per terminal command")
    request_timeout: float = Field(600.0, gt=0, description="seconds per model request")
    max_retries: int = Field(5, ge=0, le=10_000, description="retries per model request on 429/5xx/timeouts")
    seed: int = Field(0, ge=-(1 << 63), le=(1 << 63) - 1, description="seed of toolset sampling")
    skip_invalid: bool = Field(False, description="skip (and count) invalid dataset lines instead of refusing to start")
    keep_no_reasoning: bool = Field(False, description="keep samples with no reasoning (dropped by default)")
    keep_workspaces: bool = Field(False, description="keep each sample's workspace directory after it ends")
    retry_sandbox_limits: bool = Field(False, description="retry in-run a sample that hit its memory, /tmp, /dev/shm "
                                       "or disk limit (it would most likely hit it again)")
    sandbox: Annotated[str, OneOf(backend_choices)] = Field(AUTO, description="{choices}")
    # egress: own network namespace, internet only (sandbox/network.py); "on" is the old name of host.
    sandbox_network: Annotated[str, OneOf(network_choices, network_help)] = Field(AUTO, description="{choices}")
    network: NetworkConfig = Field(default_factory=NetworkConfig, json_schema_extra=FILE_ONLY)
    sandbox_memory: str = Field("4g", pattern=SIZE_PATTERN,
                                description="memory of one sample, e.g. 4g (bwrap: a cgroup); 0 turns the limit off")
    sandbox_tmp_size: str = Field("1g", pattern=SIZE_PATTERN, description="size of a sample's /tmp (tmpfs)")
    sandbox_shm_size: str = Field("256m", pattern=SIZE_PATTERN, description="size of a sample's /dev/shm")
    sandbox_disk: str = Field("10g", pattern=SIZE_PATTERN,
                              description="bytes a sample may write to its workspace, e.g. 10g (a disk of its own, "
                              "as root); 0 turns the disk off")
    sandbox_cpu_seconds: int | None = Field(600, ge=1, le=10**7, description="CPU seconds per process of a command")
    sandbox_cpus: float | None = Field(1.0, gt=0, le=4096,
                                       description="CPUs one sample may keep busy (cgroup CPU quota)")
    max_sandboxes: int = Field(16, ge=1, le=100_000, description="containers being created at once")
    sandbox_nproc: int = Field(512, ge=16, le=PID_MAX, description="processes of one bwrap sample (enforced as root)")
    container_engine: Literal["auto", "podman", "docker"] = Field(
        "auto", description="{choices}: engine of the container sandbox")
    container_image: str | None = Field(None, description="image of --sandbox container rows without an image",
                                        json_schema_extra=FILE_ONLY)
    container_memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$",
                                         description="memory limit per container (default: sandbox_memory)",
                                         json_schema_extra=FILE_ONLY)
    container_pids_limit: int = Field(1024, ge=16, le=PID_MAX, description="processes per container",
                                      json_schema_extra=FILE_ONLY)
    container_cpus: float | None = Field(None, gt=0, description="CPUs per container (default: sandbox_cpus)",
                                         json_schema_extra=FILE_ONLY)
    image_pull_timeout: float = Field(300.0, gt=0, description="seconds to pull one missing image",
                                      json_schema_extra=FILE_ONLY)
    local_instances: int = Field(1, ge=1, le=1_024, description="model instances of the local backend")
    fail_on_error: float = Field(1, gt=0, description="exit with code 3 when this many samples ended failed: a count "
                                 "(1, 2, ...) or a fraction of the samples (0 < x < 1)")
    executor: Annotated[str, OneOf(EXECUTORS.names)] = Field(EXECUTORS.names()[0], description="{choices}")
    ray_address: str | None = Field(None, description="Ray cluster address",
                                    json_schema_extra=shown("start a local Ray instance"))
    samples_per_prompt: int = Field(1, ge=1, le=10_000,
                                    description="independent rollouts of every dataset row, each its own sample")
    # at most samples_per_prompt (_passes_within_rollouts), so bounded like it
    stop_after_passes: int | None = Field(None, ge=1, description="start no more rollouts of a row once this many have "
                                          "passed verification", json_schema_extra=shown("run every rollout"))
    keep: Literal["all", "passed"] = Field("all",
                                           description="{choices}: which trajectories go into trajectories.jsonl")
    check_timeout: float = Field(300.0, gt=0, description="seconds a row's check command may run")
    judge_model: str | None = Field(None, min_length=1, description="model grading rows that have a rubric",
                                    json_schema_extra=shown("the run's --model"))
    judge_base_url: str | None = Field(None, min_length=1,
                                       description="OpenAI-compatible API base URL of the judge model",
                                       json_schema_extra=shown("the run's --base_url"))
    judge_api_key_env: str | None = Field(None, min_length=1,
                                          description="environment variable holding the judge endpoint's API key",
                                          json_schema_extra=shown("the run's key lookup"))
    judge_threshold: float = Field(0.5, ge=0, le=1,
                                   description="a rubric passes when the judge's score (0..1) is at least this")
    task_types: dict[str, TaskTypeConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)
    distributions: dict[str, DistributionConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)
    tools: ToolsConfig = Field(default_factory=ToolsConfig, json_schema_extra=FILE_ONLY)
    # Spend and load control (runner.budget, model.gate).
    max_cost: float | None = Field(None, gt=0, description="USD budget of the whole run (all invocations): no new "
                                   "samples once reached, exit code 4", json_schema_extra=shown("no limit"))
    max_cost_per_sample: float | None = Field(None, gt=0, description="USD per sample: a sample reaching it ends as "
                                              "partial", json_schema_extra=shown("no limit"))
    max_tokens_per_sample: int | None = Field(None, ge=1, le=1_000_000_000, description="prompt+completion tokens per "
                                              "sample: a sample reaching it ends as partial",
                                              json_schema_extra=shown("no limit"))
    adaptive_concurrency: bool = Field(True, description="true/false: adapt requests in flight to 429s and latency, up "
                                       "to --num_workers", json_schema_extra=shown("true"))
    max_requests_per_minute: float | None = Field(None, gt=0, description="model requests per minute, all calls of the "
                                                  "run (tools' included)", json_schema_extra=shown("no limit"))
    max_tokens_per_minute: float | None = Field(None, gt=0, description="model tokens per minute, all calls of the run "
                                                "(tools' included)", json_schema_extra=shown("no limit"))
    pricing: dict[str, PriceConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)

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
        return size_text(v) if info.field_name in SIZE_FIELDS else v

    @field_validator("tools")
    @classmethod
    def _tools_bounded(cls, v: ToolsConfig) -> ToolsConfig:
        check_whole_numbers(v, [])  # catalog.tools_config bounds them from below; config_checks from above
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
        return OLD_NAMES.get(v, v) if isinstance(v, str) else v  # configs written before egress keep working

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
