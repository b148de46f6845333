"""Verification of finished samples: did the agent solve the task?

`spec` (what a row asks for, resolved against task-type defaults), `check` (a shell command in
the sample's own sandbox), `answer` (the final answer against an expected one), `judge` (a
model-graded rubric), `result` (combining the parts into the record's `verification`) and
`passk` (pass@k estimation). Everything except `check.run_check` and `judge.judge` is pure.
"""
