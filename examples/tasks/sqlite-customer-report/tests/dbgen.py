import random
import sqlite3

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     ordered_at TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product TEXT NOT NULL,
                          quantity INTEGER NOT NULL, unit_price_cents INTEGER NOT NULL);
"""


def statements(seed, ncust, nord):
    rng = random.Random(seed)
    first = ["Ada", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea"]
    countries = ["DE", "FR", "US", "JP", None]
    out = []
    for c in range(1, ncust + 1):
        out.append(("INSERT INTO customers VALUES (?,?,?)", (c, f"{rng.choice(first)} {chr(65 + c % 26)}{c}", rng.choice(countries))))
    for o in range(1, nord + 1):
        year = rng.choice([2023, 2024, 2024, 2024, 2025])
        ts = f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
        if rng.random() < 0.05:
            ts = rng.choice(["2024-01-01 00:00:00", "2024-12-31 23:59:59", "2023-12-31 23:59:59", "2025-01-01 00:00:00"])
        out.append(("INSERT INTO orders VALUES (?,?,?,?)", (o, rng.randint(1, ncust), ts, rng.choice(["completed", "completed", "cancelled", "pending"]))))
        for _ in range(rng.choice([0, 1, 1, 2, 3, 4])):
            out.append(("INSERT INTO order_items VALUES (?,?,?,?)", (o, f"P{rng.randint(1, 30)}", rng.randint(1, 6), rng.randint(99, 25000))))
    return out


def make_db(path, seed, ncust, nord):
    con = sqlite3.connect(path)
    con.executescript(SCHEMA)
    for sql, args in statements(seed, ncust, nord):
        con.execute(sql, args)
    con.commit()
    con.close()


def sql_literal(v):
    if v is None:
        return "NULL"
    if isinstance(v, int):
        return str(v)
    return "'" + v.replace("'", "''") + "'"


def seed_sql(seed, ncust, nord):
    lines = [SCHEMA.strip(), "BEGIN;"]
    for sql, args in statements(seed, ncust, nord):
        table = sql.split()[2]
        lines.append(f"INSERT INTO {table} VALUES ({', '.join(sql_literal(a) for a in args)});")
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


def expected(path):
    con = sqlite3.connect(path)
    cust = {r[0]: (r[1], r[2]) for r in con.execute("SELECT id, name, country FROM customers")}
    items = {}
    for oid, q, p in con.execute("SELECT order_id, quantity, unit_price_cents FROM order_items"):
        items[oid] = items.get(oid, 0) + q * p
    agg = {}
    for oid, cid, ts, st in con.execute("SELECT id, customer_id, ordered_at, status FROM orders"):
        if st != "completed" or not ts.startswith("2024-"):
            continue
        a = agg.setdefault(cid, [0, 0])
        a[0] += 1
        a[1] += items.get(oid, 0)
    rows = []
    for cid, (n, cents) in agg.items():
        if n >= 2:
            name, country = cust[cid]
            rows.append((name, country or "unknown", str(n), f"{cents // 100}.{cents % 100:02d}", cents))
    rows.sort(key=lambda r: (-r[4], r[0]))
    return [["customer_name", "country", "orders", "total"]] + [list(r[:4]) for r in rows]
