"""`trajforge view`: a read-only web page over a run directory or a trajectories JSONL file.

index.py reads the files, a slice at a time, into columns.py's arrays (offsets and a few numbers
a record, never conversations); lookup.py answers from them and reads the checkpoint and the lock;
dataset.py finds the run's dataset rows; summary.py and overview.py turn them into the list's rows
and the overview's figures; conversation.py turns one saved conversation into display turns;
server.py is the web app (JSON API, static/ page); the command is trajforge.cli.view.
"""
