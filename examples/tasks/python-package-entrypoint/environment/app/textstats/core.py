import re
from collections import Counter

from textstats.report import format_report

WORD = re.compile(r"[a-z']+")


class WordStats:
    def __init__(self, counts, lines):
        self.counts = counts
        self.lines = lines

    @property
    def words(self):
        return sum(self.counts.values())

    @property
    def unique(self):
        return len(self.counts)

    def top(self, n):
        return sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def analyze(text):
    """Count lowercase words (runs of a-z and apostrophes) and newline-terminated lines."""
    return WordStats(Counter(WORD.findall(text.lower())), text.count("\n"))


def summarize(text, top=3):
    return format_report(analyze(text), top)
