#!/bin/bash
set -euo pipefail
cd /app/site
find . -type f -name '*.tmp' ! -newermt '2024-01-01 00:00:00 UTC' -delete
find . -type f -name '*.sh' -exec chmod 0755 {} +
find . -perm -o=w -exec chmod o-w {} +
find . -type f -size +10240c -printf '%P\n' | LC_ALL=C sort > /app/large_files.txt
cat /app/large_files.txt
