#!/bin/bash
set -euo pipefail
cd /app/repo
first=$(git rev-list --max-parents=0 main)
git bisect start main "$first" >/dev/null
git bisect run /app/check.sh > /tmp/bisect.out 2>&1
bad=$(sed -n 's/^\([0-9a-f]\{40\}\) is the first bad commit$/\1/p' /tmp/bisect.out)
git bisect reset >/dev/null 2>&1
test -n "$bad"
echo "$bad" > /app/bad_commit.txt
cat /app/bad_commit.txt
