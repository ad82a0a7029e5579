#!/bin/bash
# Verifier: runs the hidden test suite against /app and writes the reward.
mkdir -p /logs/verifier
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 1; }
export PYTHONDONTWRITEBYTECODE=1
python3 -m pytest -p no:cacheprovider -rA /tests/test_outputs.py
rc=$?
if [ "$rc" -eq 0 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
exit "$rc"
