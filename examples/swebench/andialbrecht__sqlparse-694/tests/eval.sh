#!/bin/bash
# SWE-bench evaluation of andialbrecht__sqlparse-694 (written by sandfleet; graded by the swebench package)
set -uo pipefail
cd /testbed
export GIT_CONFIG_GLOBAL=/dev/null
( for f in tests/test_grouping.py; do if git cat-file -e c03677235fe67a265bf237fd9f1b9537fc15fbc5:"$f" 2>/dev/null; then git checkout -q c03677235fe67a265bf237fd9f1b9537fc15fbc5 -- "$f" || exit 1; else rm -f -- "$f"; fi; done ) || { echo ">>>>> Reset Failed"; exit 1; }
git apply -v /tests/test.patch || { echo ">>>>> Patch Apply Failed"; exit 1; }
echo ">>>>> Start Test Output"
python -m pytest --no-header -rA --tb=no -p no:cacheprovider tests/test_grouping.py
SWEBENCH_TEST_EXIT_CODE=$?
echo "$SWEBENCH_TEST_EXIT_CODE" > /logs/verifier/test-exit-code
echo ">>>>> End Test Output"
echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"
( for f in tests/test_grouping.py; do if git cat-file -e c03677235fe67a265bf237fd9f1b9537fc15fbc5:"$f" 2>/dev/null; then git checkout -q c03677235fe67a265bf237fd9f1b9537fc15fbc5 -- "$f" || exit 1; else rm -f -- "$f"; fi; done ) || true
