#!/bin/bash
set -euo pipefail
cd /app
# Find the lost commit in the reflog and cherry-pick it onto main.
lost=$(git log -g --format='%H %s' HEAD | awk '$0 ~ / Add discount calculation$/ {print $1; exit}')
test -n "$lost"
git cherry-pick "$lost"
git log --oneline
