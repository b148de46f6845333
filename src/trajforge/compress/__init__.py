"""The trajectory compressor (docs/user-guide.md, "Trajectory compressor"): fit saved trajectories into a training token budget.

Entry points: `trajforge.cli.compress.main(argv)` (both `trajforge compress` and the root
`trajectory_compressor.py`), and `trajforge.compress.pipeline.run(Options, CompressionConfig)`.
Module map: config (YAML + overrides), tokenize (offline token counts), select (which turns to
summarise, pure), summarize (model calls), compressor (one trajectory), sampling, records (input
files), resume (durable output + checkpoints), metrics, progress, dryrun, pipeline (the run).
"""
