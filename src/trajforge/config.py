"""One validated run configuration: defaults < YAML file (--config) < command line.

This module owns the RunConfig model, the YAML file format (flat flag-named keys plus the nested
`parallelism` / `task_types` / `distributions` sections) and turning validation failures into
messages that name the flag or file key. It holds no run logic.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from trajforge.errors import ConfigError, UsageError
from trajforge.model.pricing import Price
from trajforge.model.types import DEFAULT_MODEL, ModelSettings
from trajforge.catalog import toolset_names
from trajforge.catalog.distributions import Distribution, all_distributions
from trajforge.catalog.settings import ToolsSettings

ProviderSort = Literal["price", "throughput", "latency"]
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]
SIZE_PATTERN = r"^[0-9]+(\.[0-9]+)?[bkmgtBKMGT]?$"
_UNITS = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_bytes(text: str) -> int:
    """'4g' -> 4 GiB in bytes ('4' alone is bytes), the unit letters of docker/podman --memory."""
    unit = text[-1].lower() if text[-1].isalpha() else "b"
    return int(float(text.rstrip("bkmgtBKMGT") or 0) * _UNITS[unit])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class TaskTypeConfig(_Strict):
    retry_limit: int = Field(1, ge=0, description="in-run retries of a failed sample of this type")
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
                raise ValueError(_unknown_choice("toolset", name, list(toolset_names())))
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


class _UnknownDistribution(ValueError):
    """Raised by RunConfig's whole-model check; _describe pins it on the `distribution` key."""

    def __init__(self, value: str, allowed: list[str]) -> None:
        super().__init__(_unknown_choice("distribution", value, allowed))
        self.value, self.allowed = value, allowed


