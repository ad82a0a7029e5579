import random

EMAILS = ["ann.lee@example.com", "Bob+news@Mail.Example.org", "c_d%x@sub-domain.example.co.uk", "DAN@EXAMPLE.NET",
          "eve-99@corp.io", "f.g@a-b.museum"]
PHONES = [("212", "555", "0147"), ("646", "555", "9321"), ("415", "555", "2671"), ("800", "555", "0000"), ("303", "555", "7788")]
FORMATS = ["({a}) {b}-{c}", "{a}-{b}-{c}", "{a}.{b}.{c}", "{a} {b} {c}", "+1 {a} {b} {c}", "+1-{a}-{b}-{c}", "+1 ({a}) {b}-{c}"]
NOISE = ["order #12345678901 shipped", "on 2024-01-15 at 10:30", "server 10.0.0.1 is down", "zip 10001",
         "ping @handle on chat", "mail root@localhost for help", "ref 555-1234 only", "ids 1234-567-8901-2",
         "version 3.11.2 released", "the quick brown fox", "tel 12125550147"]


def gen(seed, n):
    rng = random.Random(seed)
    emails, phones, parts = set(), set(), []
    for _ in range(n):
        k = rng.random()
        if k < 0.3:
            e = rng.choice(EMAILS)
            emails.add(e.lower())
            parts.append(rng.choice(["contact {} now", "<{}>", "({})", "email: {}.", "{},", "send to {}!"]).format(e))
        elif k < 0.6:
            a, b, c = rng.choice(PHONES)
            phones.add(f"+1-{a}-{b}-{c}")
            parts.append(rng.choice(["call {} today", "phone: {}.", "[{}]", "{};"]).format(rng.choice(FORMATS).format(a=a, b=b, c=c)))
        else:
            parts.append(rng.choice(NOISE))
    text = ""
    for p in parts:
        text += p + rng.choice([" ", "\n", "  ", "\t"])
    return text, {"emails": sorted(emails), "phones": sorted(phones)}
