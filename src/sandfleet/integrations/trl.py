"""TRL: sandfleet rewards and a sandfleet bash environment for ``trl.GRPOTrainer``.

Single turn (the path a small model learns on)::

    reward = SandfleetReward()            # or the module-level `sandfleet_reward`
    GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=ds, ...)

Each dataset row carries ``sandfleet_task`` (a task folder, or a name under
``$SANDFLEET_TASKS``). For every completion, the bash it holds (the last fenced block, else the
whole text) runs once under ``bash -c`` in a **fresh sandbox** of that task, the task's own
verifier scores it, and its reward is returned -- partial credit included, where the task's
``reward.json`` gives a fraction. Rollouts run concurrently (``concurrency`` at once) on TRL's
reward event loop. A rollout's verdict (docs/rollouts.md) decides what TRL gets: ``scored``
its reward, ``policy_fault`` 0, ``infra_fault`` ``None`` -- TRL's own way to say a reward
function can't score a completion. An infra fault is first refilled in place (the same script
in a fresh sandbox, ``Runner.retry``); only when the attempts run out is ``None`` returned.
What TRL then does with it (no advantage, no weight in the group's mean and std, but a share
of the loss normalisation and of the KL term): docs/integrations.md.

Multi-turn, with ``environment_factory=SandfleetBashEnv`` (modelled on TRL's
``trl/experimental/harbor/_env.py``): ``reset(**row)`` starts a sandbox for
``row["sandfleet_task"]`` and returns the instruction, ``bash(command)`` is the model's tool,
and ``get_reward()`` runs the verifier and closes the sandbox. The whole episode is one
sandfleet rollout (spans, verifier, trace), driven command by command.

Every rollout is one :class:`~sandfleet.rollout.result.RolloutResult`; pass ``on_result`` to
keep them (``result.to_trace()`` is a ``trace.jsonl`` line that ``sandfleet analyze`` reads).
Every sandbox is closed by sandfleet's runner, whatever happens. Process-wide settings
(backend, network, remote service) come from the environment, as for the other integrations
(:mod:`sandfleet.integrations._common`); ``cpus`` overrides the tasks' CPU quota, because
sandboxes and the trainer share the host's cores.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sandfleet.integrations._common import (  # noqa: F401 - Runner re-exported
    LIVE,
    Runner,
    Settings,
    keep_record,
    recorded_id,
    resolve_task,
    reward_of,
    sandboxes_on,
    task_image,
)
from sandfleet.integrations._tokens import (  # noqa: F401 - re-exported: the TRL integration's names
    _FENCE,
    COMBINE,
    TREE_KEY,
    TokenEngine,
    TokenModel,
    Trajectory,
    TreeAgent,
    TreeRow,
    combine_advantages,
    grow_group,
    token_advantages,
)
from sandfleet.rollout.policy import AgentContext, Policy
from sandfleet.rollout.result import RolloutResult
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.verifier import PTH_RISK, TOOL_CONFIG_RISK
from sandfleet.tasks import Task

TASK_KEY = "sandfleet_task"
"""The dataset column naming the task."""
COMMAND_TIMEOUT_S = 20.0
"""Longest a completion's script (or one ``bash`` tool call) may run."""
OUTPUT_CHARS = 4000
"""How much of a command's output the ``bash`` tool returns."""

def completion_text(completion: Any) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages (the
    assistant contents, joined)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, Sequence):
        return "\n".join(completion_text(m) for m in completion if not isinstance(m, dict)
                         or m.get("role", "assistant") == "assistant")  # fmt: skip
    raise TypeError(f"a completion must be a string or a list of messages, not {type(completion).__name__}")


def extract_script(text: str) -> str:
    """The bash a completion holds: its fenced code blocks (```bash, ```sh or bare ```),
    joined; else the whole text. A ``$ `` prompt at the start of a line is dropped."""
    blocks = [b for b in _FENCE.findall(text) if b.strip()]
    script = "\n".join(b.strip("\n") for b in blocks) if blocks else text
    return "\n".join(line[2:] if line.startswith("$ ") else line for line in script.strip().splitlines())


