"""The verifier: no reward hacking, float or dict rewards, missing rewards, timeouts."""

from __future__ import annotations

from pathlib import Path

from sandfleet.rollout import ScriptedPolicy
from test_rollout_support import make_task, needs_bwrap, run

pytestmark = needs_bwrap()

SUSPICIOUS = """#!/bin/bash
[ -e /tests/planted ] && echo PLANTED
[ -e /logs/verifier/reward.txt ] && echo PREWRITTEN
echo "SLEEPERS=$(ps -eo comm | grep -c '^sleep')"
mkdir -p /logs/verifier
if [ "$(cat /app/out.txt 2>/dev/null)" = hello ]; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
sleep 0.3  # a surviving writer would overwrite the reward now
"""

HACKS = [
    "mkdir -p /tests /logs/verifier; touch /tests/planted; echo 1 > /logs/verifier/reward.txt",
    "setsid sleep 1000 > /dev/null 2>&1 < /dev/null &",
    "nohup bash -c 'while :; do mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt;"
    " sleep 0.02; done' >/dev/null 2>&1 &",
]


async def test_agent_cannot_plant_tests_prewrite_rewards_or_outlive_its_turn(tmp_path: Path) -> None:
    task = make_task(tmp_path, test_sh=SUSPICIOUS)
    r = (await run([task], ScriptedPolicy(HACKS))).results[0]
    assert r.status == "completed", r.error
    assert "PLANTED" not in r.verifier_output and "PREWRITTEN" not in r.verifier_output
    assert "SLEEPERS=0" in r.verifier_output  # every agent process was killed first
    assert r.reward == 0.0  # the background reward writer died before the tests ran
    whats = [s.get("what") for s in r.spans if s["name"] == "other_sandbox"]
    assert whats.index("stop agent") < whats.index("clear tests and rewards") < whats.index(
        "upload tests"
    )


async def test_reward_json_dict_and_missing_reward(tmp_path: Path) -> None:
    as_dict = make_task(tmp_path, "dict", test_sh=(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        'echo \'{"correct": 1, "style": 0.5}\' > /logs/verifier/reward.json\n'))  # fmt: skip
    missing = make_task(tmp_path, "missing", test_sh="#!/bin/bash\necho 'no reward today'\nexit 4\n")
    report = await run([as_dict, missing], ScriptedPolicy([]))
    d, m = report.results
    assert d.reward == 0.75 and d.reward_details == {"correct": 1.0, "style": 0.5}
    # no reward file is the agent's to answer for (it may have killed the tests): 0, not failed
    assert (m.status, m.reward, m.reason) == ("completed", 0.0, "no_reward_file")
    error = str(m.info.get("reward_error"))
    assert "no reward today" in error and "exit code 4" in error


async def test_verifier_timeout_scores_zero(tmp_path: Path) -> None:
    task = make_task(tmp_path, test_sh="#!/bin/bash\nsleep 30\n", verifier_timeout=1)
    r = (await run([task], ScriptedPolicy([]))).results[0]
    assert r.status == "completed" and r.reward == 0.0 and r.info["verifier_timed_out"]
    assert r.duration < 10


async def test_verifier_user_home_and_environment(tmp_path: Path) -> None:
    probe = ("#!/bin/bash\nmkdir -p /logs/verifier; echo 0 > /logs/verifier/reward.txt\n"
             'echo "UID=$(id -u) HOME=$HOME NOUSERSITE=$PYTHONNOUSERSITE SECRET=${AGENT_SECRET:-unset}"\n'
             'echo "HOME-ENTRIES=$(ls -A "$HOME" | wc -l) HOME-OWNER=$(stat -c %u "$HOME")"\n')
    plain = make_task(tmp_path, "plain", test_sh=probe)
    as_root = make_task(tmp_path, "as-root", test_sh=probe)
    toml = as_root.path / "task.toml"
    toml.write_text(toml.read_text().replace("[verifier]\n", '[verifier]\nuser = "root"\n'))
    from sandfleet.tasks import load_task

    agent = ["export AGENT_SECRET=leaked; echo 'export AGENT_SECRET=leaked' >> ~/.bashrc; touch ~/agent-file",
             "echo AGENT_UID=$(id -u)"]
    p, r = (await run([plain, load_task(as_root.path)], ScriptedPolicy(agent))).results
    assert p.status == r.status == "completed", (p.error, r.error)
    assert "UID=1001 " in p.verifier_output and "UID=0 " in r.verifier_output
    for res in (p, r):
        out = res.verifier_output
        assert "NOUSERSITE=1 SECRET=unset" in out and "HOME=/home/agent" not in out, out
        assert "HOME-ENTRIES=0" in out
    assert "HOME-OWNER=1001" in p.verifier_output and "HOME-OWNER=0" in r.verifier_output
    assert p.info["agent_user"] == "agent"
