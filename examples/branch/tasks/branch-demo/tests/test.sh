#!/bin/bash
# 1 when the prefix's notes are there, the children folder holds exactly one file (a child
# saw no sibling's write) and the answer is 42.
mkdir -p /logs/verifier
if grep -qx prefix-two /app/prefix.txt 2>/dev/null && [ "$(ls /app/children 2>/dev/null | wc -l)" -eq 1 ] \
   && [ "$(cat /app/answer.txt 2>/dev/null)" = 42 ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
