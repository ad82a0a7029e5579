"""Writing Harbor task folders and the import report."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sandfleet.errors import ConfigError
from sandfleet.sandbox.spec import AGENT_UID

DOCKERFILE_HEAD = "FROM python:3.11-slim-bookworm\n\nWORKDIR /app\n"
AGENT_OWNER = f"{AGENT_UID}:{AGENT_UID}"
"""``COPY --chown`` value that gives a file to the sandbox's agent user."""

TASK_TOML = """version = "1.0"

[metadata]
author_name = "{author}"
source = "{source}"
difficulty = "{difficulty}"
category = "{category}"
tags = {tags}

[verifier]
timeout_sec = {verifier_timeout:.1f}

[agent]
timeout_sec = {agent_timeout:.1f}

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 1024
storage_mb = 1024
allow_internet = false
"""


class PackageMissingError(ConfigError):
    """The package an importer reads is not installed."""


@dataclass
class ImportResult:
    """What an import wrote and what it skipped (task name -> reason)."""

    out_dir: Path
    written: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)


def write_file(path: Path, text: str, *, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if executable:
        path.chmod(0o755)


def write_task(
    folder: Path,
    *,
    instruction: str,
    dockerfile: str,
    tests: dict[str, str],
    solve_sh: str,
    source_md: str,
    toml_fields: dict[str, object],
) -> None:
    """Write one Harbor task folder, replacing any previous one."""
    if folder.exists():
        shutil.rmtree(folder)
    write_file(folder / "task.toml", TASK_TOML.format(**toml_fields))
    write_file(folder / "instruction.md", instruction.rstrip() + "\n")
    write_file(folder / "environment" / "Dockerfile", dockerfile)
    for name, text in tests.items():
        write_file(folder / "tests" / name, text, executable=name.endswith(".sh"))
    write_file(folder / "solution" / "solve.sh", solve_sh, executable=True)
    write_file(folder / "SOURCE.md", source_md)


def write_report(result: ImportResult, title: str, notes: str) -> None:
    lines = [
        f"# {title}",
        "",
        notes.strip(),
        "",
        f"Written: {len(result.written)} tasks. Skipped: {len(result.skipped)}.",
        "",
    ]
    if result.skipped:
        lines += ["## Skipped", "", "| task | reason |", "|---|---|"]
        lines += [f"| {name} | {why} |" for name, why in sorted(result.skipped.items())]
        lines.append("")
    write_file(result.out_dir / "IMPORT_REPORT.md", "\n".join(lines))
