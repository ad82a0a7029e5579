"""verl: branched rollouts (``--branch``, issue 44) as verl's GRPO groups, each token's advantage
verl's group advantage plus the tree advantage of the turn it was sampled in (docs/trees.md).

Three pieces, each in verl's own extension point (verl 0.9.1):

- **an agent loop**, ``TreeAgentLoop``, listed in the agent loop config file
  (``actor_rollout_ref.rollout.agent.agent_loop_config_path``)::

      - name: sandfleet_tree
        _target_: sandfleet.integrations.verl_tree.TreeAgentLoop
        branch: "2:4"          # TURN:WIDTH[,...], as `sandfleet run --branch`
        max_turns: 4           # optional: the agent's turns (default: the last split's turn + 1)
        # tasks_root, processes ("error" or "drop"), max_tokens_per_turn: optional

  and named by the dataset's rows (``agent_name: sandfleet_tree``, or
  ``agent.default_agent_loop``). A row gives its task in ``extra_info.sandfleet_task`` (a task
  folder, or a name under ``$SANDFLEET_TASKS``) and the conversation in ``raw_prompt``.
- **an agent loop manager**, ``TreeAgentLoopManager``
  (``actor_rollout_ref.rollout.agent.agent_loop_manager_class=``
  ``sandfleet.integrations.verl_tree.TreeAgentLoopManager``), whose workers
  (``TreeAgentLoopWorker``) know each group's rows and hand each row's per-token tree advantages
  to the trainer.
- **an advantage estimator**, ``algorithm.adv_estimator=sandfleet_tree`` (registered with
  ``core_algos.register_adv_est`` when this module is imported: verl's trainer imports it when
  it loads the manager class).

How a group becomes a tree: verl repeats each prompt ``rollout.n`` times (one ``uid``) and calls
the agent loop once per row, all rows of a worker's chunk at once in one event loop. The first
row of a group to run grows the whole group -- ``n / leaves`` sandfleet trees of the row's task
(:func:`sandfleet.integrations._tokens.grow_group`), the policy's model sampled through verl's
own rollout servers (:class:`VerlEngine`, token in, token out) -- and every row of the group
takes one leaf: its prompt and response tokens as sampled (``response_mask`` 1 on the model's
tokens, 0 on the template and the commands' output), ``reward_score`` the leaf's reward by its
verdict. A leaf masked as an infra fault has a ``response_mask`` of zeros (nothing trained) and
is left out of its group's mean and std. The prefix's model calls and commands run once.

The advantage: verl hands a registered estimator only ``token_level_rewards``,
``response_mask``, ``index`` (the group's ``uid``), ``config`` and, when the batch has it,
``reward_baselines``. The workers put each row's per-token tree advantages in the batch as
``reward_baselines`` (B x response length), which the ``sandfleet_tree`` estimator reads as
that: each token's advantage is verl's GRPO advantage of its row (``norm_adv_by_std_in_grpo``
honoured; the masked rows left out) plus the tree advantage of its turn, on the model's tokens.

Rules (a clear ConfigError otherwise): ``rollout.n`` (``val_kwargs.n`` in validation) a multiple
of the plan's leaves, and a group never split between two workers (the batch size a multiple of
``agent.num_workers``). Rollout log-probs are not returned (verl recomputes ``old_log_probs``, its
default); a response longer than ``response_length`` is cut there, as verl's own loops cut it.

Needs verl 0.9.1 (``scripts/test-integrations.sh verl`` runs tests/test_verl_tree.py in it);
without verl the module imports, and only its verl classes are missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from sandfleet.errors import ConfigError
from sandfleet.integrations._common import Runner, resolve_task
from sandfleet.integrations._tokens import TokenModel, TreeAgent, TreeRow, grow_group

AGENT_NAME = "sandfleet_tree"
"""The agent loop's name in the examples and the docs (the config file names it)."""
ESTIMATOR = "sandfleet_tree"
"""``algorithm.adv_estimator`` of the tree advantage."""
TASK_KEY = "sandfleet_task"
"""The key of a row's ``extra_info`` (or a column of its own) that names its task."""
TOKENS_KEY = "sandfleet_tree_advantages"
"""The extra field that carries a row's per-token tree advantages from the loop to its worker."""
BATCH_KEY = "reward_baselines"
"""The batch key the per-token tree advantages travel under: the only one verl passes an estimator."""
SEED_KEYS = {"vllm": "seed", "sglang": "sampling_seed"}
"""Where each rollout server takes a request's seed (a branch's children sample with their own)."""


