from textstats.core import WordStats


def format_report(stats, top):
    if not isinstance(stats, WordStats):
        raise TypeError("format_report expects WordStats")
    lines = [f"lines: {stats.lines}", f"words: {stats.words}", f"unique: {stats.unique}", "top:"]
    lines += [f"  {w}: {c}" for w, c in stats.top(top)]
    return "\n".join(lines)
