"""Harbor-format task environments (`--tasks PATH`): trajforge's second input format.

A task is a container image with a starting state, an instruction, hidden tests that write a
reward, and optionally a reference solution. The package: `spec` (task.toml -> TaskSpec),
`load` (PATH -> Samples), `environment` (one image per distinct build context, cached by content
hash), `sandbox` (the task's container with its limits), `verify` and `reward` (the hidden tests,
run after the agent with nothing it left able to count), `oracle` (`--agent oracle`), `atif`
(the trajectory written for the tests), and `settings` (what the run hands down).
"""
