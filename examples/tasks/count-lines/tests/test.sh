#!/bin/bash
# One check per expected line of /app/counts.txt; reward = the share of checks passed.
expected=("a.txt 3" "b.txt 2" "c.txt 1")
passed=0
for i in "${!expected[@]}"; do
  got=$(sed -n "$((i + 1))p" /app/counts.txt 2>/dev/null)
  if [ "$got" = "${expected[$i]}" ]; then
    echo "ok   line $((i + 1)): $got"; passed=$((passed + 1))
  else
    echo "FAIL line $((i + 1)): expected '${expected[$i]}', got '$got'"
  fi
done
total=${EXPECTED_FILES:-3}
reward=$(( passed * 1000 / total ))
printf '{"reward": %d.%03d, "checks_passed": %d, "checks_total": %d}\n' $((reward / 1000)) $((reward % 1000)) \
  "$passed" "$total" > /logs/verifier/reward.json
