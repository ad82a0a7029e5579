#!/bin/bash
# SWE-bench evaluation of pypa__packaging-687 (written by sandfleet; graded by the swebench package)
set -uo pipefail
cd /testbed
export GIT_CONFIG_GLOBAL=/dev/null
( for f in tests/test_markers.py; do if git cat-file -e b5fb64e37d8b09efa1154ee249165bf7763981ef:"$f" 2>/dev/null; then git checkout -q b5fb64e37d8b09efa1154ee249165bf7763981ef -- "$f" || exit 1; else rm -f -- "$f"; fi; done ) || { echo ">>>>> Reset Failed"; exit 1; }
git apply -v /tests/test.patch || { echo ">>>>> Patch Apply Failed"; exit 1; }
echo ">>>>> Start Test Output"
python -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_markers.py
SWEBENCH_TEST_EXIT_CODE=$?
echo "$SWEBENCH_TEST_EXIT_CODE" > /logs/verifier/test-exit-code
echo ">>>>> End Test Output"
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
( for f in tests/test_markers.py; do if git cat-file -e b5fb64e37d8b09efa1154ee249165bf7763981ef:"$f" 2>/dev/null; then git checkout -q b5fb64e37d8b09efa1154ee249165bf7763981ef -- "$f" || exit 1; else rm -f -- "$f"; fi; done ) || true
