import os
import random
import sqlite3
import subprocess
import tempfile

import pytest


def migrate(db):
    r = subprocess.run(["/app/migrate.sh", db], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stdout + r.stderr


def v2_db(rows):
    d = tempfile.mkdtemp()
    db = os.path.join(d, "app.db")
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for f in ("001_init.sql", "002_add_email.sql"):
        con.executescript(open(f"/tests/orig_{f}").read())
    con.executemany("INSERT INTO schema_version VALUES (?)", [(1,), (2,)])
    con.executemany("INSERT INTO users (id, full_name, email, created_at) VALUES (?,?,?,?)", rows)
    con.commit()
    con.close()
    return db


def split(full):
    t = full.strip()
    first, _, rest = t.partition(" ")
    return first, rest.strip()


def test_old_migrations_unchanged():
    for f in ("001_init.sql", "002_add_email.sql"):
        assert open(f"/app/migrations/{f}").read() == open(f"/tests/orig_{f}").read()


def test_fresh_database():
    d = tempfile.mkdtemp()
    db = os.path.join(d, "fresh.db")
    migrate(db)
    con = sqlite3.connect(db)
    assert con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 3
    cols = [r[1] for r in con.execute("PRAGMA table_info(users)")]
    assert cols == ["id", "first_name", "last_name", "email", "created_at"]
    idx = {r[1]: r[2] for r in con.execute("PRAGMA index_list(users)")}
    assert idx.get("users_email") == 1
    con.execute("INSERT INTO users (first_name, last_name, email) VALUES ('a', 'b', 'x@y')")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO users (first_name, last_name, email) VALUES ('c', 'd', 'x@y')")


def rows_for(seed, n):
    rng = random.Random(seed)
    names = ["Ada Lovelace", "Grace Brewster Hopper", "Linus", "  Ken Thompson ", "Mary  Ann Smith",
             "Jean-Luc Picard", "Zoë Ångström", "O'Neil Jack", "Prince"]
    rows = []
    for i in range(1, n + 1):
        email = None if rng.random() < 0.2 else f"user{i}@example.com"
        rows.append((i * 3, rng.choice(names), email, f"2023-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} 08:00:00"))
    return rows


@pytest.mark.parametrize("seed,n", [(1, 9), (2, 120)])
def test_data_migrated(seed, n):
    rows = rows_for(seed, n)
    db = v2_db(rows)
    migrate(db)
    con = sqlite3.connect(db)
    got = con.execute("SELECT id, first_name, last_name, email, created_at FROM users ORDER BY id").fetchall()
    exp = [(i, *split(full), email, ts) for i, full, email, ts in sorted(rows)]
    assert got == exp
    assert con.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == 3
