"""The subcommands that have no package of their own: run, distributions, validate, scheduler, worker.

Each is one module with `main(argv) -> exit code`, registered by one line in trajforge.cli's
SUBCOMMANDS; all build their flags with trajforge.cmdline.
"""
