"""Opt-in (marker ``verl``; scripts/test-integrations.sh verl): a branched group through verl
0.9.1's own agent loop worker and advantage code (issue 44). The bundled branch example
(examples/branch; its verl agent loop config file, examples/branch/verl/agent_loops.yaml:
``branch: "2:4"``), two groups of rollout.n = 4
rows, the policy's model a scripted token engine behind verl's ``generate`` interface, real
sandboxes: verl's ``generate_sequences`` (TreeAgentLoopWorker) returns one leaf per row with its
per-token tree advantages (``reward_baselines``), and verl's ``compute_advantage`` with
``adv_estimator=sandfleet_tree`` gives each model token its row's GRPO advantage plus the tree
advantage of its turn. No GPU, no rollout server, no Ray cluster: the worker is built without its
constructor (which loads a model from disk) and given what its methods read."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest

from test_rollout_support import needs_bwrap

pytestmark = [
    pytest.mark.verl, needs_bwrap(),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"), pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(importlib.util.find_spec("verl") is None,
                       reason="needs verl (scripts/test-integrations.sh verl installs it)"),
]

BRANCH = Path(__file__).resolve().parents[1] / "examples" / "branch"
RESPONSE_LENGTH = 1024
PROMPT_LENGTH = 1024


def char_tokenizer() -> Any:
    """A Hugging Face tokenizer over the shipped CharEngine's tokens (a character's code point + 1;
    0, ``<eos>``, ends a turn), with a chat template that renders as CharEngine does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{chr(i): i + 1 for i in range(32, 127)}, "\n": 11, "<pad>": 200, "<unk>": 201}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()  # characters joined as they are (WordLevel's default puts spaces between)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


class ScriptedServer:
    """verl's LLMServerClient as an agent loop calls it (``generate``, token in, token out), over
    the shipped scripted token engine; every request's sampling parameters kept."""

    def __init__(self, engine: Any):
        self.engine = engine
        self.params: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.params.append(dict(sampling_params))
        ids = await self.engine.generate(list(prompt_ids), seed=sampling_params.get("seed"),
                                         max_tokens=sampling_params.get("max_tokens"), temperature=None)
        return TokenOutput(token_ids=ids)


def trainer_config(loops: Path) -> Any:
    from omegaconf import OmegaConf

    rollout = {"name": "vllm", "n": 4, "prompt_length": PROMPT_LENGTH, "response_length": RESPONSE_LENGTH,
               "temperature": 1.0, "top_p": 1.0, "top_k": -1, "calculate_log_probs": False,
               "val_kwargs": {"n": 1, "top_p": 1.0, "top_k": -1, "temperature": 0.0},
               "agent": {"default_agent_loop": "single_turn_agent", "agent_loop_config_path": str(loops),
                         "num_workers": 1, "agent_loop_manager_class":
                             "sandfleet.integrations.verl_tree.TreeAgentLoopManager"},
               "multi_turn": {"tool_config_path": None}, "trace": {}}
    return OmegaConf.create({"actor_rollout_ref": {"rollout": rollout, "model": {}}, "data": {},
                             "algorithm": {"adv_estimator": "sandfleet_tree", "norm_adv_by_std_in_grpo": True}})


def worker_for(config: Any, server: ScriptedServer, tokenizer: Any) -> Any:
    """verl's agent loop worker (sandfleet's subclass) with what its methods read, the agent loop
    registry loaded from the config file as verl's constructor loads it."""
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from sandfleet.integrations.verl_tree import TreeAgentLoopWorker

    for entry in OmegaConf.load(config.actor_rollout_ref.rollout.agent.agent_loop_config_path):
        _agent_loop_registry[entry.name] = entry
    worker = object.__new__(TreeAgentLoopWorker)
    worker.config = config
    worker.rollout_config = config.actor_rollout_ref.rollout
    worker.llm_client = server
    worker.teacher_client = None
    worker.reward_loop_worker_handles = None
    worker.tokenizer = tokenizer
    worker.processor = None
    worker.hf_model_type = None
    worker.dataset_cls = None
    worker.mm_processor_kwargs = {}
    worker.distillation_enabled = False
    worker.tools = []
    return worker


