#!/bin/bash
set -euo pipefail
mkdir -p /app/extracted
tar -xzf /app/incoming/release.tar.gz -C /app/extracted
cd /app/extracted/release
tar -xJf assets.tar.xz
# sha256sum -c prints "<path>: FAILED" or "<path>: FAILED open or read" for bad entries
sha256sum -c SHA256SUMS 2>/dev/null | sed -n 's/: FAILED\( open or read\)\{0,1\}$//p' | LC_ALL=C sort > /app/bad_files.txt || true
cat /app/bad_files.txt