class VerlEngine:
    """A :class:`~sandfleet.integrations._tokens.TokenEngine` over verl's rollout servers (its
    ``LLMServerClient``: ``generate(request_id, prompt_ids=..., sampling_params=...)``, token in,
    token out) and the model's tokenizer and chat template. verl's sampling parameters go into
    every request; a request's seed, where the server takes one, under its key."""

    def __init__(self, server: Any, tokenizer: Any, sampling_params: dict[str, Any], *,
                 chat_template_kwargs: dict[str, Any] | None = None, seed_key: str | None = None):
        self.server = server
        self.tokenizer = tokenizer
        self.sampling_params = dict(sampling_params)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.seed_key = seed_key
        self.eos_id = int(tokenizer.eos_token_id)
        self.generate_s = 0.0
        """Seconds spent in the servers' ``generate``, all requests."""

    def render(self, messages: list[dict[str, Any]]) -> str:
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      **self.chat_template_kwargs))  # fmt: skip

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special))

    async def generate(self, ids: list[int], *, seed: int | None, max_tokens: int | None,
                       temperature: float | None) -> list[int]:
        params = dict(self.sampling_params)  # verl's temperature wins over the agent's
        if max_tokens:
            params["max_tokens"] = max_tokens
        if seed is not None and self.seed_key:
            params[self.seed_key] = seed
        start = time.perf_counter()
        try:
            out = await self.server.generate(request_id=uuid4().hex, prompt_ids=list(ids), sampling_params=params)
        finally:
            self.generate_s += time.perf_counter() - start
        return [int(t) for t in out.token_ids]


class VerlTreeAgent(TreeAgent):
    """:class:`TreeAgent` as a verl tree names it in traces and records (``agent: verl-tree``)."""

    name = "verl-tree"


def seed_of(uid: Any) -> int:
    """A group's base seed, from its ``uid`` (stable across processes, unlike ``hash``)."""
    return int(hashlib.sha256(str(uid).encode()).hexdigest()[:8], 16)


def task_of(row: dict[str, Any]) -> str:
    """The task a row names: ``extra_info["sandfleet_task"]``, else a ``sandfleet_task`` column."""
    extra = row.get("extra_info")
    ref = extra.get(TASK_KEY) if isinstance(extra, dict) else None
    ref = ref if ref is not None else row.get(TASK_KEY)
    if not ref:
        raise ConfigError(f"a {AGENT_NAME} row needs its task in extra_info[{TASK_KEY!r}] (a task folder, or a name "
                          f"under $SANDFLEET_TASKS); this row has {sorted(row)}")  # fmt: skip
    return str(ref)


@dataclass
class _Group:
    """One uid's rows in a worker's chunk: how many, how many have taken their leaf, the growth."""

    size: int
    claimed: int = 0
    growth: asyncio.Task[list[TreeRow]] | None = None
    engine: VerlEngine | None = None
    """The group's engine, once its growth started (its ``generate_s`` is the rows' model time)."""