class ScriptPolicy:
    """Runs one bash script under ``bash -c`` in the task's workdir, then stops."""

    name = "trl-script"

    def __init__(self, script: str, timeout_s: float = COMMAND_TIMEOUT_S):
        self.script = script
        self.timeout_s = timeout_s

    async def act(self, ctx: AgentContext) -> str:
        ctx.turns = 1
        if self.script.strip():
            # stdin at EOF: a completion that starts an interpreter (a ```python fence run as
            # bash) ends at once instead of holding its sandbox until the timeout
            res = await ctx.run("exec < /dev/null\n" + self.script, shell=False, timeout=self.timeout_s)
            ctx.info["script_exit_code"] = res.exit_code
        return "done"


@dataclass
class RewardStats:
    """The last reward call's cost: wall seconds, and CPU seconds of this process and its
    reaped children (the sandboxes' processes) while it ran."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    rollouts: int = 0


def cpu_seconds() -> float:
    """CPU seconds of this process and its reaped children (the sandboxes' processes) so far."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class SandfleetReward:
    """An async TRL reward function: each completion's bash runs in a fresh sandbox of its
    row's task and the task's verifier scores it.

    Args:
        concurrency: sandboxes at once (keep it at about the host's cores).
        runner: how sandboxes are made (:class:`Runner`); by default from the environment.
        timeout_s: the longest a completion's script may run.
    """

    def __init__(self, *, concurrency: int = 2, runner: Runner | None = None, timeout_s: float = COMMAND_TIMEOUT_S,
                 tasks_root: str | None = None):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        self.__name__ = "sandfleet"  # TRL names the reward's metrics after it
        self.concurrency = concurrency
        self.runner = runner or Runner()
        self.timeout_s = timeout_s
        self.tasks_root = tasks_root
        self.last = RewardStats()
        self.results: list[RolloutResult] = []
        """The last call's rollouts, in completion order."""

    async def __call__(self, prompts: list[Any] | None = None, completions: list[Any] | None = None,
                       sandfleet_task: list[str] | None = None, **kwargs: Any) -> list[float | None]:
        if completions is None:
            raise TypeError("the reward needs `completions`")
        if sandfleet_task is None:
            raise KeyError(f"the dataset has no {TASK_KEY!r} column (a task folder or a name under $SANDFLEET_TASKS)")
        if len(sandfleet_task) != len(completions):
            raise ValueError(f"{len(completions)} completions but {len(sandfleet_task)} {TASK_KEY} values")
        step = getattr(kwargs.get("trainer_state"), "global_step", None)
        wall0, cpu0 = time.perf_counter(), cpu_seconds()
        gate = asyncio.Semaphore(self.concurrency)

        async def one(i: int, completion: Any, ref: str) -> RolloutResult:
            task = resolve_task(ref, self.tasks_root)
            script = extract_script(completion_text(completion))
            async with gate:
                return await self.runner.rollout(task, ScriptPolicy(script, self.timeout_s), sample=i,
                                                 info={"trl_step": step, "script": script[:2000]})  # fmt: skip

        results = await asyncio.gather(*(one(i, c, t) for i, (c, t) in enumerate(zip(completions, sandfleet_task,
                                                                                       strict=True))))  # fmt: skip
        self.results = list(results)
        self.last = RewardStats(time.perf_counter() - wall0, cpu_seconds() - cpu0, len(results))
        log_metric = kwargs.get("log_metric")
        if callable(log_metric):
            log_metric("sandfleet/reward_wall_s", self.last.wall_s)
            log_metric("sandfleet/reward_cpu_s", self.last.cpu_s)
            log_metric("sandfleet/failed_rollouts", float(sum(r.status != "completed" for r in results)))
            log_metric("sandfleet/masked_rollouts", float(sum(r.masked for r in results)))
        return [reward_of(r) for r in results]


sandfleet_reward = SandfleetReward()
"""A ready :class:`SandfleetReward` (two sandboxes at once, settings from the environment)."""


class _Episode:
    """The policy of one multi-turn episode: runs the commands the env hands it, one at a
    time, in one shell session, until told to stop."""

    name = "trl-bash-env"

    def __init__(self) -> None:
        self.commands: asyncio.Queue[str | None] = asyncio.Queue()
        self.outputs: asyncio.Queue[str] = asyncio.Queue()
        self.started = asyncio.get_running_loop().create_future()

    async def act(self, ctx: AgentContext) -> str:
        if not self.started.done():
            self.started.set_result(None)
        while True:
            command = await self.commands.get()
            if command is None:
                return "done"
            ctx.turns += 1
            try:
                res = await ctx.run(command, timeout=COMMAND_TIMEOUT_S)
                out = res.stdout + res.stderr
                if res.timed_out:
                    out += f"\n[timed out after {COMMAND_TIMEOUT_S:.0f} s]"
                text = out[-OUTPUT_CHARS:] if out.strip() else f"(no output, exit code {res.exit_code})"
            except TimeoutError:
                await self.outputs.put("[the episode's time is up]")
                return "agent_timeout"
            except Exception as e:
                text = f"[error: {type(e).__name__}: {e}]"
            await self.outputs.put(text)


_ENVS: weakref.WeakSet[SandfleetBashEnv] = weakref.WeakSet()


class SandfleetBashEnv:
    """A TRL ``environment_factory`` environment: one sandfleet sandbox per episode, one
    ``bash`` tool.

    TRL calls ``reset(**row)`` (synchronously) with each dataset row, exposes every other
    public method as a tool, and adds ``get_reward`` as a reward function. The sandbox lives
    on this environment's own event loop, on a thread, because TRL's tool loop is synchronous.
    """

    runner: Runner | None = None
    """Class-wide :class:`Runner` (settings, CPU quota, ``on_result``); set it before training."""
    PROMPT_SUFFIX = "\n\nUse the bash tool to run commands in the sandbox; stop when the task is done."

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="sandfleet-bash-env")
        self._thread.start()
        self._episode: _Episode | None = None
        self._job: asyncio.Future[RolloutResult] | None = None
        self._reward: float | None = None
        self._rewarded = False
        self.result: RolloutResult | None = None
        """The last finished episode's rollout."""
        _ENVS.add(self)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reset(self, **row: Any) -> str:
        """Start a sandbox for ``row["sandfleet_task"]``; the task's instruction."""
        if TASK_KEY not in row:
            raise KeyError(f"the dataset row has no {TASK_KEY!r} (a task folder or a name under $SANDFLEET_TASKS)")
        self._finish()  # a pooled instance: end the previous episode (scored or not)
        task = resolve_task(str(row[TASK_KEY]))
        self._reward, self._rewarded = None, False
        self._run(self._start(task))
        return task.instruction + self.PROMPT_SUFFIX

    async def _start(self, task: Task) -> None:
        runner = type(self).runner or Runner()
        self._episode = episode = _Episode()
        # one attempt: the episode's commands are the model's, they can't be replayed
        self._job = asyncio.ensure_future(runner.rollout(task, episode, retry=RetryPolicy(max_attempts=1)))
        waits: list[asyncio.Future[Any]] = [self._job, episode.started]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        # if the rollout ended before the agent's turn (it failed to start), the tool says so
        # and get_reward() scores 0

    def bash(self, command: str) -> str:
        """Run a bash command in the task's sandbox and return its output.

        Args:
            command: The bash command to run (in the task's working directory; the shell session persists).

        Returns:
            The command's standard output and error.
        """
        if self._episode is None or self._job is None or self._job.done():
            return "[no running sandbox: the episode has ended]"
        return str(self._run(self._bash(command)))

    async def _bash(self, command: str) -> str:
        assert self._episode is not None and self._job is not None
        await self._episode.commands.put(command)
        got = asyncio.ensure_future(self._episode.outputs.get())
        waits: list[asyncio.Future[Any]] = [got, self._job]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if got.done():
            return got.result()
        got.cancel()
        return "[the sandbox stopped]"

    def get_reward(self) -> float | None:
        """Run the task's verifier on the sandbox, close it; the reward by the episode's verdict
        (0.0 for a policy fault; None, masked, for an infra fault: the episode can't be run
        again, its commands were the model's)."""
        if not self._rewarded:
            result = self._finish()
            self._reward = reward_of(result) if result is not None else 0.0
            self._rewarded = True
        return self._reward

    def _finish(self) -> RolloutResult | None:
        if self._job is None:
            return None
        job, episode = self._job, self._episode
        self._job = self._episode = None

        async def stop() -> RolloutResult:
            if episode is not None:
                await episode.commands.put(None)
            return await job

        self.result = self._run(stop())
        return self.result

    # not public methods: TRL makes every public method of an environment a tool
    def _close(self) -> None:
        """End the episode (its sandbox closed) and this environment's loop."""
        self._finish()
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()
        _ENVS.discard(self)

    @classmethod
    def close_all(cls) -> int:
        """End every live environment's episode (each sandbox closed) and loop; how many."""
        envs = list(_ENVS)
        for env in envs:
            env._close()
        return len(envs)

    def __del__(self) -> None:  # a TRL pool drops instances without closing them
        try:
            if self._job is not None and not self._loop.is_closed() and self._thread.is_alive():
                self._finish()
        except Exception:
            pass


