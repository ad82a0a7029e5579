#!/usr/bin/env python3
"""Runs attack task folders (default: tests/fixtures/attacks-iii) on each backend, in both
verify modes, with the oracle agent replaying each attack (its solve.sh), and prints the table
docs/security.md keeps: per attack, contained (scored 0), forged (a reward above 0) or
abstained (masked: an infra fault, reward null; or the rollout failed).

    scripts/attack-table.py [--tasks DIR] [--backends bwrap,gvisor,microvm] [--modes shared,separate]
                            [--out DIR] [--json] [--remote]

--remote runs each backend's rows through `sandfleet serve` (started here on loopback with that
backend, and stopped after): `sandfleet run --remote URL`, the service's sandboxes.

Each backend and mode runs in a fresh folder (under --out, which must not hold an earlier table's
rows: `sandfleet run --out` resumes, and a resumed row is an earlier build's answer).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def classify(row: dict) -> str:
    """By the row's verdict: a mask (infra fault, reward null) abstains; a policy fault or a
    scored 0 is contained (a sandbox the attack killed by its own memory is a 0, not a mask)."""
    reward = row.get("reward")
    if row.get("verdict") == "infra_fault" or reward is None:
        return "abstained"
    return "forged" if float(reward) > 0 else "contained"


def run(tasks: Path, backend: str, mode: str, out: Path, remote: tuple[str, str] | None = None
        ) -> dict[str, tuple[str, str]]:
    cmd = [str(HERE / ".venv" / "bin" / "sandfleet"), "run", "--tasks", str(tasks), "--agent", "oracle", "-n", "1",
           "--verify", mode, "--attempts", "1", "--out", str(out)]
    env = dict(os.environ)
    if remote is not None:
        cmd += ["--remote", remote[0]]
        env["SANDFLEET_TOKEN"] = remote[1]
    else:
        cmd += ["--backend", backend]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = out / "rollouts.jsonl"
    if not rows.is_file():
        sys.stderr.write(f"{backend}/{mode}: no rollouts ({proc.returncode}): {proc.stderr[-1500:]}\n")
        return {}
    result = {}
    for line in rows.read_text().splitlines():
        row = json.loads(line)
        why = (row.get("fault") or {}).get("cause") or row.get("reason") or ""
        result[row["task"]] = (classify(row), str(why))
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=Path, default=HERE / "tests" / "fixtures" / "attacks-iii")
    ap.add_argument("--backends", default="bwrap,gvisor,microvm")
    ap.add_argument("--modes", default="shared,separate")
    ap.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--remote", action="store_true", help="through a sandfleet serve of each backend")
    args = ap.parse_args()
    cols = [(b, m) for b in args.backends.split(",") for m in args.modes.split(",")]
    out = args.out or Path(tempfile.mkdtemp(prefix="sandfleet-attacks-"))
    stale = [out / f"{b}-{m}" for b, m in cols if (out / f"{b}-{m}" / "rollouts.jsonl").exists()]
    if stale:
        sys.stderr.write(f"attack-table: {stale[0]} holds an earlier run's rows (they would be resumed, not run): "
                         "give an empty --out\n")
        return 2
    table: dict[str, dict[str, tuple[str, str]]] = {}
    for b in dict.fromkeys(b for b, _ in cols):
        with contextlib.ExitStack() as stack:
            remote = None
            if args.remote:
                from sandfleet.server.testing import running_service

                svc = stack.enter_context(running_service(out / f"serve-{b}", args=["--backend", b]))
                remote = (svc.url, svc.token)
            for m in [m for bb, m in cols if bb == b]:
                for task, cell in run(args.tasks, b, m, out / f"{b}-{m}", remote).items():
                    table.setdefault(task, {})[f"{b}/{m}"] = cell
    if args.json:
        print(json.dumps(table, indent=1))
        return 0
    heads = [f"{b}/{m}" for b, m in cols]
    print("| attack | " + " | ".join(heads) + " |")
    print("|---|" + "---|" * len(heads))
    for task in sorted(table):
        cells = []
        for h in heads:
            kind, why = table[task].get(h, ("not run", ""))
            cells.append(kind + (f" ({why})" if why and kind != "forged" else ""))
        print(f"| {task} | " + " | ".join(cells) + " |")
    totals = {h: {k: sum(1 for t in table if table[t].get(h, ("",))[0] == k) for k in ("contained", "forged",
              "abstained")} for h in heads}
    print("| **total** (contained/forged/abstained) | " + " | ".join(
        f"{t['contained']}/{t['forged']}/{t['abstained']}" for t in totals.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