class TreeGroups:
    """The groups a worker is generating (``uid`` -> rows): its ``generate_sequences`` opens
    them before verl runs the rows' agent loops and closes them after; each row's loop claims
    the next leaf of its group, and the first to claim grows the group."""

    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}

    def open(self, uids: Sequence[Any], expected: int | None = None) -> list[str]:
        """Open a group per uid of ``uids`` (a chunk's rows, in order), sized by its rows there.
        ``expected``: the group size verl was configured with; a group of another size in this
        chunk was split between workers (ConfigError)."""
        sizes = Counter(str(u) for u in uids)
        for uid, size in sizes.items():
            if expected is not None and size != expected:
                raise ConfigError(f"group {uid} has {size} of its {expected} rows in this agent loop worker: a "
                                  f"{AGENT_NAME} group is one tree set and can't be split between workers (make the "
                                  f"batch size a multiple of actor_rollout_ref.rollout.agent.num_workers)")  # fmt: skip
            if uid in self._groups:
                raise ConfigError(f"group {uid} is already being generated")
        for uid, size in sizes.items():
            self._groups[uid] = _Group(size)
        return list(sizes)

    def close(self, uids: Sequence[str]) -> None:
        """Forget these groups; a growth still running (its rows were cancelled) is cancelled."""
        for uid in uids:
            group = self._groups.pop(uid, None)
            if group is not None and group.growth is not None and not group.growth.done():
                group.growth.cancel()

    def claim(self, uid: Any) -> tuple[_Group, int]:
        """The row's group and the index of its leaf (rows claim in the order they run)."""
        group = self._groups.get(str(uid))
        if group is None:
            raise ConfigError(f"the {AGENT_NAME} agent loop runs under its manager: set actor_rollout_ref.rollout."
                              f"agent.agent_loop_manager_class=sandfleet.integrations.verl_tree.TreeAgentLoopManager "
                              f"(no group {uid} is open in this worker)")  # fmt: skip
        if group.claimed >= group.size:
            raise ConfigError(f"group {uid} has {group.size} rows and all have taken their leaf")
        group.claimed += 1
        return group, group.claimed - 1

    def __len__(self) -> int:
        return len(self._groups)


GROUPS = TreeGroups()
"""This process's open groups (an agent loop worker is one process, its rows one event loop)."""
RUNNER = Runner(run_id="verl")
"""How the trees are grown: the process's settings (backend, network, remote) from the environment."""


def leaf_fields(row: TreeRow, response_length: int) -> dict[str, Any]:
    """A leaf's ``AgentLoopOutput`` fields: its tokens (the response cut at ``response_length``),
    the mask (all 0 for a masked leaf: an infra fault, a broken or missing trajectory), the
    reward (0.0 for a masked leaf), the per-token tree advantages (``extra_fields``), and what
    sandfleet knows of it (``extra_fields["sandfleet"]``: reward, verdict, lineage, per-turn tree
    advantages, rollout id)."""
    from sandfleet.rollout.verdict import verdict_of

    masked = row.reward is None
    ids = row.completion_ids[:response_length]
    mask = [0] * len(ids) if masked else row.env_mask[:response_length]
    leaf = row.leaf
    info = {"reward": row.reward, "verdict": verdict_of(leaf) if leaf is not None else None,
            "tree": leaf.tree if leaf is not None else None,
            "tree_advantages": leaf.tree_advantages if leaf is not None else None,
            "rollout_id": leaf.rollout_id if leaf is not None else None,
            "cut": len(row.completion_ids) > response_length}  # fmt: skip
    turns = leaf.turns if leaf is not None else 0
    return {"prompt_ids": list(row.prompt_ids), "response_ids": list(ids), "response_mask": list(mask),
            "reward_score": 0.0 if masked else float(row.reward or 0.0), "num_turns": 1 + 2 * turns,
            "extra_fields": {TOKENS_KEY: [0.0] * len(ids) if masked else list(row.tree_advantages[:response_length]),
                             "sandfleet": info, "turn_scores": [], "tool_rewards": []}}  # fmt: skip


