#!/bin/bash
# Reward 1 when /app/hello.txt holds exactly the greeting, else 0.
if [ -f /app/hello.txt ] && [ "$(cat /app/hello.txt)" = "Hello, world!" ]; then
  echo "PASS: /app/hello.txt holds the greeting"
  echo 1 > /logs/verifier/reward.txt
else
  echo "FAIL: /app/hello.txt is missing or wrong"
  echo 0 > /logs/verifier/reward.txt
fi
