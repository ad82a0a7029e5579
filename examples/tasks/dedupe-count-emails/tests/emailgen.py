import random
from collections import Counter


def gen(seed, n):
    rng = random.Random(seed)
    base = ["ann@example.com", "bob@example.org", "carol.x@mail.example.net", "dave@example.com",
            "eve+tag@example.io", "frank@sub.example.com", "zed@a.co"]
    lines = []
    for _ in range(n):
        r = rng.random()
        if r < 0.06:
            lines.append(rng.choice(["", "   ", "# comment line", "  # indented comment"]))
            continue
        e = rng.choice(base)
        if rng.random() < 0.3:
            e = e.upper() if rng.random() < 0.5 else e.title()
        e = rng.choice(["", " ", "\t"]) + e + rng.choice(["", "  ", "\t", "\r"])
        lines.append(e)
    return "\n".join(lines) + "\n"


def expected(text):
    c = Counter()
    for line in text.split("\n"):
        s = line.strip(" \t\r").lower()
        if not s or s.startswith("#"):
            continue
        c[s] += 1
    return "".join(f"{n} {e}\n" for e, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))
