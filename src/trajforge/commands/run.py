"""`trajforge run`: the run flags (SPEC section 2) -> one validated RunConfig -> the runner.

The flags and their parsing are shared by the commands that start a run: `trajforge run`,
`python batch_runner.py` (trajforge.cli) and `trajforge scheduler` (commands.cluster). The
command layer chooses the executor (trajforge.executors) and hands it to the runner.
"""

from __future__ import annotations

import argparse
from typing import Any

from trajforge import __version__
from trajforge.cmdline import Flag, Parser, add_flags, parse_flags
from trajforge.config import RunConfig
from trajforge.config_checks import run_name_problem
from trajforge.config_load import build_config
from trajforge.errors import UsageError

# (flag, kind, help). kind: "str" | "int" | "float" | "bool" | "path" | "csv". Defaults come from RunConfig.
FLAGS: list[Flag] = [
    ("dataset_file", "path", "JSONL dataset path (or --tasks)"),
    ("tasks", "path", "Harbor-format task directory, or a directory of them, instead of --dataset_file"),
    ("agent", "str", "model, or oracle: run each task's solution/solve.sh instead of a model"),
    ("pass_threshold", "float", "a task passes when its reward is at least this"),
    ("timeout_multiplier", "float", "scales every task's agent, verifier and build timeouts"),
    ("task_max_cpus", "float", "cap on the CPUs a task's [environment] asks for"),
    ("task_max_memory", "str", "cap on the memory a task's [environment] asks for (e.g. 8g)"),
    ("task_max_storage", "str", "cap on the storage a task's [environment] asks for (e.g. 20g)"),
    ("batch_size", "int", "prompts per batch: one batch_N.jsonl per batch"),
    ("run_name", "str", "run name: output goes to <output_dir>/<run_name>/"),
    ("distribution", "str", "toolset distribution to sample from (see --list_distributions)"),
    ("model", "str", "model name; 'local' or 'local:/path/model.gguf' runs a GGUF model in-process"),
    ("base_url", "str", "OpenAI-compatible API base URL"),
    ("api_key", "str", "API key for the model"),
    ("max_turns", "int", "max tool-calling iterations per prompt"),
    ("num_workers", "int", "agent sessions in flight at once"),
    ("parallelism", "int", "same as --num_workers"),
    ("resume", "bool", "resume the run: skip finished samples, retry failed ones"),
    ("overwrite", "bool", "delete an existing run directory of this name and start over"),
    ("verbose", "bool", "log every step of every sample, and print the resolved configuration"),
    ("max_samples", "int", "only the first N valid samples of the dataset"),
    ("max_tokens", "int", "max tokens per model response"),
    ("temperature", "float", "sampling temperature of the agent's model calls, 0-2 (sent only when set)"),
    ("top_p", "float", "nucleus sampling of the agent's model calls, above 0 and at most 1 (sent only when set)"),
    ("providers_allowed", "csv", "comma-separated providers allowed (OpenRouter routing)"),
    ("providers_ignored", "csv", "comma-separated providers to ignore (OpenRouter routing)"),
    ("providers_order", "csv", "comma-separated preferred provider order (OpenRouter routing)"),
    ("provider_sort", "str", "sort providers by: price, throughput or latency"),
    ("reasoning_effort", "str", "none, minimal, low, medium, high or xhigh"),
    ("reasoning_disabled", "bool", "disable reasoning/thinking tokens entirely"),
    ("ephemeral_system_prompt", "str", "system prompt used at run time but never saved"),
    ("log_prefix_chars", "int", "characters shown in log previews"),
    ("prefill_messages_file", "path", "JSON file with a list of {role, content} few-shot messages"),
    ("list_distributions", "bool", "print every distribution and exit"),
    ("config", "path", "YAML config file; command-line flags override it"),
    ("output_dir", "path", "parent directory of run directories"),
    ("timeout", "float", "working seconds per sample before it is killed (waits for the model gate, a "
                         "Retry-After, rate budgets, retry backoff and its sandbox do not count)"),
    ("sample_wall_timeout", "float", "wall-clock seconds per sample before it is killed, waits included"),
    ("tool_timeout", "float", "seconds per terminal command"),
    ("request_timeout", "float", "seconds per model request"),
    ("max_retries", "int", "retries per model request on 429/5xx/timeouts"),
    ("seed", "int", "seed of toolset sampling"),
    ("skip_invalid", "bool", "skip (and count) invalid dataset lines instead of refusing to start"),
    ("keep_no_reasoning", "bool", "keep samples with no reasoning (dropped by default)"),
    ("keep_workspaces", "bool", "keep each sample's workspace directory after it ends"),
    ("retry_sandbox_limits", "bool", "retry in-run a sample that hit its memory, /tmp, /dev/shm or disk limit "
                                     "(it would most likely hit it again)"),
    ("sandbox", "str", "auto, local, bwrap or container"),
    ("sandbox_network", "str", "auto, egress (internet only), host or none: network of bwrap/container sandboxes"),
    ("max_sandboxes", "int", "containers being created at once"),
    ("container_engine", "str", "auto, podman or docker: engine of the container sandbox"),
    ("local_instances", "int", "model instances of the local backend"),
    ("samples_per_prompt", "int", "independent rollouts of every dataset row, each its own sample"),
    ("stop_after_passes", "int", "start no more rollouts of a row once this many have passed verification"),
    ("keep", "str", "all or passed: which trajectories go into trajectories.jsonl"),
    ("check_timeout", "float", "seconds a row's check command may run"),
    ("judge_model", "str", "model grading rows that have a rubric"),
    ("judge_base_url", "str", "OpenAI-compatible API base URL of the judge model"),
    ("judge_api_key_env", "str", "environment variable holding the judge endpoint's API key"),
    ("judge_threshold", "float", "a rubric passes when the judge's score (0..1) is at least this"),
    ("fail_on_error", "float", "exit with code 3 when this many samples ended failed: a count (1, 2, ...) "
                               "or a fraction of the samples (0 < x < 1)"),
    ("executor", "str", "local or ray"),
    ("ray_address", "str", "Ray cluster address"),
    ("max_cost", "float", "USD budget of the whole run (all invocations): no new samples once reached, exit code 4"),
    ("max_cost_per_sample", "float", "USD per sample: a sample reaching it ends as partial"),
    ("max_tokens_per_sample", "int", "prompt+completion tokens per sample: a sample reaching it ends as partial"),
    ("adaptive_concurrency", "switch",
     "true/false: adapt requests in flight to 429s and latency, up to --num_workers"),
    ("max_requests_per_minute", "float", "model requests per minute, all calls of the run (tools' included)"),
    ("max_tokens_per_minute", "float", "model tokens per minute, all calls of the run (tools' included)"),
]
_FLAG_NAMES = [f for f, _, _ in FLAGS]
# Defaults that are not a plain value of RunConfig (None there means "decided at run time").
_DEFAULT_WORDS = {
    "dataset_file": "required", "tasks": "none", "task_max_cpus": "no cap", "task_max_memory": "no cap",
    "task_max_storage": "no cap", "base_url": "https://openrouter.ai/api/v1, or the local model when no API key is set",
    "api_key": "$OPENROUTER_API_KEY, then $OPENAI_API_KEY", "max_samples": "all", "max_tokens": "the model's",
    "temperature": "the model's", "top_p": "the model's", "providers_allowed": "all", "providers_ignored": "none", "providers_order": "the router's",
    "provider_sort": "the router's", "reasoning_effort": "the model's", "ephemeral_system_prompt": "none",
    "prefill_messages_file": "none", "config": "none", "ray_address": "start a local Ray instance",
    "stop_after_passes": "run every rollout", "judge_model": "the run's --model",
    "judge_base_url": "the run's --base_url", "judge_api_key_env": "the run's key lookup",
    "adaptive_concurrency": "true", "max_cost": "no limit", "max_cost_per_sample": "no limit",
    "max_tokens_per_sample": "no limit", "sample_wall_timeout": "no limit", "max_requests_per_minute": "no limit", "max_tokens_per_minute": "no limit",
}


