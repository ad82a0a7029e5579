import json
import random


def gen(seed, n):
    rng = random.Random(seed)
    people = [("Ann Lee", "ann@example.com"), ("Bo Chen", "bo@example.org"), ("Cy Diaz", "cy@example.net"),
              ("Di Evans", "di@example.com"), ("Ed Fox", "ed@example.com")]
    orders = []
    for i in range(n):
        name, email = rng.choice(people)
        items = [{"sku": f"SKU-{rng.randint(1, 50):03d}", "qty": rng.randint(1, 5),
                  "price_cents": rng.randint(50, 20000)} for _ in range(rng.randint(0, 4))]
        orders.append({"id": 1000 + i, "status": rng.choice(["paid", "paid", "refunded", "pending"]),
                       "customer": {"name": name, "email": email if rng.random() < 0.8 else email.upper()},
                       "items": items})
    return orders


def expected(orders):
    agg = {}
    for o in orders:
        if o["status"] != "paid":
            continue
        e = o["customer"]["email"].lower()
        a = agg.setdefault(e, {"customer": e, "orders": 0, "items": 0, "total_cents": 0})
        a["orders"] += 1
        a["items"] += sum(i["qty"] for i in o["items"])
        a["total_cents"] += sum(i["qty"] * i["price_cents"] for i in o["items"])
    return sorted(agg.values(), key=lambda a: (-a["total_cents"], a["customer"]))