class RunConfig(_Strict):
    """Every setting of a run. Field names are the flag names (SPEC section 2).

    Immutable once validated: a value decided later (the sandbox `auto` resolves to, the local
    model chosen for want of a key) makes a copy with model_copy(update=...)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

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
    timeout: float | None = Field(1800.0, gt=0, description="wall-clock seconds per sample")
    tool_timeout: float = Field(120.0, gt=0, description="seconds per terminal command")
    request_timeout: float = Field(600.0, gt=0, description="seconds per model request")
    max_retries: int = Field(5, ge=0, description="attempts per model request after the first")
    seed: int = 0
    skip_invalid: bool = False
    keep_no_reasoning: bool = False
    keep_workspaces: bool = False
    sandbox: Literal["auto", "local", "bwrap", "container"] = "auto"
    # egress: own network namespace, internet only (sandbox/network.py); "on" is the old name of host.
    sandbox_network: Literal["auto", "egress", "host", "none"] = "auto"
    network: NetworkConfig = Field(default_factory=NetworkConfig)
    sandbox_memory: str = Field("4g", pattern=SIZE_PATTERN, description="memory of one sample (bwrap: cgroup)")
    sandbox_tmp_size: str = Field("1g", pattern=SIZE_PATTERN, description="size of a sample's /tmp (tmpfs)")
    sandbox_shm_size: str = Field("256m", pattern=SIZE_PATTERN, description="size of a sample's /dev/shm")
    sandbox_disk: str = Field("10g", pattern=SIZE_PATTERN, description="bytes a sample may write to its workspace")
    sandbox_cpu_seconds: int | None = Field(600, ge=1, description="CPU seconds per process of a command")
    max_sandboxes: int = Field(16, ge=1)
    sandbox_nproc: int = Field(512, ge=16, description="processes of one bwrap sample (enforced when run as root)")
    container_engine: Literal["auto", "podman", "docker"] = "auto"
    container_image: str | None = Field(None, description="image of --sandbox container rows without an image")
    container_memory: str | None = Field(None, pattern=r"^[0-9]+(\.[0-9]+)?[bkmgBKMG]?$",
                                         description="memory limit per container (default: sandbox_memory)")
    container_pids_limit: int = Field(1024, ge=16, description="processes per container")
    container_cpus: float | None = Field(None, gt=0, description="CPUs per container (default: no limit)")
    image_pull_timeout: float = Field(300.0, gt=0, description="seconds to pull one missing image")
    local_instances: int = Field(1, ge=1)
    fail_on_error: float = Field(1, gt=0, description="failed samples that make the exit code 3: a count "
                                 "(1, 2, ...) or a fraction of the samples (0 < x < 1)")
    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = None
    samples_per_prompt: int = Field(1, ge=1, le=10_000, description="independent rollouts of every row")
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
    max_tokens_per_sample: int | None = Field(None, ge=1)
    adaptive_concurrency: bool = True
    max_requests_per_minute: float | None = Field(None, gt=0)
    max_tokens_per_minute: float | None = Field(None, gt=0)
    pricing: dict[str, PriceConfig] = Field(default_factory=dict)

    @field_validator("batch_size", "max_turns", "num_workers", "max_samples", "max_tokens", "log_prefix_chars",
                     "timeout", "tool_timeout", "request_timeout", "max_retries", "seed", "max_sandboxes",
                     "sandbox_nproc", "container_pids_limit", "container_cpus", "image_pull_timeout",
                     "local_instances", "samples_per_prompt", "stop_after_passes", "check_timeout",
                     "judge_threshold", "max_cost", "max_cost_per_sample", "max_tokens_per_sample",
                     "max_requests_per_minute", "max_tokens_per_minute", "fail_on_error", "sandbox_cpu_seconds",
                     mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any) -> Any:
        # pydantic's lax mode reads True as 1; `max_turns: yes` in a config file is a mistake.
        if isinstance(v, bool):
            raise ValueError(f"must be a number, not {str(v).lower()}")
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
            raise _UnknownDistribution(self.distribution, list(known))
        return self

    @model_validator(mode="after")
    def _passes_within_rollouts(self) -> RunConfig:
        if self.stop_after_passes is not None and self.stop_after_passes > self.samples_per_prompt:
            raise ValueError(f"--stop_after_passes ({self.stop_after_passes}) must be at most "
                             f"--samples_per_prompt ({self.samples_per_prompt})")
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
            pricing={name: Price(p.prompt, p.completion, p.cached_prompt) for name, p in self.pricing.items()},
        )

    def masked(self) -> dict[str, Any]:
        """The resolved configuration as JSON-able data with the API key masked."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = "***"
        return data


