"""The verifier: after the agent stops, in the same sandbox, score what it left behind.

No reward hacking, in this order:

1. every process the agent left is killed (all but the sandbox's init and guest agent);
2. the test directories and the reward directory are emptied (whatever the agent put there
   is gone, links included);
3. the tests are uploaded -- they never reach the sandbox before this point;
4. the verifier command runs (a ``verifier`` span); then the reward files are read.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from sandfleet.errors import GuestFileNotFoundError, RolloutError
from sandfleet.rollout.policy import stage_uploads
from sandfleet.rollout.trace import SpanRecorder
from sandfleet.sandbox.base import Sandbox
from sandfleet.tasks.model import Task
from sandfleet.tasks.reward import reward_from

OUTPUT_KEEP_CHARS = 64 * 1024
"""The tail of the verifier's output kept with the rollout."""

# Kill every process but init (1), the guest agent (our parent) and ourselves; repeat until
# nothing is left, so processes forked while we kill are caught too. Only ever run in a
# private pid namespace (the guest agent is pid 1 or 2 there); it refuses anywhere else.
ISOLATED_BACKENDS = ("bwrap", "microvm", "firecracker")
KILL_ALL = r"""
if [ "$PPID" -gt 2 ]; then echo "not in a private pid namespace; refusing to kill" >&2; exit 2; fi
keep=" 1 $PPID $$ "
for pass in 1 2 3 4 5 6 7 8 9 10; do
  found=0
  for d in /proc/[0-9]*; do
    p=${d#/proc/}
    case "$keep" in *" $p "*) continue ;; esac
    stat=$(cat "$d/stat" 2>/dev/null) || continue
    stat=${stat##*) }
    case "$stat" in Z*|X*) continue ;; esac  # already dead, waiting to be reaped
    kill -9 "$p" 2>/dev/null && found=1
  done
  [ "$found" = 0 ] && exit 0
  sleep 0.01
done
echo "processes survived 10 kill passes" >&2
exit 1
"""

# Empty each folder (a link or file in its place is replaced by a folder).
CLEAR = r"""
for d in "$@"; do
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -rf -- "$d"; fi
  mkdir -p -- "$d" && find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} + || exit 1
done
"""


@dataclass
class VerifierOutcome:
    """A verifier's verdict and what it printed."""

    reward: float
    details: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    timed_out: bool = False
    output: str = ""
    """The tail of the test command's stdout and stderr (``OUTPUT_KEEP_CHARS``)."""


def _cleared_paths(task: Task) -> list[str]:
    plan = task.verifier
    paths = {
        up.target if up.source.is_dir() else posixpath.dirname(up.target) for up in plan.uploads
    }
    paths.add(posixpath.dirname(plan.reward_text_path))
    paths.add(posixpath.dirname(plan.reward_json_path))
    return sorted(p for p in paths if p not in ("/", "") and p != task.workdir)


async def kill_agent_processes(sandbox: Sandbox) -> None:
    """Kill every process in the sandbox except its init and guest agent.

    The ``process`` backend shares the host's processes, so there this does nothing."""
    if sandbox.backend not in ISOLATED_BACKENDS:
        return
    res = await sandbox.exec(["bash", "-c", KILL_ALL], cwd="/", timeout=30)
    if res.exit_code != 0:
        raise RolloutError(
            f"could not stop the agent's processes: {res.stderr.strip()}", reason="agent_unkillable"
        )


async def _read(sandbox: Sandbox, path: str) -> str | None:
    try:
        return (await sandbox.read_file(path)).decode("utf-8", "replace")
    except (GuestFileNotFoundError, FileNotFoundError):
        return None


async def run_verifier(task: Task, sandbox: Sandbox, recorder: SpanRecorder) -> VerifierOutcome:
    """Stop the agent, clear, upload the tests, run them and read the reward."""
    plan = task.verifier
    with recorder.span("other_sandbox", what="stop agent"):
        await kill_agent_processes(sandbox)
    with recorder.span("other_sandbox", what="clear tests and rewards"):
        res = await sandbox.exec(["bash", "-c", CLEAR, "clear", *_cleared_paths(task)],
                                 cwd="/", timeout=60)
        if res.exit_code != 0:
            raise RolloutError(f"could not empty the test and reward folders: "
                               f"{res.output.strip()[-300:]}", reason="verifier_setup")
    with recorder.span("other_sandbox", what="upload tests"):
        await stage_uploads(sandbox, plan.uploads)
    with recorder.span("verifier") as span:
        res = await sandbox.exec(
            list(plan.command), cwd=task.workdir, env=plan.env or None, timeout=plan.timeout_s
        )
        span["exit_code"] = res.exit_code
        if res.timed_out:
            span["timed_out"] = True
    output = res.output[-OUTPUT_KEEP_CHARS:]
    with recorder.span("other_sandbox", what="read reward"):
        text = json_text = None
        if plan.reward == "reward-file":
            text = await _read(sandbox, plan.reward_text_path)
            if text is None:
                json_text = await _read(sandbox, plan.reward_json_path)
    outcome = VerifierOutcome(0.0, exit_code=res.exit_code, timed_out=res.timed_out, output=output)
    try:
        reward = reward_from(plan, output=res.output, reward_text=text, reward_json=json_text)
    except RolloutError as e:
        if res.timed_out:  # a test run that outlived its limit scores 0
            return outcome
        e.args = (
            f"{e.args[0]}; verifier exit code {res.exit_code}, output tail:\n{output[-2000:]}",
        )
        raise
    outcome.reward, outcome.details = reward.value, reward.details
    return outcome