async def test_verl_grows_each_group_as_a_tree_and_adds_tree_advantages(tmp_path: Path) -> None:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.utils.import_utils import load_class_from_fqn

    from sandfleet.integrations import verl_tree
    from sandfleet.sandbox.state import list_sandboxes
    from sandfleet.testing.token_engine import CharEngine

    config = trainer_config(BRANCH / "verl" / "agent_loops.yaml")  # the example's (branch "2:4")
    manager_cls = load_class_from_fqn(config.actor_rollout_ref.rollout.agent.agent_loop_manager_class,
                                      "AgentLoopManager")  # as verl's trainer loads it
    assert manager_cls is verl_tree.TreeAgentLoopManager
    manager = manager_cls(config=config, llm_client=None)  # its Ray workers are sandfleet's (none started here)
    assert "ActorClass(TreeAgentLoopWorker)" in str(type(manager.agent_loop_workers_class))
    assert get_adv_estimator_fn("sandfleet_tree") is verl_tree.tree_grpo_advantage  # registered on that import

    tok = char_tokenizer()
    assert tok.encode("<eos>", add_special_tokens=False) == [0]
    script = json.loads((BRANCH / "script.json").read_text())
    engine = CharEngine(script)
    server = ScriptedServer(engine)
    worker = worker_for(config, server, tok)
    task = BRANCH / "tasks" / "branch-demo"
    prompt = [{"role": "user", "content": (task / "instruction.md").read_text()}]
    uids = ["g1"] * 4 + ["g2"] * 4  # verl's interleaved repeat: a group's rows together
    rows = len(uids)
    batch = DataProto.from_dict(non_tensors={
        "raw_prompt": np.array([prompt] * rows, dtype=object), "uid": np.array(uids, dtype=object),
        "extra_info": np.array([{"sandfleet_task": str(task), "index": 0}] * rows, dtype=object),
        "agent_name": np.array(["sandfleet_tree"] * rows, dtype=object), "index": np.array([0] * 4 + [1] * 4)})
    batch.meta_info = {"validate": False, "global_steps": 1}
    out = await worker.generate_sequences(batch)
    assert len(verl_tree.GROUPS) == 0  # closed after the step

    # one tree per group: the prefix's 2 turns once per tree, the third once per leaf
    assert len(engine.requests) == 2 * (2 + 4)
    assert {p.get("temperature") for p in server.params} == {1.0}  # verl's sampling parameters
    assert len({p.get("seed") for p in server.params[-8:]}) >= 4  # a child samples with a seed of its own
    mask = out.batch["response_mask"]
    scores = out.batch["rm_scores"].sum(dim=-1)
    tree = out.batch["reward_baselines"]
    assert tree.shape == mask.shape == (rows, RESPONSE_LENGTH)
    info = list(out.non_tensor_batch["sandfleet"])
    for g in (slice(0, 4), slice(4, 8)):
        assert sorted(scores[g].tolist()) == [0.0, 0.0, 1.0, 1.0]  # two children write 42, two 41
        nodes = sorted(i["tree"]["node_id"] for i in info[g])
        assert nodes == ["0.0", "0.1", "0.2", "0.3"] and len({i["tree"]["tree_id"] for i in info[g]}) == 1
    for i in range(rows):
        r = float(scores[i])
        on = mask[i].bool()
        assert info[i]["reward"] == r and info[i]["verdict"] == "scored"
        # the tree advantage on the model's tokens: 0 on the root's two turns, r - 0.5 on the leaf's
        assert set(tree[i][on].tolist()) == {0.0, r - 0.5}
        assert not tree[i][~on].any()

    # verl's advantage step, as its trainer makes it (token_level_rewards = rm_scores, the group's uid)
    data = out
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    data.non_tensor_batch["uid"] = np.array(uids, dtype=object)
    try:
        from verl.trainer.ppo.ray_trainer import compute_advantage
    except ImportError as e:  # pragma: no cover - the trainer module's own imports
        pytest.skip(f"verl's trainer module does not import here: {e}")
    data = compute_advantage(data, adv_estimator="sandfleet_tree", num_repeat=4, config=config.algorithm)
    adv = data.batch["advantages"]
    std = float(torch.tensor([0.0, 0.0, 1.0, 1.0]).std())
    for i in range(rows):
        r = float(scores[i])
        on = mask[i].bool()
        group = (r - 0.5) / (std + 1e-6)
        want = {round(group, 4), round(group + r - 0.5, 4)}  # the prefix's turns, the leaf's turn
        assert {round(v, 4) for v in adv[i][on].tolist()} == want, (i, r)
        assert not adv[i][~on].any()

    # a masked row (an infra fault's leaf: mask all 0) is left out of its group's mean and std
    masked_mask = mask.clone()
    masked_mask[0] = 0
    a2, _ = verl_tree.tree_grpo_advantage(data.batch["token_level_rewards"], masked_mask, np.array(uids, dtype=object),
                                          tree, config.algorithm)  # fmt: skip
    rest = scores[1:4]
    m, s = float(rest.mean()), float(rest.std())
    assert not a2[0].any()
    for i in range(1, 4):
        r = float(scores[i])
        group = (r - m) / (s + 1e-6)
        assert {round(v, 4) for v in a2[i][masked_mask[i].bool()].tolist()} == {round(group, 4),
                                                                              round(group + r - 0.5, 4)}
    assert [x for x in list_sandboxes() if x.get("owner_pid") == os.getpid()] == []
    assert {i["rollout_id"].split("#")[0] for i in info} == {"branch-demo"}


