#!/bin/bash
# The reference solution uses `wc -l`, which counts newlines: it misses c.txt's unterminated line,
# so its reward is partial (2 of 3 checks), as `--agent oracle` reports.
cd /app/data && for f in *; do echo "$f $(wc -l < "$f")"; done > /app/counts.txt
