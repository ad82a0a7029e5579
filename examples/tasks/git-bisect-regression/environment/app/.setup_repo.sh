#!/bin/bash
# Builds a deterministic 24-commit history in /app/repo; one commit introduces a regression.
set -euo pipefail
mkdir -p /app/repo && cd /app/repo
export GIT_AUTHOR_NAME="Dana Dev" GIT_AUTHOR_EMAIL="dana@example.com"
export GIT_COMMITTER_NAME="Dana Dev" GIT_COMMITTER_EMAIL="dana@example.com"
n=0
commit() { n=$((n+1)); d=$(printf '2024-05-%02dT12:00:00+00:00' "$n"); GIT_AUTHOR_DATE="$d" GIT_COMMITTER_DATE="$d" git commit -q -m "$1"; }
git init -q -b main
git config user.name "Agent"
git config user.email "agent@example.com"
cat > slugify.py <<'PY'
import re
import unicodedata


def slugify(text, sep="-"):
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^A-Za-z0-9]+", sep, text).strip(sep)
    return text.lower()
PY
printf '# slugs\n' > README.md
printf 'Changelog\n' > CHANGELOG
git add . && commit "Initial import"
for i in $(seq 2 24); do
  echo "- change $i" >> CHANGELOG
  case $i in
    4) printf '\ndef is_slug(s):\n    return s == slugify(s)\n' >> slugify.py ;;
    7) printf 'Use slugify(text) to build URL slugs.\n' >> README.md ;;
    11) sed -i 's/\[^A-Za-z0-9\]+/[^A-Za-z]+/' slugify.py
        sed -i '1i """Helpers for building URL slugs."""' slugify.py ;;
    15) printf '\ndef join_slugs(*parts, sep="-"):\n    return sep.join(slugify(p, sep) for p in parts if p)\n' >> slugify.py ;;
    19) printf '\nLicensed under MIT.\n' >> README.md ;;
  esac
  git add . && commit "Update slug helpers ($i)"
done
