"""One sample, start to end, in whichever process runs it: the worker, its outcome, its tracing.

Below the runner and above agent/tools/sandbox: the runner schedules samples and writes what comes
back, an executor (trajforge.executors) decides where a SampleWorker runs; both import from here,
this package imports neither.
"""