def tree_advantage_rows(per_row: Sequence[Sequence[float] | None], width: int) -> Any:
    """The batch tensor (rows x ``width``, float32) of the rows' per-token tree advantages, each
    row's from the response's first token (right-padded with 0, as verl pads responses)."""
    import torch

    out = torch.zeros((len(per_row), width), dtype=torch.float32)
    for i, per in enumerate(per_row):
        if per:
            vals = list(per)[:width]
            out[i, : len(vals)] = torch.tensor(vals, dtype=torch.float32)
    return out


def tree_grpo_advantage(token_level_rewards: Any, response_mask: Any, index: Any = None, reward_baselines: Any = None,
                        config: Any = None, **_: Any) -> tuple[Any, Any]:
    """The ``sandfleet_tree`` estimator: verl's GRPO outcome advantage of each row over its group
    (the rows with a mask, ``norm_adv_by_std_in_grpo`` from the algorithm's config), plus each
    model token's tree advantage (``reward_baselines``, per token); rows with no mask get 0.
    Returns (advantages, returns), both that."""
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    norm = bool(config.get("norm_adv_by_std_in_grpo", True)) if config is not None else True
    rows = token_level_rewards.shape[0]
    index = np.asarray(index if index is not None else np.arange(rows), dtype=object)
    adv = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    valid = (response_mask.sum(dim=-1) > 0).nonzero(as_tuple=True)[0]
    if len(valid):
        group, _ = compute_grpo_outcome_advantage(token_level_rewards[valid], response_mask[valid],
                                                  index[valid.cpu().numpy()], norm_adv_by_std_in_grpo=norm)  # fmt: skip
        adv[valid] = group.to(adv.dtype)
    if reward_baselines is not None:
        if tuple(reward_baselines.shape) != tuple(adv.shape):
            raise ValueError(f"{ESTIMATOR}: {BATCH_KEY} must be per token {tuple(adv.shape)}, not "
                             f"{tuple(reward_baselines.shape)} (the batch came from another agent loop manager?)")
        adv = adv + reward_baselines.to(adv.dtype) * response_mask
    return adv, adv


# -- verl's classes (where verl is installed)

try:
    _loop_mod = importlib.import_module("verl.experimental.agent_loop.agent_loop")
    _LoopBase: type = _loop_mod.AgentLoopBase
    _WorkerBase: type = _loop_mod.AgentLoopWorker
    _ManagerBase: type = _loop_mod.AgentLoopManager
    _Output: Any = _loop_mod.AgentLoopOutput
    _register_loop: Any = _loop_mod.register
    _core_algos: Any = importlib.import_module("verl.trainer.ppo.core_algos")
    HAVE_VERL = True
except ImportError:
    _LoopBase = _WorkerBase = _ManagerBase = object
    _Output = _register_loop = _core_algos = None
    HAVE_VERL = False


