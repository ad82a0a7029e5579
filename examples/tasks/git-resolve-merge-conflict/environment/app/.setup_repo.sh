#!/bin/bash
# Builds a deterministic repo in /app that is left in the middle of a conflicted merge.
set -euo pipefail
cd /app
export GIT_AUTHOR_NAME="Dana Dev" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Dev" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() { n=$((n+1)); d="2024-04-0${n}T09:30:00+00:00"; GIT_AUTHOR_DATE="$d" GIT_COMMITTER_DATE="$d" git commit -q -m "$1"; }
git init -q -b main
git config user.name "Agent"
git config user.email "agent@example.com"
cat > greet.py <<'PY'
"""Greeting helpers."""


def greet(name):
    return "Hello, " + name + "!"
PY
printf 'from greet import greet\nprint(greet("world"))\n' > main.py
git add greet.py main.py && commit "Add greet"
git checkout -q -b feature/i18n
cat > greet.py <<'PY'
"""Greeting helpers."""

GREETINGS = {"en": "Hello", "es": "Hola", "fr": "Bonjour", "de": "Hallo"}


def greet(name, lang="en"):
    """Greet name in the given language (unknown languages fall back to English)."""
    greeting = GREETINGS.get(lang, GREETINGS["en"])
    return greeting + ", " + name + "!"
PY
git add greet.py && commit "Support greetings in several languages"
git checkout -q main
cat > greet.py <<'PY'
"""Greeting helpers."""


def greet(name):
    name = name.strip().title()
    return "Hello, " + name + "!"


def farewell(name):
    return "Goodbye, " + name.strip().title() + "."
PY
git add greet.py && commit "Normalise names and add farewell"
git merge feature/i18n >/dev/null 2>&1 || true
