#!/bin/bash
if [ "$(cat /app/reversed.txt 2>/dev/null)" = "fox brown quick the" ]; then
  echo "PASS"; echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: got '$(cat /app/reversed.txt 2>/dev/null)'"; echo 0 > /logs/verifier/reward.txt
fi
