#!/bin/bash
set -euo pipefail
cd /app
cat > greet.py <<'PY'
"""Greeting helpers."""

GREETINGS = {"en": "Hello", "es": "Hola", "fr": "Bonjour", "de": "Hallo"}


def greet(name, lang="en"):
    """Greet name in the given language (unknown languages fall back to English)."""
    name = name.strip().title()
    greeting = GREETINGS.get(lang, GREETINGS["en"])
    return greeting + ", " + name + "!"


def farewell(name):
    return "Goodbye, " + name.strip().title() + "."
PY
git add greet.py
git -c core.editor=true commit -q --no-edit
git log --oneline --graph
