"""What the records of a run cost per rollout: bytes of records.jsonl, and the ms spent taping
and making each record (docs/replay.md, "What it costs").

    python scripts/record_cost.py RUN_DIR [RUN_DIR_WITHOUT_RECORDS]

With a second run directory (the same run with --record none) it also prints both runs'
mean rollout seconds.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def out(line: str) -> None:
    sys.stdout.write(line + "\n")


def main(argv: list[str]) -> int:
    run = Path(argv[1])
    lines = (run / "records.jsonl").read_bytes().splitlines(keepends=True)
    records = [json.loads(line) for line in lines]
    sizes = [len(line) for line in lines]
    tape = [r["cost"]["tape_ms"] for r in records]
    build = [r["cost"]["build_ms"] for r in records]
    total = [a + b for a, b in zip(tape, build, strict=True)]
    out(f"rollouts            {len(records)} (mode {records[0]['mode']})")
    out(f"bytes per rollout   mean {statistics.mean(sizes):.0f}, median {statistics.median(sizes):.0f}, "
          f"max {max(sizes)}")
    out(f"ms per rollout      mean {statistics.mean(total):.2f} (tape {statistics.mean(tape):.2f}, "
          f"record {statistics.mean(build):.2f}), max {max(total):.2f}")
    for d in argv[1:3]:
        s = json.loads((Path(d) / "summary.json").read_text())
        out(f"{d}: mean rollout {s['mean_rollout_s']:.3f} s, wall {s['wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
