"""The verl dataset of the branch example: a parquet of rows that name the bundled task
(extra_info.sandfleet_task) and the agent loop (agent_name: sandfleet_tree), with the task's
instruction as the prompt. Usage: python make_data.py OUT_DIR [ROWS]"""

from __future__ import annotations

import sys
from pathlib import Path

from datasets import Dataset

HERE = Path(__file__).resolve().parent
TASK = HERE.parent / "tasks" / "branch-demo"


def rows(n: int) -> list[dict[str, object]]:
    prompt = [{"role": "user", "content": (TASK / "instruction.md").read_text()}]
    return [{"prompt": prompt, "data_source": "sandfleet", "agent_name": "sandfleet_tree",
             "reward_model": {"style": "rule", "ground_truth": ""},
             "extra_info": {"sandfleet_task": str(TASK), "index": i}} for i in range(n)]


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        Dataset.from_list(rows(n)).to_parquet(str(out / f"{split}.parquet"))
    print(f"wrote {n} rows to {out}/train.parquet and {out}/test.parquet")