_DIGEST = ('for p in "$@"; do if [ -d "$p" ]; then echo "d $p"; elif [ -f "$p" ]; then '
           'echo "f $p $(sha256sum < "$p" | cut -c1-16)"; else echo "- $p"; fi; done')


class _ThenDigest:
    """Runs ``policy``, then records a digest of ``paths`` (relative to the workdir) in
    ``info["digest"]``: what the task's outputs are after the agent, before the verifier."""

    def __init__(self, policy: Policy, paths: Sequence[str]):
        self.policy, self.paths = policy, list(paths)
        self.name = f"{policy.name}+digest"

    async def act(self, ctx: AgentContext) -> str:
        stop = await self.policy.act(ctx)
        if self.paths:
            res = await ctx.sandbox.exec(["bash", "-c", _DIGEST, "digest", *self.paths], cwd=ctx.task.workdir,
                                         timeout=COMMAND_TIMEOUT_S)  # fmt: skip
            ctx.info["digest"] = res.stdout
        return stop


def task_outputs(task: Task) -> list[str]:
    """The paths a task is about, from ``tests/expected.json`` ``outputs`` (generated tasks,
    :mod:`sandfleet.tasks.generate`); empty for other tasks."""
    import json

    spec = task.path / "tests" / "expected.json"
    try:
        outputs = json.loads(spec.read_text()).get("outputs", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [str(p) for p in outputs] if isinstance(outputs, list) else []


RESIDUAL_FLAGS = {"conftest.py": "workdir_conftest", PTH_RISK: "workdir_pth", TOOL_CONFIG_RISK: "workdir_tool_config"}
"""Prefixes of ``info.verifier_risks`` (rollout/verifier.py) and the flag each raises."""


class HackMonitor:
    """Flags rewarded completions the reward may be wrong about.

    For a completion that earned a reward, it re-runs the script in a fresh sandbox and
    compares: a re-run that scores lower than the training reward (``rerun_lower``: the
    reward depended on luck or state, not the script), and, for reward 1, the task's outputs
    against those the oracle (the reference solution) leaves (``oracle_disagrees``: the
    verifier accepted something the oracle would not produce), and a re-run whose workdir held a
    ``conftest.py`` (``workdir_conftest``: pytest may have loaded the agent's code into the
    tests, docs/security.md's residual risk), a virtual environment's ``.pth`` file
    (``workdir_pth``) or tool configuration the tests' tools read (``workdir_tool_config``). Each flag is a dict; the
    rollouts of the re-runs go to the runner's ``on_result`` like any other."""

    def __init__(self, runner: Runner, *, timeout_s: float = COMMAND_TIMEOUT_S):
        self.runner = runner
        self.timeout_s = timeout_s
        self._oracle: dict[str, asyncio.Future[str]] = {}

    async def oracle_digest(self, task: Task) -> str:
        """The digest of the task's outputs after the oracle: one run per task, shared by
        concurrent checks."""
        if task.name not in self._oracle:
            self._oracle[task.name] = asyncio.ensure_future(self._run_oracle(task))
        return await asyncio.shield(self._oracle[task.name])

    async def _run_oracle(self, task: Task) -> str:
        from sandfleet.rollout.policy import OraclePolicy

        done = await self.runner.rollout(task, _ThenDigest(OraclePolicy(), task_outputs(task)),
                                         info={"monitor": "oracle"})  # fmt: skip
        return str(done.info.get("digest", ""))

    async def check(self, task: Task, script: str, reward: float) -> dict[str, Any] | None:
        """A flag for this completion, or None when nothing disagrees (or it earned nothing)."""
        if reward <= 0:
            return None
        outputs = task_outputs(task)
        rerun = await self.runner.rollout(task, _ThenDigest(ScriptPolicy(script, self.timeout_s), outputs),
                                          info={"monitor": "rerun"})  # fmt: skip
        flags: list[str] = []
        again = reward_of(rerun)
        if again is not None and again < reward:  # a masked rerun says nothing
            flags.append("rerun_lower")
        oracle = None
        # the residual risks of docs/security.md: code of the agent the tests may have run
        hits = {str(x): flag for x in rerun.info.get("verifier_risks", [])
                for prefix, flag in RESIDUAL_FLAGS.items() if str(x).startswith(prefix)}
        risks = list(hits)
        flags += sorted(set(hits.values()))
        if reward >= 1 and outputs:
            oracle = await self.oracle_digest(task)
            if rerun.status == "completed" and rerun.info.get("digest") != oracle:
                flags.append("oracle_disagrees")
        if not flags:
            return None
        return {"task": task.name, "flags": flags, "reward": reward, "rerun_reward": again, "script": script[:2000],
                "digest": rerun.info.get("digest"), "oracle_digest": oracle, "risks": risks}


# -- trees (``--branch``, issue 44): a GRPO group of branched rollouts, per-turn tree advantages
#    (the token machinery is shared with the verl integration: sandfleet.integrations._tokens)
class TrlTreeAgent(TreeAgent):
    """:class:`TreeAgent` as a TRL tree names it in traces and records (``agent: trl-tree``)."""

    name = "trl-tree"


class TreeRollout:
    """A TRL ``rollout_func`` whose GRPO groups are trees (``--branch``, docs/trees.md).

    TRL gives it each prompt ``num_generations`` times in a row; each block is one group of
    ``num_generations / leaves`` trees (the plan's leaves must divide it). Each tree is a
    sandfleet branched rollout of the row's task: the trainer's model (a :class:`TokenEngine`)
    takes turns in a sandbox, which splits at the plan's turns into children that sample on
    with their own seeds; every leaf runs the task's verifier. It returns, per leaf, the
    trajectory's tokens (``prompt_ids``, ``completion_ids``, ``env_mask``: 1 on the model's
    tokens, 0 on the template and the commands' output) and, as extra fields TRL passes on,
    ``sandfleet_reward`` (the leaf's reward by its verdict: None masks it) and
    ``sandfleet_tree_advantages`` (per completion token: the tree advantage of the turn it was
    sampled in). :func:`tree_reward` hands the rewards to TRL (its group advantage over the
    group's leaves); :func:`tree_trainer` makes the ``GRPOTrainer`` that adds the tree advantage
    per token.

    Args:
        engine: the trainer's model, or a callable that takes the trainer and returns it.
        branch: ``TURN:WIDTH[,...]``, or a :class:`~sandfleet.rollout.tree.BranchPlan`.
        tasks: the dataset's rows (``prompt`` and ``sandfleet_task``): TRL passes a rollout
            function the prompts only, so the task is found by its prompt.
    """

    def __init__(self, engine: Any, branch: Any, tasks: Sequence[dict[str, Any]], *, runner: Runner | None = None,
                 agent_config: Any = None, tasks_root: str | None = None, processes: str = "error",
                 seed: int = 0):
        import json

        from sandfleet.rollout.loop import AgentConfig
        from sandfleet.rollout.tree import BranchPlan, parse_branch

        self.engine = engine
        self.plan: BranchPlan = branch if isinstance(branch, BranchPlan) else parse_branch(str(branch))
        self.runner = runner or Runner()
        self.config = agent_config or AgentConfig(tool_mode="text", max_turns=self.plan.levels[-1][0] + 1)
        if self.config.tool_mode != "text":
            raise ValueError("a TreeRollout's agent writes fenced bash blocks: agent_config.tool_mode must be 'text'")
        self.tasks: dict[str, str] = {}
        for row in tasks:
            if "prompt" not in row or TASK_KEY not in row:
                raise KeyError(f"each row needs 'prompt' and {TASK_KEY!r}; got {sorted(row)}")
            self.tasks[json.dumps(row["prompt"], sort_keys=True)] = str(row[TASK_KEY])
        self.tasks_root = tasks_root
        self.processes = processes
        self.seed = seed
        self.calls = 0
        self.rows: list[TreeRow] = []
        """The last call's rows, in TRL's order."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="sandfleet-tree-rollout")
        self._thread.start()

    def task_of(self, prompt: Any) -> str:
        import json

        ref = self.tasks.get(json.dumps(prompt, sort_keys=True))
        if ref is None:
            raise KeyError(f"a prompt that is in none of the rows given to TreeRollout: {str(prompt)[:200]}")
        return ref

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's ``rollout_func(prompts, trainer)``."""
        n = int(getattr(trainer, "num_generations", 0) or 0) if trainer is not None else 0
        if not getattr(getattr(trainer, "model", None), "training", True):
            n = int(getattr(trainer, "num_generations_eval", 0) or n)
        engine = self.engine if hasattr(self.engine, "generate") else self.engine(trainer)
        rows = asyncio.run_coroutine_threadsafe(self.rollout(prompts, n or len(prompts), engine), self._loop).result()
        return {
            "prompt_ids": [r.prompt_ids for r in rows],
            "completion_ids": [r.completion_ids for r in rows],
            "logprobs": None,
            "env_mask": [r.env_mask for r in rows],
            "sandfleet_reward": [r.reward for r in rows],
            "sandfleet_tree_advantages": [r.tree_advantages for r in rows],
        }

    async def rollout(self, prompts: list[Any], num_generations: int, engine: TokenEngine) -> list[TreeRow]:
        """The rows of ``prompts`` (each block of ``num_generations`` one group of trees)."""
        leaves = self.plan.leaves
        if num_generations % leaves or len(prompts) % num_generations:
            raise ValueError(f"--branch {self.plan} grows {leaves} leaves per tree: num_generations "
                             f"({num_generations}) must be a multiple of it, and the batch ({len(prompts)}) a "
                             f"multiple of num_generations")  # fmt: skip
        call = self.calls
        self.calls += 1
        model = TokenModel(engine)
        groups = [prompts[i:i + num_generations] for i in range(0, len(prompts), num_generations)]
        done = await asyncio.gather(*(self._group(g, gi, call, num_generations // leaves, model)
                                      for gi, g in enumerate(groups)))  # fmt: skip
        self.rows = [row for group in done for row in group]
        return self.rows

    async def _group(self, prompts: list[Any], index: int, call: int, trees: int,
                     model: TokenModel) -> list[TreeRow]:
        prompt = prompts[0]
        task = resolve_task(self.task_of(prompt), self.tasks_root)
        base = self.seed + 1_000_003 * call + 10_007 * index
        return await grow_group(self.runner, task, prompt, self.plan, trees, model,
                                lambda k: self._agent(prompt, model, base), processes=self.processes)

    def _agent(self, prompt: Any, model: TokenModel, seed: int) -> TreeAgent:
        return TrlTreeAgent("", prompt, model=model, request_kwargs={"seed": seed}, config=self.config)

    def close(self) -> None:
        """Stop this rollout function's event loop."""
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()


def tree_reward(prompts: Any = None, completions: Any = None, sandfleet_reward: list[float | None] | None = None,
                **kwargs: Any) -> list[float | None]:
    """The TRL reward function of a :class:`TreeRollout`: each leaf's reward (None for a masked
    leaf or a filler row: TRL leaves it out of its group's statistics, advantage 0)."""
    if sandfleet_reward is None:
        raise KeyError("tree_reward needs the sandfleet_reward field a TreeRollout returns (rollout_func=TreeRollout)")
    return list(sandfleet_reward)


tree_reward.__name__ = "sandfleet"


def tree_trainer(combine: str = "sum") -> type:
    """A ``trl.GRPOTrainer`` subclass whose advantages are per token (TRL's own way: its loss
    takes a (B, T) advantage from a subclass): TRL's group advantage of each completion, plus
    (``sum``) or in place of it (``tree``) the tree advantage of the turn each token was sampled
    in (``sandfleet_tree_advantages``); ``group`` keeps TRL's as it is. Its
    :attr:`tree_advantages` is the last batch's (B, T) tensor."""
    if combine not in COMBINE:
        raise ValueError(f"combine must be one of {', '.join(COMBINE)}, not {combine!r}")
    import torch
    from trl import GRPOTrainer

    class SandfleetTreeGRPOTrainer(GRPOTrainer):
        tree_combine = combine
        tree_advantages: Any = None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            if self.tree_combine == "group":
                return out
            group = out["advantages"]
            width = out["completion_ids"].shape[1]
            tokens = torch.zeros((len(inputs), width), dtype=group.dtype, device=group.device)
            for i, row in enumerate(inputs):
                per = combine_advantages(float(group[i]), list(row.get("sandfleet_tree_advantages") or [])[:width],
                                         self.tree_combine)  # fmt: skip
                if per:
                    tokens[i, : len(per)] = torch.tensor(per, dtype=group.dtype)
            out["advantages"] = tokens
            self.tree_advantages = tokens
            return out

    return SandfleetTreeGRPOTrainer


class HFEngine:
    """A :class:`TokenEngine` over a transformers causal LM and its tokenizer (the trainer's
    own model: sampling with it is on-policy). One generation at a time, on a thread; a
    request's ``seed`` seeds it (in a forked RNG: the trainer's own random state is untouched)."""

    def __init__(self, model: Any, tokenizer: Any, *, temperature: float = 1.0, top_k: int | None = None,
                 max_tokens: int = 64):
        self.model, self.tok = model, tokenizer
        self.temperature, self.top_k, self.max_tokens = temperature, top_k, max_tokens
        self.eos_id = int(tokenizer.eos_token_id)
        self._lock = threading.Lock()

    def render(self, messages: list[dict[str, Any]]) -> str:
        return str(self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=skip_special))

    async def generate(self, ids: list[int], *, seed: int | None, max_tokens: int | None,
                       temperature: float | None) -> list[int]:
        return await asyncio.to_thread(self._generate, ids, seed, max_tokens, temperature)

    def _generate(self, ids: list[int], seed: int | None, max_tokens: int | None,
                  temperature: float | None) -> list[int]:
        import torch

        with self._lock, torch.no_grad(), torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            x = torch.tensor([ids], device=self.model.device)
            out = self.model.generate(x, attention_mask=torch.ones_like(x), do_sample=True,
                                      temperature=temperature or self.temperature, top_k=self.top_k,
                                      max_new_tokens=min(max_tokens or self.max_tokens, self.max_tokens),
                                      pad_token_id=self.tok.pad_token_id)  # fmt: skip
        return [int(t) for t in out[0, len(ids):].tolist()]
