"""Command line: flags (SPEC section 2) -> one validated RunConfig -> the runner. No run logic here.

Every flag accepts `--a_b=v`, `--a_b v` and `--a-b v`. Errors are one line naming the flag, the
value and what is allowed, with exit code 2.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from trajforge import __version__, redact
from trajforge.config import RunConfig, build_config
from trajforge.errors import TrajforgeError, UsageError

# (flag, kind, help). kind: "str" | "int" | "float" | "bool" | "path" | "csv". Defaults come from RunConfig.
FLAGS: list[tuple[str, str, str]] = [
    ("dataset_file", "path", "JSONL dataset path"),
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
    ("timeout", "float", "wall-clock seconds per sample (after its sandbox is up) before it is killed"),
    ("tool_timeout", "float", "seconds per terminal command"),
    ("request_timeout", "float", "seconds per model request"),
    ("max_retries", "int", "retries per model request on 429/5xx/timeouts"),
    ("seed", "int", "seed of toolset sampling"),
    ("skip_invalid", "bool", "skip (and count) invalid dataset lines instead of refusing to start"),
    ("keep_no_reasoning", "bool", "keep samples with no reasoning (dropped by default)"),
    ("keep_workspaces", "bool", "keep each sample's workspace directory after it ends"),
    ("sandbox", "str", "auto, local, bwrap or container"),
    ("sandbox_network", "str", "on or none: network inside bwrap/container sandboxes"),
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
_SWITCH = {"true": True, "on": True, "yes": True, "1": True, "false": False, "off": False, "no": False, "0": False}


def _switch(text: str) -> bool:
    try:
        return _SWITCH[text.strip().lower()]
    except KeyError:
        raise ValueError(text) from None


_PARSERS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "path": Path, "str": str, "csv": str,
                                             "switch": _switch}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # "argument --batch_size/--batch-size: invalid value ..." -> "--batch_size: invalid value ...",
        # the same shape as the errors RunConfig validation produces.
        message = re.sub(r"^argument (--[\w-]+)(?:/--[\w-]+)*: ", r"\1: ", message)
        self.exit(2, f"{self.prog}: error: {message}\n")


def typed(kind: str, flag: str) -> Callable[[str], Any]:
    """An argparse `type` for int/float/path/str values whose error names what is allowed."""
    convert = _PARSERS[kind]
    allowed = {"int": "a whole number", "float": "a number", "switch": "true or false"}.get(kind, "a value")

    def parse(text: str) -> Any:
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: must be {allowed}") from None

    parse.__name__ = flag
    return parse


# Defaults that are not a plain value of RunConfig (None there means "decided at run time").
_DEFAULT_WORDS = {
    "dataset_file": "required", "base_url": "https://openrouter.ai/api/v1, or the local model when no API key is set",
    "api_key": "$OPENROUTER_API_KEY, then $OPENAI_API_KEY", "max_samples": "all", "max_tokens": "the model's",
    "providers_allowed": "all", "providers_ignored": "none", "providers_order": "the router's",
    "provider_sort": "the router's", "reasoning_effort": "the model's", "ephemeral_system_prompt": "none",
    "prefill_messages_file": "none", "config": "none", "ray_address": "start a local Ray instance",
    "stop_after_passes": "run every rollout", "judge_model": "the run's --model",
    "judge_base_url": "the run's --base_url", "judge_api_key_env": "the run's key lookup",
    "adaptive_concurrency": "true", "max_cost": "no limit", "max_cost_per_sample": "no limit",
    "max_tokens_per_sample": "no limit", "max_requests_per_minute": "no limit", "max_tokens_per_minute": "no limit",
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


def make_parser(prog: str, strict_required: bool = True) -> _Parser:
    parser = _Parser(prog=prog, description="Run a tool-using agent over a JSONL dataset. Every flag also "
                     "accepts --flag value and --flag-name spellings.", formatter_class=_HelpFormatter,
                     argument_default=argparse.SUPPRESS, allow_abbrev=False)
    for name, kind, help_text in FLAGS:
        opts = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
        help_text += _default_text(name, strict_required)
        if kind == "bool":
            parser.add_argument(*opts, dest=name, action="store_true", help=help_text)
        elif kind == "switch":  # `--flag` alone means true; `--flag false` turns a default-on setting off
            parser.add_argument(*opts, dest=name, type=typed(kind, name), nargs="?", const=True, metavar="BOOL",
                                help=help_text)
        else:
            parser.add_argument(*opts, dest=name, type=typed(kind, name), metavar=kind.upper(), help=help_text)
    parser.add_argument("--version", action="version", version=f"trajforge {__version__}")
    return parser


def reject_unknown(unknown: list[str], names: list[str]) -> None:
    """One clear error for the first argument argparse did not know, suggesting the closest flag."""
    for arg in unknown:
        if arg.startswith("--"):
            name = arg[2:].split("=", 1)[0]
            close = difflib.get_close_matches(name.replace("-", "_"), names, n=1)
            raise UsageError(f"unknown flag --{name}" + (f"; did you mean --{close[0]}?" if close else "; see --help"))
        raise UsageError(f"unexpected argument {arg!r}; flags look like --name=value (see --help)")


def parse_run_args(argv: list[str], prog: str, *, strict_required: bool) -> tuple[RunConfig | None, dict[str, Any]]:
    """Parse run flags into a RunConfig. Returns (None, flags) for --list_distributions."""
    parser = make_parser(prog, strict_required)
    ns, unknown = parser.parse_known_args(argv)
    reject_unknown(unknown, _FLAG_NAMES)
    values = vars(ns)
    config_file = values.pop("config", None)
    list_only = values.pop("list_distributions", False)
    config = build_config(values, config_file)
    if list_only:
        return None, {"config": config}
    missing = [f for f in ("dataset_file", "batch_size", "run_name")
               if getattr(config, f) is None and (strict_required or f == "dataset_file")]
    if missing:
        names = ", ".join(f"--{f}" for f in missing)
        raise UsageError(f"missing required flag{'s' if len(missing) > 1 else ''} {names} "
                         f"(give {'them' if len(missing) > 1 else 'it'} on the command line or in --config)")
    if config.run_name is None:
        config.run_name = config.dataset_file.stem  # type: ignore[union-attr]
    if config.batch_size is None:
        config.batch_size = 100
    return config, values


def _cmd_run(argv: list[str], prog: str, strict_required: bool) -> int:
    config, extra = parse_run_args(argv, prog, strict_required=strict_required)
    if config is None:
        return _print_distributions(extra["config"])
    from trajforge.executors import make_executor
    from trajforge.runner.main import run

    return run(config, make_executor)


def _print_distributions(config: RunConfig) -> int:
    from trajforge.tools.distributions import format_distributions

    print(format_distributions(config.all_distributions()))
    return 0


def _cmd_distributions(argv: list[str]) -> int:
    parser = _Parser(prog="trajforge distributions", description="List the toolset distributions.")
    parser.add_argument("--config", type=Path, help="YAML config file with custom distributions")
    ns = parser.parse_args(argv)
    return _print_distributions(build_config({}, ns.config))


def _cmd_validate(argv: list[str]) -> int:
    parser = _Parser(prog="trajforge validate", description="Check a dataset file and report problems.")
    parser.add_argument("--dataset_file", "--dataset-file", type=Path, required=True)
    parser.add_argument("--skip_invalid", "--skip-invalid", action="store_true")
    ns = parser.parse_args(argv)
    from trajforge.dataset import load_dataset

    ds = load_dataset(ns.dataset_file, skip_invalid=ns.skip_invalid)
    dup = len(ds.samples) - len({s.identity.split(":")[0] for s in ds.samples})
    print(f"{ns.dataset_file}: {len(ds.samples)} valid samples, {dup} duplicate prompts, "
          f"{len(ds.skipped)} invalid lines skipped")
    return 0


def _subcommands() -> dict[str, Callable[[list[str]], int]]:
    cmds: dict[str, Callable[[list[str]], int]] = {
        "run": lambda a: _cmd_run(a, "trajforge run", strict_required=False),
        "distributions": _cmd_distributions,
        "validate": _cmd_validate,
        "export": _lazy("trajforge.export.cli", "export"),
    }
    for name, target in (("doctor", "trajforge.sandbox.doctor"), ("compress", "trajforge.compress.cli"),
                         ("scheduler", "trajforge.executors.ray_cli"), ("worker", "trajforge.executors.ray_cli")):
        cmds[name] = _lazy(target, name)
    cmds["view"] = _lazy("trajforge.view.server", "view")
    return cmds


def _lazy(module: str, name: str) -> Callable[[list[str]], int]:
    def call(argv: list[str]) -> int:
        import importlib

        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise UsageError(f"'trajforge {name}' is not available: {e}") from None
        return mod.main(argv) if name != "worker" and name != "scheduler" else getattr(mod, f"{name}_main")(argv)

    return call


def _our_error(e: BaseException) -> TrajforgeError | None:
    """The TrajforgeError inside an exception group raised out of a TaskGroup, if that is all it holds."""
    if isinstance(e, TrajforgeError):
        return e
    if isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        return _our_error(e.exceptions[0])
    return None


def _run_guarded(fn: Callable[[], int], verbose: bool = False) -> int:
    """Run a command; turn our errors into `error: ...` lines and an exit code, never a traceback
    (one only with --verbose, for a bug)."""
    try:
        code = fn()
        sys.stdout.flush()
        return code
    except (TrajforgeError, BaseExceptionGroup) as caught:
        e = _our_error(caught)
        if e is None:
            return _unexpected(caught, verbose)
        text = redact.REGISTRY.text(str(e))
        if isinstance(e, UsageError):  # one problem per line, each a complete message
            text = "\nerror: ".join(text.splitlines())
        print(f"error: {text}", file=sys.stderr)
        return e.exit_code
    except SystemExit as e:  # argparse's --help, --version and usage errors: a code, for in-process callers
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`--list_distributions | head -1`): not our error. Point stdout at
        # /dev/null so the interpreter's final flush does not print a traceback, and exit like a
        # process killed by SIGPIPE would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:
        return _unexpected(e, verbose)


def _unexpected(e: BaseException, verbose: bool) -> int:
    """A bug or an unforeseen OS error: one line (the traceback only with --verbose), exit 1."""
    if verbose:
        import traceback

        text = "".join(traceback.format_exception(e))
        print(redact.REGISTRY.text(text), file=sys.stderr, end="")
    leaf = e
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    if isinstance(leaf, OSError) and leaf.filename is not None:
        what = f"{leaf.filename}: {leaf.strerror or leaf}"
    else:
        what = f"{type(leaf).__name__}: {leaf}"
    hint = "" if verbose else " (run with --verbose for the traceback)"
    print(redact.REGISTRY.text(f"error: unexpected problem: {what}{hint}"), file=sys.stderr)
    return 1


def _verbose(argv: list[str]) -> bool:
    return any(a == "--verbose" or a.startswith("--verbose=") for a in argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmds = _subcommands()
    if not argv or argv[0] in ("-h", "--help", "--version"):
        return _run_guarded(lambda: _usage(argv, cmds))
    if argv[0] not in cmds:
        if argv[0].startswith("--"):  # `trajforge --dataset_file=...` behaves like batch_runner.py
            return batch_runner_main(argv)
        close = difflib.get_close_matches(argv[0], list(cmds), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"trajforge: error: unknown command {argv[0]!r}{hint} (commands: {', '.join(cmds)})", file=sys.stderr)
        return 2
    return _run_guarded(lambda: cmds[argv[0]](argv[1:]), _verbose(argv))


def _usage(argv: list[str], cmds: dict[str, Callable[[list[str]], int]]) -> int:
    if argv and argv[0] == "--version":
        print(f"trajforge {__version__}")
        return 0
    out = sys.stdout if argv else sys.stderr
    print("usage: trajforge {" + ",".join(cmds) + "} [flags]   (trajforge run --help for run flags)", file=out)
    print("       trajforge --version", file=out)
    return 0 if argv else 2


def batch_runner_main(argv: list[str] | None = None) -> int:
    """`python batch_runner.py --flag=value ...`: the reference interface, required flags enforced."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return _run_guarded(lambda: _cmd_run(argv, "batch_runner.py", strict_required=True), _verbose(argv))
