#!/bin/bash
# The reference fix (the instance's patch), applied as SWE-bench applies a prediction.
set -euo pipefail
cd /testbed
export GIT_CONFIG_GLOBAL=/dev/null
git apply -v /solution/patch.diff
