#!/bin/bash
set -euo pipefail
cat > /app/migrations/003_split_name.sql <<'SQL'
-- Split users.full_name into first_name / last_name, keeping email and its index.
CREATE TABLE users_new (
    id INTEGER PRIMARY KEY,
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    email TEXT,
    created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP
);
INSERT INTO users_new (id, first_name, last_name, email, created_at)
    SELECT id,
           CASE WHEN instr(n, ' ') = 0 THEN n ELSE substr(n, 1, instr(n, ' ') - 1) END,
           CASE WHEN instr(n, ' ') = 0 THEN '' ELSE trim(substr(n, instr(n, ' ') + 1)) END,
           email,
           created_at
    FROM (SELECT id, trim(full_name) AS n, email, created_at FROM users);
DROP TABLE users;
ALTER TABLE users_new RENAME TO users;
CREATE UNIQUE INDEX users_email ON users(email);
SQL
rm -f /tmp/check.db
/app/migrate.sh /tmp/check.db
sqlite3 /tmp/check.db '.schema users'