def _suggest(value: str, allowed: list[str]) -> str:
    """'; did you mean 'x'? (allowed: a, b)': the closest name first, for typos."""
    close = difflib.get_close_matches(value, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{hint} (allowed: {', '.join(allowed)})"


def _unknown_choice(what: str, value: str, allowed: list[str]) -> str:
    return f"unknown {what} {value!r}{_suggest(value, allowed)}"


_NESTED_PARALLELISM = {"max_workers": "num_workers", "batch_size": "batch_size", "timeout": "timeout",
                       "samples_per_prompt": "samples_per_prompt"}
# Pydantic error types -> what is allowed, in words a user of the command line understands.
_PLAIN = {"int_parsing": "must be a whole number", "int_type": "must be a whole number",
          "int_from_float": "must be a whole number", "float_parsing": "must be a number",
          "float_type": "must be a number", "string_type": "must be a string", "bool_parsing": "must be true or false",
          "bool_type": "must be true or false", "dict_type": "must be a mapping", "model_type": "must be a mapping",
          "list_type": "must be a list", "path_type": "must be a path", "string_too_short": "must not be empty"}
_BOUNDS = {"greater_than_equal": "at least", "greater_than": "greater than", "less_than_equal": "at most",
           "less_than": "less than"}


def load_yaml_mapping(path: Path) -> dict[Any, Any]:
    """A YAML file whose top level is a mapping (empty file: {}); errors name the file."""
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
    return raw


def _read_yaml(path: Path, raw: dict[Any, Any] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """Flat RunConfig keys, and for each the key as written in the file (for error messages).
    `raw`: the file's mapping when the caller has read it already."""
    raw = load_yaml_mapping(path) if raw is None else raw
    flat: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, value in raw.items():
        key = str(key).replace("-", "_")
        if key == "parallelism" and not isinstance(value, dict):
            flat["num_workers"], origin["num_workers"] = value, key  # flat form of the --parallelism flag
        elif key == "parallelism":
            for sub, v in value.items():
                if sub not in _NESTED_PARALLELISM:
                    allowed = [f"parallelism.{k}" for k in _NESTED_PARALLELISM]
                    raise ConfigError(f"{path}: {_unknown_choice('key', f'parallelism.{sub}', allowed)}")
                flat[_NESTED_PARALLELISM[sub]], origin[_NESTED_PARALLELISM[sub]] = v, f"parallelism.{sub}"
        elif key in RunConfig.model_fields:
            flat[key], origin[key] = value, key
        else:
            allowed = [*RunConfig.model_fields, "parallelism"]
            raise ConfigError(f"{path}: {_unknown_choice('key', key, allowed)}")
    return flat, origin


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file into flat RunConfig keys; errors name the file and key."""
    return _read_yaml(path)[0]


def build_config(cli_values: dict[str, Any], config_file: Path | None = None,
                 file_keys: dict[str, Any] | None = None) -> RunConfig:
    """Merge defaults < YAML < CLI and validate; errors name the flag (or file key) and value.

    `cli_values` may hold `parallelism`, the alias of `num_workers`; errors then name --parallelism.
    """
    file_values, origin = _read_yaml(config_file, file_keys) if config_file else ({}, {})
    cli = dict(cli_values)
    flags = {k: f"--{k}" for k in cli}
    if "parallelism" in cli:
        workers = cli.pop("parallelism")
        if "num_workers" in cli and cli["num_workers"] != workers:
            raise UsageError(f"--parallelism={workers} and --num_workers={cli['num_workers']} disagree; give one")
        cli["num_workers"] = workers
        flags["num_workers"] = "--parallelism"
    try:
        return RunConfig.model_validate({**file_values, **cli})
    except ValidationError as e:
        raise UsageError(_describe(e, flags, config_file, origin)) from None


def _describe(e: ValidationError, flags: dict[str, str], config_file: Path | None, origin: dict[str, str]) -> str:
    """One line per problem: `--flag: invalid value V: what is allowed`, or `file: key 'k': ...`."""
    lines = []
    for err in e.errors():
        parts = [str(p) for p in err["loc"]]
        msg, value = err["msg"].removeprefix("Value error, "), err.get("input")
        exc = err.get("ctx", {}).get("error")
        if not parts and isinstance(exc, _UnknownDistribution):
            parts, value, msg = ["distribution"], exc.value, "no such distribution" + _suggest(exc.value, exc.allowed)
        if not parts:
            lines.append(msg)
            continue
        top = parts[0]
        if "expected" in err.get("ctx", {}):
            choices = re.findall(r"'([^']*)'", err["ctx"]["expected"])
            close = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
            msg = f"must be one of {err['ctx']['expected']}" + (f"; did you mean {close[0]!r}?" if close else "")
        elif err["type"] in _BOUNDS:
            bound = next(iter(err["ctx"].values()))
            msg = f"must be {_BOUNDS[err['type']]} {f'{bound:g}' if isinstance(bound, float) else bound}"
        else:
            msg = _PLAIN.get(err["type"], msg)
        if top in flags:
            where = flags[top]
        elif config_file is not None:
            where = f"{config_file}: key '{'.'.join([origin.get(top, top), *parts[1:]])}'"
        else:
            where = f"--{top}"
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key")
        elif err["type"] == "missing":
            lines.append(f"{where}: missing")
        else:
            shown = "***" if top == "api_key" else repr(value)
            lines.append(f"{where}: invalid value {shown}: {msg}")
    return "\n".join(lines)
