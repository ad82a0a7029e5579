#!/bin/bash
# Builds a deterministic git history in /app in which one commit was lost by a hard reset.
set -euo pipefail
cd /app
export GIT_AUTHOR_NAME="Dana Dev" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Dev" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() { n=$((n+1)); d="2024-03-0${n}T10:00:00+00:00"; GIT_AUTHOR_DATE="$d" GIT_COMMITTER_DATE="$d" git commit -q -m "$1"; }
git init -q -b main
git config user.name "Agent"
git config user.email "agent@example.com"
cat > pricing.py <<'PY'
"""Pricing helpers for the shop."""


def subtotal(items):
    """items: iterable of (unit_price_cents, quantity)."""
    return sum(price * qty for price, qty in items)
PY
printf '# shop\n\nPricing helpers.\n' > README.md
git add pricing.py README.md && commit "Initial pricing module"
cat >> pricing.py <<'PY'


def tax(amount_cents, rate_percent):
    """Tax on amount, rounded half up to whole cents."""
    return (amount_cents * rate_percent + 50) // 100
PY
git add pricing.py && commit "Add tax calculation"
cat >> pricing.py <<'PY'


def apply_discount(amount_cents, code):
    """Apply a discount code: SAVE10 = 10% off, SAVE25 = 25% off, HALF = 50% off.

    Unknown codes leave the amount unchanged. Discounts are rounded down to whole cents.
    """
    percent = {"SAVE10": 10, "SAVE25": 25, "HALF": 50}.get(code.upper(), 0)
    return amount_cents - amount_cents * percent // 100
PY
git add pricing.py && commit "Add discount calculation"
git reset -q --hard HEAD~1
printf '# shop\n\nPricing helpers: subtotal, tax and discounts.\n\nRun the checks with `python3 -m pytest`.\n' > README.md
git add README.md && commit "Expand README"
