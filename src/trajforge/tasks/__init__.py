"""Harbor-format task environments (`--tasks PATH`): trajforge's second input format.

A task is a container image with a starting state, an instruction, hidden tests that write a
reward, and optionally a reference solution. The package: `load` (PATH -> Samples, each with its
TaskSpec: trajforge.task_spec, a leaf below this package and the dataset that both use it), `environment` (one image per distinct build context, cached by content
hash), `run` (a task sample's parts for the sample worker: its container with its limits, the
agent's time limit), `verify` and `reward` (the hidden tests, run after the agent with nothing it
left able to count), `oracle` (`--agent oracle`) and `task_settings` (what the run hands down). The
trajectory written for the tests is agent.atif's. The package speaks to sandboxes only through
sandbox/interface.py: an ImageSandbox (the runner's own operations on a sample's container) and
the ImageStore of the backend that runs images.
"""
