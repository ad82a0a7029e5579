import random
import re
from collections import Counter

LINE = re.compile(r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) (\S+)" (\d{3}) (\d+|-) "[^"]*" "[^"]*"$')


def gen(seed, n):
    rng = random.Random(seed)
    ips = [f"10.0.{rng.randint(0, 3)}.{rng.randint(1, 40)}" for _ in range(30)] + ["2001:db8::1", "192.168.1.7"]
    paths = ["/", "/index.html", "/api/users", "/api/orders", "/static/app.js", "/login", "/a b"]
    lines = []
    for i in range(n):
        r = rng.random()
        if r < 0.04:
            lines.append(rng.choice(["", "garbage line", '1.2.3.4 - - [bad] "GET" 200 1 "-" "-"', "   "]))
            continue
        path = rng.choice(paths).replace(" ", "%20")
        if rng.random() < 0.3:
            path += f"?q={rng.randint(1, 9)}&x=y"
        status = rng.choice([200, 200, 200, 304, 404, 500, 502, 301])
        size = "-" if rng.random() < 0.1 else str(rng.randint(0, 50000))
        ua = rng.choice(["Mozilla/5.0 (X11; Linux x86_64)", "curl/8.0", "-"])
        lines.append(f'{rng.choice(ips)} - {rng.choice(["-", "bob"])} [{rng.randint(10, 12)}/Oct/2023:1{rng.randint(0, 9)}:{rng.randint(10, 59)}:{rng.randint(10, 59)} +0000] '
                     f'"{rng.choice(["GET", "GET", "POST", "HEAD"])} {path} HTTP/1.1" {status} {size} "-" "{ua}"')
    return "\n".join(lines) + "\n"


def expected(text):
    total = mal = bytes_sent = 0
    ips = set()
    status = Counter()
    paths = Counter()
    for line in text.split("\n"):
        if line == "":
            continue
        m = LINE.match(line)
        if not m:
            mal += 1
            continue
        total += 1
        ips.add(m.group(1))
        status[m.group(6)] += 1
        paths[m.group(4).split("?", 1)[0]] += 1
        if m.group(7) != "-":
            bytes_sent += int(m.group(7))
    top = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))[:3]
    return {"total_requests": total, "malformed_lines": mal, "unique_ips": len(ips),
            "status_counts": dict(status), "top_paths": [[p, c] for p, c in top],
            "bytes_sent": bytes_sent,
            "server_errors": sum(c for s, c in status.items() if s.startswith("5"))}
