"""``sandfleet tasks import swebench FILE.jsonl OUT``: SWE-bench instances into task folders.

Each instance becomes a SWE-bench task folder (:mod:`sandfleet.tasks.swebench`) whose build
context holds the repository at ``base_commit``: fetched with git, depth 1, from a local clone
under ``--repos DIR`` (``DIR/owner__name``, ``DIR/owner/name`` or ``DIR/name``) or else from
``https://github.com/<repo>``. An instance whose repository can't be fetched (this host reaches
no GitHub, the commit is not there) is skipped with git's own words in IMPORT_REPORT.md, and
nothing is written for it.

The environment is ``python:3.11-slim-bookworm`` with git and pytest, the repository in
/testbed installed with ``pip install -e .`` (or the instance's own ``install`` command, when it
has one), given to the agent's user. That is not SWE-bench's per-repository image (conda,
pinned Python and dependencies): an instance whose tests need more says so when it is
validated (``sandfleet tasks validate``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from sandfleet.sandbox.spec import AGENT_UID
from sandfleet.tasks.importers.common import ImportResult, write_report
from sandfleet.tasks.swebench import SWEbenchInstance, load_instances, write_task

FETCH_TIMEOUT_S = 300.0
REMOTE = "https://github.com/{repo}.git"


def local_repo(repos: Path | None, repo: str) -> Path | None:
    """A local clone of ``owner/name`` under ``repos``, if there is one."""
    if repos is None:
        return None
    owner, name = repo.split("/", 1)
    for cand in (repos / f"{owner}__{name}", repos / owner / name, repos / name, repos / f"{name}.git"):
        if (cand / ".git").exists() or (cand / "HEAD").is_file():
            return cand
    return None


def fetch_tree(source: str, commit: str, dest: Path, timeout: float = FETCH_TIMEOUT_S) -> str | None:
    """``dest`` becomes a git work tree of ``source`` at ``commit`` (history depth 1); None when
    done, else why not (git's words)."""
    dest.mkdir(parents=True)
    steps = [["git", "init", "-q", "."],
             ["git", "-c", "protocol.version=2", "fetch", "-q", "--depth", "1", source, commit],
             ["git", "-c", "advice.detachedHead=false", "checkout", "-q", commit]]
    env = {"GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_GLOBAL": "/dev/null", "PATH": "/usr/bin:/bin"}
    for cmd in steps:
        try:
            proc = subprocess.run(cmd, cwd=dest, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return f"{' '.join(cmd[:3])} outlived {timeout:.0f} s"
        if proc.returncode != 0:
            lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
            return f"`{' '.join(c if c != source else '<repo>' for c in cmd)}`: {lines[-1] if lines else 'failed'}"
    return None


def dockerfile(inst: SWEbenchInstance) -> str:
    install = (inst.model_extra or {}).get("install") or "pip install --no-cache-dir -e ."
    return f"""# {inst.instance_id}: {inst.repo} at {inst.base_commit}
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir pytest
WORKDIR /testbed
COPY repo/ /testbed/
RUN test "$(git rev-parse HEAD)" = {inst.base_commit} && {install}
RUN chown -R {AGENT_UID}:{AGENT_UID} /testbed
"""


def import_swebench(file: Path, out: Path, *, repos: Path | None = None,
                    timeout: float = FETCH_TIMEOUT_S) -> ImportResult:
    """Convert the instances of ``file`` into task folders under ``out``."""
    instances = load_instances(file)
    result = ImportResult(out_dir=out)
    out.mkdir(parents=True, exist_ok=True)
    unreachable: dict[str, str] = {}
    for inst in instances:
        local = local_repo(repos, inst.repo)
        source = str(local) if local is not None else REMOTE.format(repo=inst.repo)
        if local is None and inst.repo in unreachable:
            result.skipped[inst.instance_id] = unreachable[inst.repo]
            continue
        with tempfile.TemporaryDirectory(prefix="sandfleet-swebench-") as tmp:
            tree = Path(tmp) / "repo"
            why = fetch_tree(source, inst.base_commit, tree, timeout)
            if why is not None:
                if local is None:
                    offline = any(w in why for w in ("resolve host", "connect", "outlived", "unreachable",
                                                     "timed out", "Network"))
                    where = "this host reaches no GitHub" if offline else "the commit may not be there"
                    why = (f"cannot fetch {source} ({why}): {where}; clone the repository where it can and "
                           f"pass --repos DIR (DIR/{inst.repo.replace('/', '__')})")
                    if offline:
                        unreachable[inst.repo] = why
                else:
                    why = f"cannot fetch {inst.base_commit} from {local}: {why}"
                result.skipped[inst.instance_id] = why
                continue
            folder = out / inst.instance_id
            write_task(folder, inst, dockerfile(inst), source_md=(
                f"# {inst.instance_id}\n\nImported from `{file.name}` by `sandfleet tasks import swebench`; "
                f"the repository {inst.repo} at `{inst.base_commit}` from "
                f"{'a local clone' if local else 'its GitHub remote'} (depth 1).\n"))
            shutil.copytree(tree, folder / "environment" / "repo", symlinks=True)
            result.written.append(inst.instance_id)
    write_report(result, "SWE-bench import", f"From `{file}`: {len(instances)} instances. Each task's "
                 "environment/repo is the repository at base_commit; its tests are graded by the swebench "
                 "package (pip install 'sandfleet[swebench]').")
    return result

