"""One validated run configuration: RunConfig, collected from each layer's section, and the package
that reads and checks it.

Each layer declares its own section beside its code, with each setting's default, bounds and
--help spelled there once: model/settings.py (ModelSection), tools/tool_settings.py (ToolSection),
sandbox/section.py (SandboxSection), verify/settings.py (VerifySection),
tasks/task_settings.py (TaskSection); the run's own settings are RunSection's, here. RunConfig
inherits them all, so its field names (the flag names and --config keys) stay flat, and hands each
layer the narrow settings it reads (model_settings, tool_settings, sandbox_settings,
task_settings). What a run decides at its start where the settings leave a choice open (the model
when no key is set, the sandbox and network `auto`) is one Resolved value, attached once
(RunConfig.resolve), never written back into the settings.

Beside it: sections.py (the run's nested sections and the wording of an unknown choice),
checks.py (checks of single values that a Field constraint cannot state: run name, URL, sizes,
the bounds of `tools:`), load.py (reading a YAML file and merging defaults < file < command line,
with errors that name the flag or file key). No run logic here: config imports the layers'
sections and the catalog, never their code, and the model never imports its reader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from trajforge.catalog.distributions import Distribution, all_distributions
from trajforge.catalog.executors import EXECUTORS
from trajforge.catalog.sandboxes import NetworkMode
from trajforge.catalog.tools_config import ToolsConfig
from trajforge.config.checks import CHECKED_FIELDS, SIZE_FIELDS, check_value, check_whole_numbers, whole_size
from trajforge.config.resolved import Resolved
from trajforge.config.sections import DistributionConfig, TaskTypeConfig, UnknownDistribution
from trajforge.fields import FILE_ONLY, OneOf, shown
from trajforge.model.settings import ModelSection
from trajforge.model.types import ModelSettings
from trajforge.sandbox.sandbox_settings import SandboxSettings
from trajforge.sandbox.section import SandboxSection
from trajforge.tasks.task_settings import TaskSection
from trajforge.tools.tool_settings import ToolSection, ToolSettings
from trajforge.verify.settings import VerifySection


class RunSection(BaseModel):
    """The run's own settings: its input and output, scheduling, retries, rollouts and spend."""

    model_config = ConfigDict(extra="forbid")

    # Every whole number has an upper bound (le=): one beyond 64 bits crashed the run after it began.
    dataset_file: Path | None = Field(None, description="JSONL dataset path (or --tasks)",
                                      json_schema_extra=shown("required"))
    # Harbor-format task directories instead of a dataset (trajforge.tasks); exclusive with dataset_file.
    tasks: Path | None = Field(None, description="Harbor-format task directory, or a directory of them, instead of "
                               "--dataset_file", json_schema_extra=shown("none"))
    batch_size: int | None = Field(None, ge=1, le=1_000_000,
                                   description="prompts per batch: one batch_N.jsonl per batch")
    run_name: str | None = Field(None, min_length=1, description="run name: output goes to <output_dir>/<run_name>/")
    distribution: str = Field("default", description="toolset distribution to sample from (see --list_distributions)")
    max_turns: int = Field(10, ge=1, le=10_000, description="max tool-calling iterations per prompt")
    num_workers: int = Field(4, ge=1, le=100_000, description="agent sessions in flight at once")
    resume: bool = Field(False, description="resume the run: skip finished samples, retry failed ones")
    overwrite: bool = Field(False, description="delete the run's own files (batch files, trajectories, checkpoint, "
                            "statistics, config, kept workspaces) and start over; other files in its directory stay")
    verbose: bool = Field(False, description="log every step of every sample, and print the resolved configuration")
    max_samples: int | None = Field(None, ge=1, le=1_000_000_000,
                                    description="only the first N valid samples of the dataset",
                                    json_schema_extra=shown("all"))
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
    seed: int = Field(0, ge=-(1 << 63), le=(1 << 63) - 1, description="seed of toolset sampling")
    skip_invalid: bool = Field(False, description="skip (and count) invalid dataset lines instead of refusing to start")
    keep_no_reasoning: bool = Field(False, description="keep samples with no reasoning (dropped by default)")
    retry_sandbox_limits: bool = Field(False, description="retry in-run a sample that hit its memory, /tmp, /dev/shm "
                                       "or disk limit (it would most likely hit it again)")
    fail_on_error: float = Field(1, gt=0, description="exit with code 3 when this many samples ended failed: a count "
                                 "(1, 2, ...) or a fraction of the samples (0 < x < 1)")
    executor: Annotated[str, OneOf(EXECUTORS.names, outside=EXECUTORS.outside)] = Field(EXECUTORS.names()[0],
                                                                                        description="{choices}")
    ray_address: str | None = Field(None, description="Ray cluster address",
                                    json_schema_extra=shown("start a local Ray instance"))
    samples_per_prompt: int = Field(1, ge=1, le=10_000,
                                    description="independent rollouts of every dataset row, each its own sample")
    # at most samples_per_prompt (_passes_within_rollouts), so bounded like it
    stop_after_passes: int | None = Field(None, ge=1, description="start no more rollouts of a row once this many have "
                                          "passed verification", json_schema_extra=shown("run every rollout"))
    keep: Literal["all", "passed", "untampered", "passed_untampered"] = Field(
        "all", description="{choices}: which trajectories go into trajectories.jsonl (untampered: no task "
        "sample whose agent changed what its tests depend on, verification.tampered)")
    task_types: dict[str, TaskTypeConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)
    distributions: dict[str, DistributionConfig] = Field(default_factory=dict, json_schema_extra=FILE_ONLY)
    # Spend control (runner.budget, agent.limits); the model gate's limits are the model section's.
    max_cost: float | None = Field(None, gt=0, description="USD budget of the whole run (all invocations): no new "
                                   "samples once reached, exit code 4", json_schema_extra=shown("no limit"))
    max_cost_per_sample: float | None = Field(None, gt=0, description="USD per sample: a sample reaching it ends as "
                                              "partial", json_schema_extra=shown("no limit"))
    max_tokens_per_sample: int | None = Field(None, ge=1, le=1_000_000_000, description="prompt+completion tokens per "
                                              "sample: a sample reaching it ends as partial",
                                              json_schema_extra=shown("no limit"))