class TreeAgentLoop(_LoopBase):
    """verl's agent loop for a row of a branched group: the first row of its group to run grows
    the group's trees, each row answers one leaf (its ``AgentLoopOutput``)."""

    def __init__(self, *args: Any, branch: str | None = None, max_turns: int | None = None,
                 tasks_root: str | None = None, processes: str = "error", max_tokens_per_turn: int | None = None,
                 **kwargs: Any):
        if not HAVE_VERL:
            raise ImportError("TreeAgentLoop is verl's agent loop: install verl (0.9.1)")
        super().__init__(*args, **kwargs)
        from sandfleet.rollout.loop import AgentConfig
        from sandfleet.rollout.tree import parse_branch

        if not branch:
            raise ConfigError(f"the {AGENT_NAME} agent loop needs `branch: TURN:WIDTH[,...]` in its entry of the "
                              f"agent loop config file (agent_loop_config_path)")  # fmt: skip
        if processes not in ("error", "drop"):
            raise ConfigError(f"processes must be 'error' or 'drop', not {processes!r}")
        self.plan = parse_branch(str(branch))
        self.tasks_root = tasks_root
        self.processes = processes
        self.agent_config = AgentConfig(tool_mode="text", max_turns=int(max_turns or self.plan.levels[-1][0] + 1),
                                        max_tokens_per_turn=max_tokens_per_turn)  # fmt: skip

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> Any:
        group, k = GROUPS.claim(kwargs.get("uid"))
        if group.growth is None:
            group.growth = asyncio.ensure_future(self._grow(group, sampling_params, kwargs))
        start = time.perf_counter()
        rows = await asyncio.shield(group.growth)
        fields = leaf_fields(rows[k], int(self.rollout_config.response_length))
        fields["prompt_ids"] = self._cap_text_prompt_length(fields["prompt_ids"])
        generate_s = group.engine.generate_s if group.engine is not None else 0.0
        wall = time.perf_counter() - start
        return _Output(**fields, metrics={"generate_sequences": generate_s, "tool_calls": max(0.0, wall - generate_s)})

    async def _grow(self, group: _Group, sampling_params: dict[str, Any], row: dict[str, Any]) -> list[TreeRow]:
        leaves = self.plan.leaves
        if group.size % leaves:
            raise ConfigError(f"--branch {self.plan} grows {leaves} leaves per tree: a {AGENT_NAME} group's rows "
                              f"(rollout.n, or val_kwargs.n in validation) must be a multiple of it, not "
                              f"{group.size}")  # fmt: skip
        task = resolve_task(task_of(row), self.tasks_root)
        prompt = [dict(m) for m in row["raw_prompt"]]
        name = str(getattr(self.rollout_config, "name", "") or "")
        engine = VerlEngine(self.server_manager, self.tokenizer, sampling_params,
                            chat_template_kwargs=self.apply_chat_template_kwargs, seed_key=SEED_KEYS.get(name))
        group.engine = engine
        model = TokenModel(engine, model="verl")
        seed = seed_of(row.get("uid"))
        return await grow_group(RUNNER, task, prompt, self.plan, group.size // leaves, model,
                                lambda _k: VerlTreeAgent("", prompt, model=model, request_kwargs={"seed": seed},
                                                         config=self.agent_config),
                                processes=self.processes)  # fmt: skip


class TreeAgentLoopWorker(_WorkerBase):
    """verl's agent loop worker with the groups of its chunk open while verl runs their rows,
    and each row's per-token tree advantages in the batch it returns (``reward_baselines``)."""

    async def generate_sequences(self, batch: Any) -> Any:
        validate = bool(batch.meta_info.get("validate", False))
        cfg = self.rollout_config
        expected = getattr(getattr(cfg, "val_kwargs", None), "n", None) if validate else getattr(cfg, "n", None)
        uids = batch.non_tensor_batch.get("uid")
        opened = GROUPS.open(list(uids) if uids is not None else [],
                             int(expected) if expected else None)  # fmt: skip
        try:
            return await super().generate_sequences(batch)
        finally:
            GROUPS.close(opened)

    def _postprocess(self, inputs: list[Any], *args: Any, **kwargs: Any) -> Any:
        per_row = [i.extra_fields.pop(TOKENS_KEY, None) for i in inputs]
        out = super()._postprocess(inputs, *args, **kwargs)
        out.batch[BATCH_KEY] = tree_advantage_rows(per_row, int(self.rollout_config.response_length))
        return out


class TreeAgentLoopManager(_ManagerBase):
    """verl's agent loop manager with :class:`TreeAgentLoopWorker` workers."""

    def __init__(self, *args: Any, **kwargs: Any):
        import ray

        self.agent_loop_workers_class = ray.remote(TreeAgentLoopWorker)
        super().__init__(*args, **kwargs)


if HAVE_VERL:
    _register_loop(AGENT_NAME)(TreeAgentLoop)
    _core_algos.register_adv_est(ESTIMATOR)(tree_grpo_advantage)
