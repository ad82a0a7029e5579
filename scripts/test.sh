#!/usr/bin/env bash
# The whole test suite: lint, types, the fast suite, then the slow suite (separate target).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check src tests
echo "== mypy"; mypy
# the layers of docs/architecture.md (pyproject's [tool.importlinter]); a broken one names the import
echo "== lint-imports"; lint-imports --no-cache
echo "== pytest (fast)"; pytest -q -m "not slow and not chaos and not model and not rl" "$@"
echo "== pytest (slow)"; pytest -q -m "(slow or chaos) and not model and not rl" "$@"
