import argparse

from textstats.core import summarize


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m textstats", description="Word statistics for a text file")
    p.add_argument("file")
    p.add_argument("--top", type=int, default=3)
    args = p.parse_args(argv)
    with open(args.file, encoding="utf-8") as f:
        print(summarize(f.read(), args.top))
    return 0