class RunConfig(TaskSection, VerifySection, SandboxSection, ToolSection, ModelSection, RunSection):
    """Every setting of a run: the sections of every layer (bases listed last come first in
    --help). Field names are the flag names (those of the reference's batch_runner.py), and each
    flag's --help is its field's description (cli/run.py builds the flags from the fields:
    `{choices}` stands for the field's allowed values, FILE_ONLY marks a key with no flag).

    Immutable once validated; what the run decides later is its Resolved value (`resolve`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    _resolved: Resolved | None = PrivateAttr(None)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, v: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads True as 1; `max_turns: yes` in a config file is a mistake.
        if isinstance(v, bool) and info.field_name in _number_fields(cls):
            raise ValueError(f"must be a number, not {str(v).lower()}")
        return v

    @field_validator(*CHECKED_FIELDS, mode="before")
    @classmethod
    def _checked(cls, v: Any, info: ValidationInfo) -> Any:
        check_value(info.field_name or "", v)  # a path, URL or size that could only fail (or harm) later
        return whole_size(v) if info.field_name in SIZE_FIELDS else v

    @field_validator("tools")
    @classmethod
    def _tools_bounded(cls, v: ToolsConfig) -> ToolsConfig:
        check_whole_numbers(v, [])  # catalog.tools_config bounds them from below; config.checks from above
        return v

    @field_validator("fail_on_error")
    @classmethod
    def _count_or_fraction(cls, v: float) -> float:
        if v >= 1 and v != int(v):
            raise ValueError("must be a whole count of samples (1, 2, ...) or a fraction between 0 and 1")
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

    def resolve(self, resolved: Resolved) -> RunConfig:
        """This configuration with what the run decided at its start (made once, by the preflight)."""
        decided = self.model_copy()
        decided._resolved = resolved
        return decided

    @property
    def resolved(self) -> Resolved:
        """What the run decided where its settings leave a choice open; before the preflight
        decided, the settings as given (`auto` still open)."""
        return self._resolved or Resolved(self.model, self.sandbox, self.sandbox_network)

    def model_settings(self, model: str | None = None) -> ModelSettings:
        return ModelSection.model_settings(self, model or self.resolved.model)

    def agent_model_settings(self, model: str | None = None) -> ModelSettings:
        return ModelSection.agent_model_settings(self, model or self.resolved.model)

    def sandbox_settings(self, *, backend: str | None = None, network: str | None = None,
                         run_name: str | None = None) -> SandboxSettings:
        decided = self.resolved
        return SandboxSection.sandbox_settings(self, backend=backend or decided.backend,
                                               network=network or decided.network,
                                               run_name=self.run_name or "" if run_name is None else run_name)

    def tool_settings(self) -> ToolSettings:
        return ToolSection.tool_settings(self, self.model_settings(), tuple(self.network.allow),
                                         fetch_model_urls=self.resolved.network != NetworkMode.NONE)

    def masked(self) -> dict[str, Any]:
        """The configuration as config.json keeps it: JSON-able, the API key masked, and what the
        run decided (the model, sandbox and network `auto` and a missing key left open) in place of
        what it was asked."""
        data = self.model_dump(mode="json")
        if self.api_key is not None:
            data["api_key"] = "***"
        if self._resolved is not None:
            data |= {"model": self._resolved.model, "sandbox": self._resolved.backend,
                     "sandbox_network": str(self._resolved.network)}
        return data


def _number_fields(cls: type[BaseModel]) -> frozenset[str]:
    """The fields whose values are numbers (int or float, optional or not)."""
    found = _NUMBERS.get(cls)
    if found is None:
        found = _NUMBERS[cls] = frozenset(
            name for name, f in cls.model_fields.items()
            if {t for t in (get_args(f.annotation) or (f.annotation,)) if t is not type(None)} <= {int, float})
    return found


_NUMBERS: dict[type[BaseModel], frozenset[str]] = {}
