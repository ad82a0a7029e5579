"""``sandfleet tasks generate bash-basics``: deterministic by seed, split by instance with a
held-out paraphrase per template, and every generated task valid (oracle 1, no-op 0) through
the real validation path."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sandfleet.cli import cli
from sandfleet.tasks import load_tasks
from sandfleet.tasks.generate import TEMPLATES, generate
from test_rollout_support import needs_bwrap


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_tasks_other_seed_other_data(tmp_path: Path) -> None:
    a, b, c = (generate("bash-basics", tmp_path / d, n=3, seed=s) for d, s in (("a", 7), ("b", 7), ("c", 8)))
    assert _tree(tmp_path / "a") == _tree(tmp_path / "b")
    assert [g.name for g in a] == [g.name for g in b]
    differ = [g.template for g, h in zip(a, c, strict=True)
              if _tree(g.path / "tests") != _tree(h.path / "tests")]
    assert len(differ) >= len(TEMPLATES) - 1  # a new seed draws new data (a tiny template may repeat)


def test_split_by_instance_with_a_held_out_paraphrase(tmp_path: Path) -> None:
    made = generate("bash-basics", tmp_path / "g", n=8, seed=3)
    rows = [json.loads(line) for line in (tmp_path / "g" / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == len(made) == 8 * len(TEMPLATES)
    for t in TEMPLATES:
        assert len(t.paraphrases) >= 3
        mine = [r for r in rows if r["template"] == t.name]
        train = [r for r in mine if r["split"] == "train"]
        held = [r for r in mine if r["split"] == "eval"]
        assert len(train) == 6 and len(held) == 2
        assert not {r["name"] for r in train} & {r["name"] for r in held}
        seen = {r["paraphrase"] for r in train}
        unseen = {r["paraphrase"] for r in held} - seen
        assert unseen, f"{t.name}: no unseen paraphrase in eval"
        for r in held:
            text = (tmp_path / "g" / r["path"] / "instruction.md").read_text()
            assert text.strip()
    loaded, failures = load_tasks(tmp_path / "g" / "train")
    assert not failures and len(loaded) == 6 * len(TEMPLATES)


def test_bad_input_is_named(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["tasks", "generate", "bash-basics", "--n", "1", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "--n must be at least 2" in r.output
    r = CliRunner().invoke(cli, ["tasks", "generate", "bash-basics", "--template", "nope", "--out",
                                 str(tmp_path / "y")])  # fmt: skip
    assert r.exit_code != 0 and "unknown template(s) nope" in r.output
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = CliRunner().invoke(cli, ["tasks", "generate", "bash-basics", "--out", str(tmp_path / "full")])
    assert r.exit_code != 0 and "is not empty" in r.output


@needs_bwrap()
async def test_every_generated_task_validates(tmp_path: Path) -> None:
    from sandfleet.rollout.validate import validate_tasks

    r = CliRunner().invoke(cli, ["tasks", "generate", "bash-basics", "--n", "2", "--seed", "11",
                                 "--out", str(tmp_path / "g")])  # fmt: skip
    assert r.exit_code == 0, r.output
    tasks = []
    for split in ("train", "eval"):
        loaded, failures = load_tasks(tmp_path / "g" / split)
        assert not failures
        tasks += loaded
    assert sorted(t.metadata["template"] for t in tasks) == sorted(t.name for t in TEMPLATES for _ in range(2))
    assert len(tasks) == 2 * len(TEMPLATES)
    verdicts = await validate_tasks(tasks, repeats=1, backend="bwrap")
    bad = {name: v.reason for name, v in verdicts.items() if v.status != "valid"}
    assert not bad, bad
