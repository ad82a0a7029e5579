"""Parse Harbor tasks with Harbor's own ``harbor.models.task`` and with sandfleet's loader, and
assert that they agree field by field (run by ``scripts/test-integrations.sh harbor_parity``,
in a Python 3.12+ venv holding Harbor 0.25 and sandfleet).

    python scripts/harbor_parity.py DIR...     every Harbor task folder in each DIR (or DIR itself)

For each task: the instruction, timeouts, resources (where the task sets them; Harbor leaves
the rest None and sandfleet takes its documented defaults), image, environment variables,
users, network policy of the agent and the verifier phases, verifier mode and environment
(limits, bundled tests), artifacts, workdir, metadata. Then the fields sandfleet refuses by
design: each must be accepted by Harbor and refused by sandfleet with that field named.
Exit 1 on any disagreement.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from harbor.models.task.config import NetworkMode
from harbor.models.task.task import Task as HarborTask
from harbor.models.task.verifier_mode import (
    resolve_task_verifier_mode,
    resolve_verifier_environment_definition,
)

from sandfleet.errors import TaskError
from sandfleet.tasks import load_task
from sandfleet.tasks.loader import find_task_dirs

DEFAULTS = {"agent_timeout_s": 600.0, "cpus": 1.0, "memory_mib": 2048, "storage_mib": 10240}
"""sandfleet's values where Harbor's field is None (docs/tasks.md)."""


def public(mode: Any) -> bool:
    return mode == NetworkMode.PUBLIC


def compare(folder: Path) -> list[str]:
    """Disagreements between Harbor and sandfleet on one task folder (empty: they agree)."""
    h = HarborTask(folder)
    s = load_task(folder)
    c = h.config
    diffs: list[str] = []

    def same(what: str, theirs: Any, ours: Any) -> None:
        if theirs != ours:
            diffs.append(f"{what}: harbor {theirs!r} != sandfleet {ours!r}")

    same("instruction", h.instruction, s.instruction)
    same("agent.timeout_sec", c.agent.timeout_sec if c.agent.timeout_sec is not None else DEFAULTS["agent_timeout_s"],
         s.agent_timeout_s)
    same("verifier.timeout_sec", c.verifier.timeout_sec, s.verifier.timeout_s)
    env = c.environment
    same("environment.build_timeout_sec", env.build_timeout_sec, s.build_timeout_s)
    same("environment.cpus", float(env.cpus) if env.cpus is not None else DEFAULTS["cpus"], s.cpus)
    same("environment.memory_mb", env.memory_mb if env.memory_mb is not None else DEFAULTS["memory_mib"],
         s.memory_mib)
    same("environment.storage_mb", env.storage_mb if env.storage_mb is not None else DEFAULTS["storage_mib"],
         s.storage_mib)
    same("environment.docker_image", env.docker_image, s.docker_image)
    same("environment.os", env.os.value, "linux")
    same("environment.env", dict(env.env), {k: s.env[k] for k in env.env if k in s.env})
    if env.workdir is not None:
        same("environment.workdir", env.workdir, s.workdir)
    same("verifier.env", dict(c.verifier.env), dict(s.verifier.env))
    same("solution.env", dict(c.solution.env), dict(s.solution.env) if s.solution else {})
    same("agent.user", None if c.agent.user is None else str(c.agent.user), s.agent_user)
    same("verifier.user", None if c.verifier.user is None else str(c.verifier.user), s.verifier.user)
    # network: the agent phase (its explicit policy, else the environment's), the verifier phase
    agent_phase = c.agent.explicit_phase_policy() or env.resolve_baseline()
    same("agent network (public)", public(agent_phase.network_mode), s.allow_internet)
    mode = resolve_task_verifier_mode(c)
    same("verifier.environment_mode", mode.value, s.verifier.mode)
    definition = resolve_verifier_environment_definition(c, h.paths)
    baseline = definition.config.resolve_baseline() if definition is not None else env.resolve_baseline()
    verifier_phase = c.verifier.explicit_phase_policy() or baseline
    same("verifier network (public)", public(verifier_phase.network_mode), s.verifier.network)
    venv = s.verifier.environment
    if definition is not None:
        assert venv is not None
        vc = definition.config
        same("verifier environment bundled tests", definition.bundled_tests, venv.bundled_tests)
        same("verifier environment directory", definition.directory.resolve(),
             (venv.context_dir or folder / "environment").resolve())
        same("verifier environment cpus", float(vc.cpus) if vc.cpus is not None else DEFAULTS["cpus"], venv.cpus)
        same("verifier environment memory_mb", vc.memory_mb if vc.memory_mb is not None else DEFAULTS["memory_mib"],
             venv.memory_mib)
        same("verifier environment storage_mb",
             vc.storage_mb if vc.storage_mb is not None else DEFAULTS["storage_mib"], venv.storage_mib)
        same("verifier environment build_timeout_sec", vc.build_timeout_sec, venv.build_timeout_s)
        same("tests uploaded", not definition.bundled_tests, bool(s.verifier.uploads))
    else:
        same("verifier environment", None, venv)
    sources = ["/" + "/".join(p for p in (a if isinstance(a, str) else a.source).split("/") if p not in ("", "."))
               for a in c.artifacts]
    same("artifacts", sources, list(s.artifacts))
    metadata = {k: v for k, v in s.metadata.items() if k != "task"}
    same("metadata", dict(c.metadata), metadata)
    if c.task is not None:
        same("task.name", c.task.name, s.metadata.get("task", {}).get("name"))
    return diffs


REFUSED = [
    ('[environment]\nhealthcheck = {command = "true"}\n', "environment.healthcheck"),
    ("[environment]\ngpus = 1\n", "environment.gpus"),
    ('[environment]\nmcp_servers = [{name = "m", url = "http://localhost:1/sse"}]\n', "environment.mcp_servers"),
    ('[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["example.com"]\n', "environment.network_mode"),
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["example.com"]\n', "agent.network_mode"),
    ('[verifier]\ncollect = [{command = "true"}]\n', "verifier.collect"),
    ('artifacts = [{source = "/app/x", destination = "x"}]\n', "artifacts.0.destination"),
    ('[verifier.env]\nKEY = "${SOME_HOST_VAR}"\n', "verifier.env.KEY"),
    ('[[steps]]\nname = "one"\n', "steps"),
]


def check_refusals(template: Path) -> list[str]:
    """Fields Harbor accepts and sandfleet refuses by design: refused with the field named."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (toml, field) in enumerate(REFUSED):
            folder = Path(tmp) / f"refused-{i}"
            shutil.copytree(template, folder)
            (folder / "task.toml").write_text('schema_version = "1.4"\n' + toml)
            if field == "steps":
                (folder / "steps" / "one" / "tests").mkdir(parents=True)
                (folder / "steps" / "one" / "instruction.md").write_text("x\n")
                (folder / "steps" / "one" / "tests" / "test.sh").write_text("true\n")
            try:
                HarborTask(folder)
            except Exception as e:  # not a refusal by design: Harbor refuses it too
                problems.append(f"{field}: Harbor refuses it too ({type(e).__name__}: {e})")
                continue
            try:
                load_task(folder)
                problems.append(f"{field}: sandfleet accepted it")
            except TaskError as e:
                if e.field != field:
                    problems.append(f"{field}: sandfleet refused another field: {e}")
    return problems


def main(dirs: list[str]) -> int:
    results: dict[str, list[str]] = {}
    for d in dirs:
        for folder in find_task_dirs(d):
            if not (folder / "task.toml").is_file():
                continue  # a TB1 task: Harbor has no parser for it (it migrates them)
            try:
                results[folder.name] = compare(folder)
            except Exception as e:
                results[folder.name] = [f"{type(e).__name__}: {e}"]
    template = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "harbor-parity" / "minimal"
    results["(refused by design)"] = check_refusals(template)
    for name, diffs in results.items():
        print(f"{'ok  ' if not diffs else 'DIFF'} {name}")
        for d in diffs:
            print(f"       {d}")
    bad = {k: v for k, v in results.items() if v}
    tasks = [k for k in results if not k.startswith("(")]
    print(json.dumps({"tasks": len(tasks), "agree": len([k for k in tasks if k not in bad]),
                      "refusals_by_design": len(REFUSED), "disagree": sorted(bad)}))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
