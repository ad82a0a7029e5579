#!/bin/bash
# Usage: migrate.sh DB  -- applies pending migrations from migrations/ in order.
set -euo pipefail
db="$1"
here="$(cd "$(dirname "$0")" && pwd)"
sqlite3 "$db" "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);"
current=$(sqlite3 "$db" "SELECT COALESCE(MAX(version), 0) FROM schema_version;")
for f in "$here"/migrations/*.sql; do
  v=$(basename "$f" | cut -d_ -f1)
  v=$((10#$v))
  if [ "$v" -gt "$current" ]; then
    echo "applying $(basename "$f")"
    { echo "BEGIN;"; cat "$f"; echo "INSERT INTO schema_version VALUES ($v);"; echo "COMMIT;"; } | sqlite3 -bail "$db"
  fi
done