async def test_a_group_cut_between_workers_and_a_plan_that_does_not_divide_n_are_refused(tmp_path: Path) -> None:
    import numpy as np
    from verl import DataProto

    from sandfleet.errors import ConfigError
    from sandfleet.testing.token_engine import CharEngine

    loops = tmp_path / "agent_loops.yaml"
    loops.write_text('- name: sandfleet_tree\n  _target_: sandfleet.integrations.verl_tree.TreeAgentLoop\n'
                     '  branch: "2:3"\n')
    config = trainer_config(loops)
    worker = worker_for(config, ScriptedServer(CharEngine([])), char_tokenizer())
    task = BRANCH / "tasks" / "branch-demo"

    def batch(uids: list[str]) -> Any:
        b = DataProto.from_dict(non_tensors={
            "raw_prompt": np.array([[{"role": "user", "content": "go"}]] * len(uids), dtype=object),
            "uid": np.array(uids, dtype=object), "index": np.arange(len(uids)),
            "extra_info": np.array([{"sandfleet_task": str(task)}] * len(uids), dtype=object),
            "agent_name": np.array(["sandfleet_tree"] * len(uids), dtype=object)})
        b.meta_info = {"validate": False}
        return b

    with pytest.raises(ConfigError, match="can't be split between workers"):
        await worker.generate_sequences(batch(["a", "a", "b", "b", "b", "b"]))
    with pytest.raises(ConfigError, match="grows 3 leaves per tree"):
        await worker.generate_sequences(batch(["a"] * 4))


def test_the_examples_dataset_rows_name_the_task_and_the_agent_loop(tmp_path: Path) -> None:
    import subprocess
    import sys

    from datasets import Dataset

    subprocess.run([sys.executable, str(BRANCH / "verl" / "make_data.py"), str(tmp_path), "3"], check=True,
                   capture_output=True)
    rows = Dataset.from_parquet(str(tmp_path / "train.parquet")).to_list()
    assert len(rows) == 3 and {r["agent_name"] for r in rows} == {"sandfleet_tree"}
    from sandfleet.integrations.verl_tree import task_of

    assert Path(task_of(rows[0])) == BRANCH / "tasks" / "branch-demo"
    assert rows[0]["prompt"][0]["role"] == "user" and "prefix" in rows[0]["prompt"][0]["content"].lower()