def _default_text(name: str, strict_required: bool = True) -> str:
    if name == "batch_size":
        word = "required" if strict_required else "100"
    elif name == "run_name":
        word = "required" if strict_required else "the dataset file's name without extension"
    elif name in _DEFAULT_WORDS:
        word = _DEFAULT_WORDS[name]
    else:
        field = RunConfig.model_fields.get("num_workers" if name == "parallelism" else name)
        default = field.default if field is not None else False
        word = "off" if default is False else "none" if default is None else f"{default}"
    return " (required)" if word == "required" else f" [default: {word}]"


class _HelpFormatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=40, width=100)


def make_parser(prog: str, strict_required: bool = True) -> Parser:
    parser = Parser(prog=prog, description="Run a tool-using agent over a JSONL dataset. Every flag also "
                     "accepts --flag value and --flag-name spellings.", formatter_class=_HelpFormatter,
                     argument_default=argparse.SUPPRESS)
    add_flags(parser, FLAGS, lambda name: _default_text(name, strict_required))
    parser.add_argument("--version", action="version", version=f"trajforge {__version__}")
    return parser


def parse_run_args(argv: list[str], prog: str, *, strict_required: bool,
                   file_keys: dict[str, Any] | None = None) -> tuple[RunConfig | None, dict[str, Any]]:
    """Parse run flags into a RunConfig. Returns (None, flags) for --list_distributions.

    `file_keys`: the --config file's mapping when the caller has read it already (the scheduler,
    which takes its `ray:` section out first); errors still name the file."""
    parser = make_parser(prog, strict_required)
    values = vars(parse_flags(parser, argv, FLAGS))
    config_file = values.pop("config", None)
    list_only = values.pop("list_distributions", False)
    config = build_config(values, config_file, file_keys)
    if list_only:
        return None, {"config": config}
    missing = [f for f in ("dataset_file", "batch_size", "run_name")
               if getattr(config, f) is None and (strict_required or f == "dataset_file")]
    if "dataset_file" in missing and config.tasks is not None:
        missing.remove("dataset_file")
    elif "dataset_file" in missing:
        missing[0] = "dataset_file (or --tasks)"
    if missing:
        names = ", ".join(f"--{f}" for f in missing)
        raise UsageError(f"missing required flag{'s' if len(missing) > 1 else ''} {names} "
                         f"(give {'them' if len(missing) > 1 else 'it'} on the command line or in --config)")
    derived: dict[str, Any] = {}  # validated config is never mutated: a copy carries the derived values
    if config.run_name is None:
        source = config.dataset_file or config.tasks
        assert source is not None
        derived["run_name"] = stem = source.stem if config.dataset_file else source.absolute().name
        if (problem := run_name_problem(stem)) is not None:  # `...jsonl` would make it `..`
            flag = "--dataset_file" if config.dataset_file else "--tasks"
            raise UsageError(f"the run name taken from {flag}, {stem!r}, {problem}; give --run_name")
    if config.batch_size is None:
        derived["batch_size"] = 100
    return config.model_copy(update=derived), values


def run_command(argv: list[str], prog: str, strict_required: bool) -> int:
    config, extra = parse_run_args(argv, prog, strict_required=strict_required)
    if config is None:
        from trajforge.commands.distributions import print_distributions

        return print_distributions(extra["config"])
    from trajforge.executors import make_executor
    from trajforge.runner.main import run

    return run(config, make_executor)


def main(argv: list[str]) -> int:
    return run_command(argv, "trajforge run", strict_required=False)
