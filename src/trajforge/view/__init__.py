"""`trajforge view`: a read-only web page over a run directory or a trajectories JSONL file.

index.py scans the files into compact entries (offsets, never conversations), summary.py and
overview.py turn entries into the list's rows and the overview's figures, conversation.py turns one
saved conversation into display turns, server.py is the web app (JSON API, static/ page), view_command.py the command.
"""
