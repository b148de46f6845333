"""What a run says of itself: the merge into trajectories.jsonl (whole or appended) and the other
run outputs, statistics.json and its figures, the summary table, the progress line and the
monitor of spend and model traffic, and the settings each invocation used."""
