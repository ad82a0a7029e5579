"""The verifier: after the agent stops, score what it left behind.

The property (docs/security.md, "Reward integrity"): nothing the agent leaves behind can raise
the reward above what the task's own test script decided, and whatever the agent could have
caused scores 0 -- a :class:`VerifierOutcome` with a ``reason``, never an exception (the
rollout ends ``completed``; rollout/verdict.py makes it a ``policy_fault``). In this order:

1. every process of the agent's user is gone (``Sandbox.kill_user``; for a root agent, which
   can take any uid, every process of every user) before anything of the tests exists;
2. the test folders are emptied and made again by root, mode 0755; the reward folder is made
   again by root, mode 0777 for non-root tests (they can't change its mode); every git
   repository under the workdir is sanitized (:mod:`sandfleet.rollout.testguard`); a fresh,
   empty HOME and a root-owned Python guard are made. A sandbox that can't take them (a disk
   the agent filled) scores 0, ``verifier_setup_failed``;
3. the tests are uploaded, owned by root -- they never reach the sandbox before this point;
4. the test command runs as the ``verifier`` user, or as root where the task says so (Harbor
   ``[verifier].user``; Terminal-Bench-1 runs its tests as root), with that HOME,
   ``PYTHONNOUSERSITE=1``, the Python guard first on ``PYTHONPATH``, git's command-line
   overrides, and only the image's environment and the task's verifier environment; as the
   first process of a pid namespace of its own, so that when it exits the kernel kills every
   process it left before the exec returns;
5. a timed-out test command scores 0, ``verifier_timeout``, whatever is on disk; every
   process of the tests' user is killed once more; the reward files are read as root with
   ``O_NOFOLLOW|O_NONBLOCK`` and a size cap (a link, FIFO, device, folder, a file over the cap,
   one made read-only or that can't be read: ``bad_reward_file``), and judged by
   :func:`sandfleet.tasks.reward.reward_from` (``no_reward_file``, ``bad_reward_value``,
   ``reward_conflict``; a file the tests never name: ``reward_conflict``).

What it does not guarantee: code under test runs inside the tests by design (a ``conftest.py``
pytest collects from the workdir: flagged in ``VerifierOutcome.risks``). In shared mode (the
default) a *root* agent can also change whatever root can in the sandbox (the task image's own
Python packages, say), as in Docker. ``--verify separate`` (:func:`run_verifier_separately`)
runs the tests in a fresh sandbox of the same image that receives only the workdir and the
task's declared artifacts, carried by allocated size (``transfer_too_large`` over the bound,
checked before any data is read; sparse files stay sparse).

What the task declares is carried out (docs/tasks.md):

- Harbor ``[verifier].environment_mode = "separate"`` (or ``[verifier.environment]``): the
  tests run in a fresh sandbox, of the task's image or of the image ``tests/Dockerfile``
  builds (the tests inside it, nothing uploaded), with ``[verifier.environment]``'s limits; it
  receives only the declared artifacts and ``/logs/artifacts``, as in Harbor.
- The verifier's network policy: ``no-network`` cuts the network for the test command (a
  network namespace of its own) even when the sandbox has one; ``public`` gives it the
  sandbox's network, which the run decides (``--network``).
- TB1 ``run_tests_in_same_shell``: the tests run in the agent's shell session (its user, cwd
  and variables); the agent's other processes are still stopped first.
- The reward: ``reward.json`` and ``reward.txt`` (both must agree when both exist), and the
  plan's ``--reward-key``/``--reward-weights`` choose what trains.
"""

from __future__ import annotations

import asyncio
import copy
import io
import logging
import os
import posixpath
import secrets
import shlex
import tarfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from sandfleet.agent.protocol import MAX_CAPTURE
from sandfleet.agent.seal import seal_library, with_paths
from sandfleet.errors import (
    GuestError,
    GuestFileNotFoundError,
    RolloutError,
    SandboxClosedError,
    SandboxDiedError,
    SandboxPathError,
    TaskError,
)
from sandfleet.imagestore import Image, resolve_image
from sandfleet.rollout.envrecord import agent_is_root, changed_entries, recorded, walk_entries
from sandfleet.rollout.guardcache import write_guard_caches
from sandfleet.rollout.langguard import NODE_GUARD, PERL_GUARD, lang_env
from sandfleet.rollout.policy import stage_uploads
from sandfleet.rollout.shellguard import SH_GUARD, shell_env
from sandfleet.rollout.testguard import PY_GUARD, git_env, python_env, sanitize_git_script
from sandfleet.rollout.trace import SpanRecorder
from sandfleet.sandbox import create_sandbox
from sandfleet.sandbox.base import _SESSION_SCRIPT as SESSION_SCRIPT
from sandfleet.sandbox.base import BASE_ENV, DEFAULT_MAX_OUTPUT, Sandbox
from sandfleet.sandbox.registry import ISOLATED, RUNS_AS_USER, honours_root_dirs
from sandfleet.sandbox.spec import SANDBOX_UIDS, USERS, helper_path, is_root
from sandfleet.settings import current as current_settings
from sandfleet.tasks.model import Task, VerifierPlan
from sandfleet.tasks.reward import named_reward_files, reward_from
from sandfleet.tasks.scan import (
    IMPLICIT_ENV_RISK,
    SHARED_TMP_RISK,
    SOURCED_RISK,
    TESTS_DATA_RISK,
    implicit_env,
    shared_tmp_writes,
    sourced_from_workdir,
    tests_data_writes,
    without_workdir,
    workdir_path_entries,
)
from sandfleet.tasks.swebench import STATUS_FILE as SWEBENCH_STATUS_FILE
from sandfleet.tasks.witness import TESTS_STATUS

log = logging.getLogger(__name__)

OUTPUT_KEEP_CHARS = 64 * 1024
"""The tail of the verifier's output kept with the rollout."""
REWARD_MAX_BYTES = 64 * 1024
"""A reward file larger than this scores 0 (``bad_reward_file``)."""
REWARD_READ_TIMEOUT_S = 30.0
"""A reward read that takes longer scores 0 (``bad_reward_file``)."""
PREPARE_TIMEOUT_S = 120.0
"""How long the preparation (the guest agent's ``prepare``, or the script) may take; past it, the rollout
is a 0 (``verifier_setup_failed``), never handed to the script to try again."""
TRANSFER_MAX_BYTES = MAX_CAPTURE - (1 << 20)
"""``--verify separate`` carries at most this much of the workdir and artifacts (99 MiB): their
allocated bytes, measured before any is read, and their archive, which travels as one command's
output (the guest keeps at most ``MAX_CAPTURE``, 100 MiB, of it; the archive's headers fit in
the last MiB)."""
VERIFIER_USER = "verifier"
ISOLATED_BACKENDS = ISOLATED
"""Backends where users exist; elsewhere (``process``) owners are left alone (sandbox/registry.py)."""
USER_BACKENDS = RUNS_AS_USER
"""Backends whose commands run as the user they ask for (the guest agent isolates them); on
microvm every command is root of the VM, so its tests are root's, whoever the task names."""

# Empty each test folder ("t:PATH") and reward folder ("r:PATH") -- a link or file in its
# place is replaced by a folder -- owned by root, mode 0755; a reward folder is then mode 0777
# when the tests' user ($1, empty = leave owners alone) is not root (they write it; they can't
# change its mode or owner). The workdir ("w:PATH") has its git repositories sanitized
# (testguard.SANITIZE_GIT) and is handed to that user (the agent is gone by then), so tests that
# write there work as they do as root in Docker. Prints "home=" a fresh HOME for that user,
# "python=" a root-owned folder holding the Python guard ($PY_GUARD), and notes ("git: ...",
# "conftest: PATH", "pth: PATH" for a .pth file of a virtual environment in the workdir,
# "toolconfig: PATH" for tool configuration the tests' tools read from there, "module: NAME" for
# the workdir's top-level Python modules).
PREPARE = r"""
set -e
# every folder above a reward folder: a real folder (a link or file is replaced), root's, that
# no other user may write (a sticky one keeps its mode): nothing the agent owned or could swap
# lies on the path test.sh writes its reward by
trust_parents() {
  p=; rest=${1#/}
  while [ "${rest#*/}" != "$rest" ]; do
    p=$p/${rest%%/*}; rest=${rest#*/}
    if [ -L "$p" ] || { [ -e "$p" ] && [ ! -d "$p" ]; }; then rm -rf -- "$p"; echo "rewardpath: replaced $p"; fi
    [ -d "$p" ] || mkdir -m 0755 -- "$p"
    # find's lstat, not stat(1): gVisor refuses coreutils' statx (EINVAL)
    set -- $(find "$p" -maxdepth 0 -printf '%U %G %m\n')
    if [ "${1:-x}" != 0 ] || [ "${2:-x}" != 0 ]; then chown 0:0 -- "$p"; fi
    if [ -z "$3" ] || { [ $(( 0$3 & 01000 )) = 0 ] && [ $(( 0$3 & 022 )) != 0 ]; }; then chmod go-w -- "$p"; fi
  done
}
owner=$1; shift
# the agent as a uid of its own (not root): whose PATH folders and top folders are looked at
agent_uid=
if [ -n "$AGENT_USER" ] && [ "$AGENT_USER" != 0 ] && [ -z "${AGENT_USER//[0-9]/}" ]; then agent_uid=$AGENT_USER; fi
# each absolute folder of the tests' PATH ($TESTS_PATH) the agent could have written: its own, below a
# folder of its own or one it may write into (not sticky), or missing where it may make it:
# "agentpath: DIR" (a flag: the programs the tests find there may be the agent's); before any chown
if [ -n "$TESTS_PATH" ] && [ -n "$agent_uid" ]; then
  may() {  # may AGENT write at $1 ($2 = 1: make an entry there, a sticky folder too)?
    set -- "$1" "$2" $(find "$1" -maxdepth 0 -printf '%U %G %m %y\n' 2>/dev/null)
    [ -n "$5" ] || return 1
    [ "$3" = "$agent_uid" ] && return 0
    [ "$6" = d ] || return 1
    if [ $(( 0$5 & 01000 )) != 0 ] && [ "$2" != 1 ]; then return 1; fi
    [ $(( 0$5 & 02 )) != 0 ] && return 0
    [ $(( 0$5 & 020 )) != 0 ] && [ "$4" = "$agent_uid" ] && return 0
    return 1
  }
  IFS=: read -r -a _dirs <<< "$TESTS_PATH"
  for d in "${_dirs[@]}"; do
    case $d in /*) ;; *) continue ;; esac
    p=$d missing=
    until real=$(realpath -e -- "$p" 2>/dev/null); do missing=1; p=${p%/*}; [ -n "$p" ] || p=/; done
    hit=
    if [ -n "$missing" ] && may "$real" 1; then hit=1; fi
    q=$real
    while [ -z "$hit" ]; do
      if may "$q" 0; then hit=1; fi
      [ "$q" = / ] && break
      q=${q%/*}; [ -n "$q" ] || q=/
    done
    if [ -n "$hit" ]; then printf 'agentpath: %s\n' "${d//$'\n'/\\n}"; fi
  done
fi
umask 022
# each step once for all the folders (one process each, not one per folder): spawns are what
# this script costs; the workdir ("w:") comes after the test and reward folders, as given
clear=() rewards=() work=() nested=
# the image's venvs in the workdir (v:, the record taken before the agent's first command; agent/prepare.c's
# envs-changes): what of them changed since $ENVS_SINCE (this sandbox is the agent's), else c: and a: as
# listed in the agent's sandbox; before any owner changes. NUL-terminated records for the seal (image-envs)
envs=() envnotes=0
# "s" the record's time first (agent/prepare.c, prep_agent_programs): a program of the image's system folders
# changed between it and now is a root agent's, which the seal runs as the code under test; each of the PATH
# folders' such programs noted (20 at most; a folder that is a link, /bin in a merged /usr, is not walked)
if [[ $ENVS_SINCE =~ ^[0-9]+\.[0-9]{9}$ ]]; then
  envs+=("s$ENVS_SINCE")
  while IFS= read -r -d '' f; do
    if [ $envnotes -lt 20 ]; then envnotes=$((envnotes + 1)); printf 'agentprog: %s\n' "${f//$'\n'/\\n}"; fi
  done < <(find /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin -mindepth 1 -maxdepth 1 \
             -newerct "@$ENVS_SINCE" -print0 2>/dev/null)
  envnotes=0
  # Python's module folders (agent/prepare.c, prep_agent_modules): two levels down, from a site folder too
  while IFS= read -r -d '' f; do
    if [ $envnotes -lt 5 ]; then envnotes=$((envnotes + 1)); printf 'agentmod: %s\n' "${f//$'\n'/\\n}"; fi
  done < <({ find /usr/lib/python3* /usr/local/lib/python3* -mindepth 1 -maxdepth 2 -name __pycache__ -prune \
               -o ! -type d -newerct "@$ENVS_SINCE" -print0
             find /usr/lib/python3*/*-packages /usr/local/lib/python3*/*-packages -mindepth 1 -maxdepth 2 \
               -name __pycache__ -prune -o ! -type d -newerct "@$ENVS_SINCE" -print0; } 2>/dev/null)
  envnotes=0
fi
for a; do
  case $a in
    v:*) r=${a#v:}; envs+=("v$r")
      if [ -n "$ENVS_SINCE" ]; then
        if [ -L "$r" ] || { [ -e "$r" ] && [ ! -d "$r" ]; } || [[ ! $ENVS_SINCE =~ ^[0-9]+\.[0-9]{9}$ ]]; then
          envs+=("a$r"); printf 'imageenv: %s\n' "${r//$'\n'/\\n}"
        elif [ -d "$r" ]; then
          n=${#envs[@]}
          while IFS= read -r -d '' f; do envs+=("c$f"); done < \
            <(find "$r" ! -type d -newerct "@$ENVS_SINCE" -print0 2>/dev/null)
          if [ ${#envs[@]} -gt $((n + 20000)) ]; then envs=("${envs[@]:0:n}" "a$r"); fi
          if [ ${#envs[@]} -gt $n ]; then printf 'imageenv: %s\n' "${r//$'\n'/\\n}"; fi
        else unset 'envs[-1]'; fi
      fi ;;
    c:*|a:*) envs+=("${a:0:1}${a#?:}")
      if [ $envnotes -lt 20 ]; then envnotes=$((envnotes + 1)); printf 'imageenv: %s\n' "${a#?:}"; fi ;;
  esac
done
for e in "${envs[@]}"; do
  case $e in c*.pyc) rm -f -- "${e#c}" ;; esac  # Python reads one whose header (or, sourceless, code) the agent wrote
done
for a; do
  d=${a#?:}
  case $a in
    v:*|c:*|a:*) continue ;;
    w:*) work+=("$d"); continue ;;
    r:*) rewards+=("$d"); if [ -n "$owner" ]; then trust_parents "$d"; fi ;;
  esac
  if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -rf -- "$d"; fi
  for o in "${clear[@]}"; do
    case $d/ in "$o"/*) nested=1 ;; esac
    case $o/ in "$d"/*) nested=1 ;; esac
  done
  clear+=("$d")
done
if [ ${#clear[@]} -gt 0 ]; then
  mkdir -p -- "${clear[@]}"
  find "${clear[@]}" -mindepth 1 -maxdepth 1 -exec rm -rf -- {} +
  # a folder inside another was removed with the other's contents: made again
  if [ -n "$nested" ]; then mkdir -p -- "${clear[@]}"; fi
  chmod 0755 -- "${clear[@]}"
  if [ -n "$owner" ]; then
    chown 0:0 -- "${clear[@]}"
    if [ "$owner" != 0 ] && [ ${#rewards[@]} -gt 0 ]; then chmod 0777 -- "${rewards[@]}"; fi
  fi
fi
for d in "${work[@]}"; do
  if [ -d "$d" ] && [ ! -L "$d" ]; then
    if [ -n "$owner" ]; then
      # readlink -f, without a process where root may enter the folder
      if cd -P -- "$d" 2>/dev/null; then real=$PWD; cd /; else real=$(readlink -f -- "$d"); fi
      notes=$(sanitize_git "$real" </dev/null) || true
      if [ -n "$notes" ]; then printf 'git: %s\n' "${notes//$'\n'/$'\n'git: }"; fi
    fi
    if [ -n "$owner" ] && [ "$owner" != 0 ]; then chown -R -h "$owner" -- "$d"; fi
    # one walk for both (each a fork and a walk of the tree less): 20 of each at most
    find "$d" -maxdepth 6 -type f \( \( -name conftest.py -printf '%d conftest: %p\n' \) -o \
      \( -name '*.pth' -path '*-packages/*' -printf '%d pth: %p\n' \) \) 2>/dev/null |
    { c=0; p=0
      while IFS= read -r l; do
        depth=${l%% *}; l=${l#* }
        case $l in
          "conftest: "*) if [ "$depth" -le 3 ] && [ $c -lt 20 ]; then c=$((c + 1)); printf '%s\n' "$l"; fi ;;
          "pth: "*) if [ $p -lt 20 ]; then p=$((p + 1)); printf '%s\n' "$l"; fi ;;
        esac
      done; }
    for f in pytest.ini tox.ini setup.cfg pyproject.toml; do
      if [ -f "$d/$f" ] && grep -qE '^[[:space:]]*(addopts|pytest_plugins|required_plugins)' "$d/$f" 2>/dev/null
      then echo "toolconfig: $d/$f"; fi
    done
    for f in .npmrc .yarnrc .yarnrc.yml .pythonstartup; do
      if [ -f "$d/$f" ]; then echo "toolconfig: $d/$f"; fi
    done
    n=0
    for m in "$d"/*.py "$d"/*/__init__.py; do
      if [ $n -lt 200 ] && [ -e "$m" ]; then n=$((n + 1)); echo "module: $m"; fi
    done
  fi
done
# what the agent left in the shared temporary folders is the tests' user's now: a file the agent owns
# in a sticky folder keeps the tests from replacing it, and they would read it as their own (a stale
# JUnit report: round V's stale-junit-in-tmp); four levels down, one walk
if [ -n "$AGENT_USER" ] && [ -n "$owner" ] && [ "$owner" != 0 ] && [ "$AGENT_USER" != "$owner" ]; then
  find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -maxdepth 4 -user "$AGENT_USER" \
    -exec chown -h "$owner" -- {} + 2>/dev/null || true
fi
# links the agent left that lead into a test or reward folder (its output a link to the tests' expected
# answer, round XVII's answer-key-link), or through /proc (where /proc/self/cwd, a descriptor's link and
# the like name what the reader has: answer-key-proc-cwd): removed, so that the tests never read or write
# through them. Where a link leads is realpath -m's answer, walked a part at a time (resolve)
resolve() {  # REAL: where $1 leads; VIA=1 where a step of the way is under /proc or a protected folder; 1 for a loop
  local todo=$1 res= hops=0 c r p
  VIA=
  while [ -n "$todo" ]; do
    while [ "${todo#/}" != "$todo" ]; do todo=${todo#/}; done
    [ -n "$todo" ] || break
    c=${todo%%/*}
    if [ "$c" = "$todo" ]; then todo=; else todo=${todo#*/}; fi
    case $c in .) continue ;; ..) res=${res%/*}; continue ;; esac
    res=$res/$c
    case $res in /proc|/proc/*) VIA=1 ;; esac
    # a way that enters a test or reward folder and climbs out again (another link of the agent's led
    # in: round XVIII's answer-key-climb) ends elsewhere only while that link is there
    for p in "${protect[@]}"; do case $res/ in "${p%/}"/*) VIA=1 ;; esac; done
    if [ -L "$res" ]; then
      hops=$((hops + 1)); [ $hops -le 40 ] || return 1
      r=$(readlink -- "$res") || return 1
      case $r in /*) res= ;; *) res=${res%/*} ;; esac
      todo=$r${todo:+/$todo}
    fi
  done
  REAL=${res:-/}
}
if [ ${#clear[@]} -gt 0 ]; then
  protect=("${clear[@]}")
  for d in "${clear[@]}"; do if resolve "$d" && [ "$REAL" != "$d" ]; then protect+=("$REAL"); fi; done
  links=()
  if [ ${#work[@]} -gt 0 ]; then mapfile -d '' -O 0 links < <(find "${work[@]}" -type l -print0 2>/dev/null); fi
  # and where else the agent keeps files: the shared temporary folders, the homes, the logs, and every
  # folder at the top that is the agent's own (/oracle, /work, ...)
  tops=()
  if [ -n "$agent_uid" ]; then
    mapfile -d '' found < <(find / -mindepth 1 -maxdepth 1 -type d -user "$agent_uid" -print0 2>/dev/null)
    for t in "${found[@]}"; do  # (a workdir: walked whole already)
      walked=; for w in "${work[@]}"; do [ "$w" = "$t" ] && walked=1; done
      [ -n "$walked" ] || tops+=("$t")
    done
  fi
  mapfile -d '' -O ${#links[@]} links < <(find /tmp /var/tmp /dev/shm /home /root /logs "${tops[@]}" -xdev -mindepth 1 \
    -maxdepth 4 -type l -print0 2>/dev/null)
  n=0
  for l in "${links[@]}"; do
    resolve "$l" || continue
    hit=$VIA
    for p in "${protect[@]}"; do case $REAL/ in "${p%/}"/*) hit=1 ;; esac; done
    if [ -n "$hit" ]; then
      rm -f -- "$l"; n=$((n + 1))
      if [ $n -le 20 ]; then printf 'link: %s\n' "${l//$'\n'/\\n}"; fi
    fi
  done
fi
# the tests' HOME: beside the first reward folder where the seal keeps it from the code under test
# ($TESTS_HOME, a name the agent could not know), else a fresh one in /tmp; the code under test's
# own HOME ($CODE_HOME, which the seal gives it)
if [ -n "$TESTS_HOME" ] && [ -d "${TESTS_HOME%/*}" ]; then
  rm -rf -- "$TESTS_HOME"; mkdir -m 0700 -- "$TESTS_HOME"; home=$TESTS_HOME
else home=$(mktemp -d -t sandfleet-verifier-home.XXXXXXXX); fi  # 0700 (mktemp), under umask 022
if [ -n "$owner" ]; then chown "$owner" -- "$home"; fi
if [ -n "$CODE_HOME" ]; then
  rm -rf -- "$CODE_HOME"; mkdir -m 0700 -- "$CODE_HOME"
  if [ -n "$owner" ]; then chown "$owner" -- "$CODE_HOME"; fi
fi
# the Python guard's folder: beside the tests' HOME where the seal keeps it ($PY_DIR), else a fresh
# one in /tmp (there the seal would hand it to the code under test with what the tests name: it is
# on their PYTHONPATH)
if [ -n "$PY_DIR" ] && [ -d "${PY_DIR%/*}" ]; then
  rm -rf -- "$PY_DIR"; mkdir -m 0755 -- "$PY_DIR"; py=$PY_DIR
else py=$(mktemp -d -t sandfleet-verifier-py.XXXXXXXX); fi
printf '%s' "$PY_GUARD" > "$py/sitecustomize.py"  # 0644: a new file under umask 022
if [ -n "$SH_GUARD" ]; then printf '%s' "$SH_GUARD" > "$py/sandfleet-bash.sh"; fi  # the tests' BASH_ENV
if [ -n "$NODE_GUARD" ]; then printf '%s' "$NODE_GUARD" > "$py/sandfleet-node.js"; fi  # their NODE_OPTIONS'
if [ -n "$PERL_GUARD" ]; then printf '%s' "$PERL_GUARD" > "$py/sandfleet_guard.pm"; fi  # their PERL5OPT's
if [ ${#envs[@]} -gt 0 ]; then printf '%s\0' "${envs[@]}" > "$py/image-envs"; fi  # the seal's
chmod 0755 -- "$py"
seal=
if [ -n "$owner" ] && [ -n "$SEAL_ARCH" ] && [ "$HOSTTYPE" = "$SEAL_ARCH" ]; then
  # the name holds "libasan.so": a dynamic ASan runtime dies unless the first library loaded
  # is one of its own names (it checks the name only); the seal exports no symbol, so the
  # runtime still interposes malloc and the rest before libc as it would first
  seal=$py/sandfleet-seal.libasan.so
  cat > "$seal"  # root's, 0644
  # all of it or none (a library cut short is one the loader refuses: the tests would run unsealed)
  if [ -n "$SEAL_SIZE" ] && [ "$(($(wc -c < "$seal")))" != "$SEAL_SIZE" ]; then
    echo "the seal: $(($(wc -c < "$seal"))) bytes of $SEAL_SIZE" >&2; exit 1
  fi
  if [ -s "$seal" ]; then
    # every dynamically linked program, whatever environment it was given; where the sandbox's
    # /etc can't be written (the host image) the tests' LD_PRELOAD alone carries it
    { printf '%s\n' "$seal" >> /etc/ld.so.preload; } 2>/dev/null || true
  else seal=; fi
fi
printf 'home=%s\npython=%s\nseal=%s\n' "$home" "$py" "$seal"
# the Landlock ABI the tests get, from the seal itself in an exec of true: landlock=N (N < 1: none)
landlock=
if [ -n "$seal" ]; then
  landlock=$(env LD_PRELOAD="$seal" true --sandfleet-seal-probe 2>/dev/null) || true
  printf '%s\n' "$landlock"
fi
# no Landlock (or $SPLIT: beside it), and the seal can make the code under test a user of its own
# ($DEMOTE, the tests' uid): the tests run as root, and the reward folders are root's alone (0755)
if [ -n "$seal" ] && [ -n "$DEMOTE" ] && { [ "$landlock" = landlock=0 ] || [ -n "$SPLIT" ]; }; then
  if [ ${#rewards[@]} -gt 0 ]; then chmod 0755 -- "${rewards[@]}"; fi
  chown 0:0 -- "$home"
  printf 'demote=%s\n' "$DEMOTE"
fi
case $owner in
  "") ;;
  *[!0-9]*) printf 'uid=%s\n' "$(id -u -- "$owner" 2>/dev/null || echo "$owner")" ;;
  *) printf 'uid=%s\n' "$owner" ;;
esac
"""


PTH_RISK = ("a .pth file of a virtual environment in the workdir (it runs code at interpreter start when that "
            "environment's Python runs the tests)")
TOOL_CONFIG_RISK = ("tool configuration in the workdir that the tests' tools read from there (pytest addopts or "
                    "plugins, npm, yarn)")
IMAGE_ENV_RISK = ("the image's venv in the workdir was changed by the agent (its changed programs and -m modules "
                  "do not run for the tests, its changed byte-compiled files were removed)")


AGENT_PROGRAM_RISK = ("a program of the image's system folders that the agent changed as root (the tests run it as "
                      "the code under test: kept from the reward folders and the tests' own)")


IMAGE_CODE_KEPT = ["x:/usr", "x:/etc/ld.so.preload"]
"""The seal's entries of the image's code that a root code under test may not write while the tests run."""


AGENT_MODULE_RISK = ("a Python module of the image's (its standard library, site-packages) that the agent changed as "
                     "root (what the tests' Python reads of it is the code under test's; a test runner among them, "
                     "`python -m pytest` after the agent's reinstall, reports its own status)")


NO_LANDLOCK_RISK = ("no Landlock in the sandbox's kernel (gVisor has none): the reward folders are not kept from "
                    "the code under test that the tests run, which could write a reward the tests did not decide "
                    "(docs/security.md, \"Where the line is\")")
DETACHED_RISK = ("processes of the tests outlived the program that started them while the tests ran "
                 "(a daemon of the code under test could write what the tests read)")
SEAL_RISK = ("the seal could not take all its paths (seal_paths holds 512 bytes): it goes without what "
             "did not fit")
SAME_SHELL_RISK = ("TB1 run_tests_in_same_shell: the tests run in the agent's own shell session (its functions, "
                   "aliases and variables: PATH, PYTHONPATH, LD_PRELOAD), so the agent chooses what runs as the tests "
                   "and what they print; --verify separate runs them in a fresh shell")
OUTPUT_REWARDS = frozenset({"pytest-output", "swebench"})
"""The plans whose reward is read from the tests' output (TB1's parser, SWE-bench's log)."""
OUTPUT_PARSED_MAX = 16 << 20
"""Bytes of each stream of such a test command kept for its parser (a command's default is 1 MiB, and
the first bytes are kept: pytest's summary, and SWE-bench's end marker, come last, so an honest run
that printed more than 1 MiB scored 0)."""
WITNESS_NAME = ".pytest-witness"
"""In the reward folder: each pytest of the tests writes every test's outcome there (``failed<TAB>nodeid``,
``passed<TAB>nodeid``), from the guard's plugin, by a descriptor opened before the workdir's code ran."""
WITNESS_MAX_BYTES = 8 << 20
WITNESS_FD = 9
WITNESS_SCRIPT = f'if ( : >>"$1" ) 2>/dev/null; then exec {WITNESS_FD}>>"$1"; fi; shift; exec "$@"'
"""The test command, with the witness file open for appending on WITNESS_FD (the tests' user makes it in the
reward folder; where it can't, the command runs all the same, with no witness)."""


def witness_path(plan: VerifierPlan) -> str:
    """The witness file of a plan whose reward is read from the tests' output."""
    return posixpath.join(posixpath.dirname(plan.reward_text_path), WITNESS_NAME)


OUTPUT_CUT_RISK = "the tests printed more than the parser reads: the rest was cut before it was parsed"
OUTPUT_STATUS_REASON = TESTS_STATUS
"""A reward read from the tests' output that the tests' own signals do not confirm (tasks/witness.py)."""
WORKDIR_PATH_RISK = ("the tests' PATH has folders the agent could write (in the workdir, or relative to it): "
                     "the task's [verifier.env] PATH keeps them")
@dataclass
class VerifierOutcome:
    """A verifier's verdict and what it printed."""

    reward: float
    details: dict[str, float] = field(default_factory=dict)
    exit_code: int | None = None
    timed_out: bool = False
    output: str = ""
    """The tail of the test command's stdout and stderr (``OUTPUT_KEEP_CHARS``)."""
    reason: str | None = None
    """Why the reward is 0 whatever the tests said (``bad_reward_file``), else None."""
    error: str | None = None
    """What was wrong, with ``reason``."""
    risks: list[str] = field(default_factory=list)
    """What the workdir held that code under test could use (a ``conftest.py``, a module named
    like the standard library's, git config that was removed): flags, not verdicts."""


class BadRewardFile(Exception):
    """The reward path holds something that is not a small regular file."""


def verifier_user(task: Task) -> str:
    """Who the tests run as: the task's ``[verifier].user`` (TB1: root), else ``verifier``."""
    return task.verifier.user or VERIFIER_USER


def uid_of(user: str) -> str:
    """The built-in names as numbers (``agent`` -> 1000); other names resolve in the image."""
    return str(USERS.get(user, user))


def users_to_stop(user: str) -> list[str]:
    """Whose processes to kill to stop everything ``user`` started: root can become anyone,
    so for root also the built-in ``agent`` and ``verifier``."""
    return [user, "agent", VERIFIER_USER] if is_root(user) else [user]


# The real uid of every process /proc shows (but ours): what a root agent may have left.
LIST_UIDS = r"""
for f in /proc/[0-9]*/status; do
  case $f in "/proc/$$/status") continue ;; esac
  while read -r k v _; do [ "$k" = Uid: ] && { echo "$v"; break; }; done < "$f" 2>/dev/null
done | sort -u
"""


async def stop_users(sandbox: Sandbox, users: Sequence[str]) -> None:
    """Kill every process of each user; returns once they are gone."""
    done: set[str] = set()
    for user in users:
        if uid_of(user) not in done:
            done.add(uid_of(user))
            await sandbox.kill_user(user)


async def stop_everything_of(sandbox: Sandbox, user: str) -> None:
    """Kill every process ``user`` may have started. For root, which can take any uid, that is
    every process of every user the sandbox shows: where the guest agent does it in one request
    (a local sandbox: one pass over /proc, repeated until nothing is left, so a fork under a new
    uid is killed too), that request; else root's own first, then each uid /proc shows."""
    root = is_root(user) and sandbox.backend in ISOLATED_BACKENDS
    if root and await sandbox.kill_everyone():
        return  # (on gVisor the list below, a bash and a sort, took 85-130 ms a stop)
    await stop_users(sandbox, users_to_stop(user))
    if not root:
        return  # a non-root user can't change its uid; without isolation kill_user kills all
    res = await sandbox.exec(["bash", "-c", LIST_UIDS], cwd="/", user="root", timeout=30)
    uids = [u for u in res.stdout.split() if u.isdigit()]
    # a uid past the sandbox's users (on gVisor and in a microVM root may take one, the guest agent's own 65536
    # too: round XXVII's stop-guest-uid) can't be named over this way (a service older than KILL of every user)
    beyond = [u for u in uids if int(u) >= SANDBOX_UIDS]
    if beyond:
        raise RolloutError(f"a process of uid {beyond[0]}, past the sandbox's users 0..{SANDBOX_UIDS - 1}, is left "
                           "and this sandbox can't stop every user in one request: what it writes decides nothing",
                           reason=SETUP_FAILED)
    await stop_users(sandbox, uids)


TASK_DIRS = ("/tests", "/solution", "/oracle")
"""Where the task contract puts tests and reference solutions: owned by root, mode 0755."""


async def protect_task_dirs(sandbox: Sandbox, *, root_ran: bool = False) -> None:
    """Give the task folders the sandbox was made with to root, mode 0755, before the agent
    starts: a non-root agent can't write them, nor replace what is uploaded there. Nothing
    to run where the backend started the sandbox with them root's (``SandboxSpec.root_dirs``),
    unless root has run a command there since (``root_ran``: the task's prepare step). Nothing
    either where every command is root (microvm): the agent is root there, whoever owns them (the
    verifier clears them before the tests go in); the chown under TCG took 138 ms a rollout."""
    dirs = [d for d in TASK_DIRS if d in sandbox.spec.writable_dirs]
    if sandbox.backend not in USER_BACKENDS or not dirs:  # (no users: process; every command root: microvm)
        return
    if not root_ran and honours_root_dirs(sandbox.backend) and set(dirs) <= set(sandbox.spec.root_dirs):
        return  # the launcher made them root's, 0755, with the writable dirs (sandbox/bwrap.py)
    # one chown and one chmod for them all (a process each, not two per folder)
    # (the loop walks the arguments as given, keeping the real folders at the end, and shifts each)
    script = ('for d; do if [ -d "$d" ] && [ ! -L "$d" ]; then set -- "$@" "$d"; fi; shift; done; '
              '[ $# -eq 0 ] || { chown 0:0 -- "$@" && chmod 0755 -- "$@"; } || exit 1')
    res = await sandbox.exec(["sh", "-c", script, "protect", *dirs], cwd="/", user="root", timeout=30)
    if res.exit_code != 0:
        raise RolloutError(f"could not give the task folders to root: {res.output.strip()[-300:]}",
                           reason="sandbox_setup")


def _guest(sandbox: Sandbox, path: str) -> str:
    """A sandbox path as the guest sees it (the process backend maps it under its folder)."""
    mapper = getattr(sandbox, "_path", None)
    return str(mapper(path)) if mapper is not None else path


def _cleared_paths(task: Task) -> list[str]:
    """``t:`` test folders and ``r:`` reward folders to empty before the tests arrive."""
    plan = task.verifier
    tests = {up.target if up.source.is_dir() else posixpath.dirname(up.target) for up in plan.uploads}
    rewards = {posixpath.dirname(plan.reward_text_path), posixpath.dirname(plan.reward_json_path)}
    keep = ("/", "", task.workdir)
    return sorted({f"t:{p}" for p in tests - rewards if p not in keep} | {f"r:{p}" for p in rewards if p not in keep})


async def read_reward_file(sandbox: Sandbox, path: str, *, max_bytes: int = REWARD_MAX_BYTES) -> str | None:
    """The reward file's text; None when it does not exist. Raises :class:`BadRewardFile` for
    a link, a FIFO or device, a folder, a file over ``max_bytes``, or a read that fails
    or outlives ``REWARD_READ_TIMEOUT_S``. A dead or closed sandbox raises as such."""
    try:
        async with asyncio.timeout(REWARD_READ_TIMEOUT_S):
            data = await sandbox.read_file(path, user="root", max_bytes=max_bytes + 1, nofollow=True)
    except (GuestFileNotFoundError, FileNotFoundError):
        return None
    except (SandboxDiedError, SandboxClosedError):
        raise
    except (TimeoutError, GuestError, SandboxPathError, OSError) as e:
        raise BadRewardFile(f"{path}: {type(e).__name__}: {e}") from None
    if len(data) > max_bytes:
        raise BadRewardFile(f"{path}: larger than {max_bytes} bytes")
    return data.decode("utf-8", "replace")


async def run_verifier(task: Task, sandbox: Sandbox, recorder: SpanRecorder) -> VerifierOutcome:
    """Stop the agent, clear, upload the tests, run them, stop what they started, read the
    reward. The agent's user is the sandbox's default user (``sandbox.spec.user``). A task
    that declares a separate verifier gets one (:func:`run_declared_separate`)."""
    if task.verifier.mode == "separate":
        return await run_declared_separate(task, sandbox, recorder)
    return await _run_tests(task, sandbox, recorder)


async def _session_state(sandbox: Sandbox, user: str) -> str | None:
    """The newest shell-session state file ``user`` owns (the agent's shell), or None."""
    # find's lstat, not ls or stat(1): gVisor refuses coreutils' statx (EINVAL), and the TB1
    # same-shell tests ran outside the agent's session there
    script = ("me=$(id -u \"$1\" 2>/dev/null || echo \"$1\"); "
              "find /tmp -maxdepth 1 -type f -name '.sandfleet-session-*' ! -name '*.tmp' -printf '%T@ %U %p\\n' "
              "2>/dev/null | sort -rn | while read -r _ u f; do [ \"$u\" = \"$me\" ] && { echo \"$f\"; break; }; "
              "done; true")
    res = await sandbox.exec(["sh", "-c", script, "find", uid_of(user)], cwd="/", user="root", timeout=30)
    found = res.stdout.strip()
    return found or None


async def _test_command(task: Task, sandbox: Sandbox, user: str) -> list[str]:
    """The test command as it runs: in the agent's shell session (TB1 same shell); where the reward is
    read from its output, with the witness file open on WITNESS_FD (WITNESS_SCRIPT)."""
    plan = task.verifier
    argv = list(plan.command)
    if plan.same_shell:
        state = await _session_state(sandbox, user)
        if state is not None:
            argv = ["bash", "-c", SESSION_SCRIPT, "sandfleet-session", _guest(sandbox, state), shlex.join(argv)]
    elif plan.reward in OUTPUT_REWARDS:
        argv = ["sh", "-c", WITNESS_SCRIPT, "sandfleet-witness", _guest(sandbox, witness_path(plan)), *argv]
    return argv


def _verifier_allowlist(task: Task, sandbox: Sandbox) -> None:
    """The verifier phase's allowlist (Harbor ``network_mode = "allowlist"``) on the agent's
    sandbox, when it differs from the agent phase's (sandbox/allowlist.py)."""
    allow = task.verifier.allowed_hosts
    if allow is None or task.verifier.network is False or not sandbox.spec.limits.network:
        return
    if allow != sandbox.spec.limits.allow:
        from sandfleet.sandbox.network import switch_allowlist

        switch_allowlist(sandbox, allow)


def _no_network(task: Task, sandbox: Sandbox) -> bool:
    """Whether the tests run without network: the policy says so and the sandbox has one to
    cut (the guest agent runs them in a network namespace of its own, made before the
    seccomp filter that forbids making one: docs/security.md)."""
    return task.verifier.network is False and sandbox.spec.limits.network and sandbox.backend in ISOLATED_BACKENDS


SETUP_FAILED = "verifier_setup_failed"
"""The reason of a verifier that could not set up in a sandbox the agent used (a full disk)."""


def _zero(reason: str, error: str, **kw: object) -> VerifierOutcome:
    log.info("verifier scores 0: %s: %s", reason, error[:300])
    return VerifierOutcome(0.0, reason=reason, error=error, **kw)  # type: ignore[arg-type]


AGENT_PATH_RISK = ("a folder of the tests' PATH is one the agent could write (the programs the tests find there may "
                   "be the agent's; --verify separate runs them from the image)")
LINK_RISK = ("a link the agent left led into a test or reward folder (the tests' own files, the reward), or "
             "through /proc (what it names depends on who reads it): removed before the tests")
# (a way that passes through such a folder and out again counts: its end depends on the agent's other links)


def _notes(stdout: str) -> tuple[dict[str, str], list[str]]:
    """PREPARE's ``key=value`` lines and its notes, as risks worth flagging."""
    import sys

    values: dict[str, str] = {}
    risks: list[str] = []
    lines = stdout.splitlines()
    # the values come after every note, from the last home= line on: a note prints a path of the agent's,
    # and a name with a newline in it would otherwise print a line of the agent's choosing
    # ("demote=1": the tests as root; round XI's note-newline-*)
    start = max((i for i, line in enumerate(lines) if line.startswith("home=")), default=len(lines))
    for i, line in enumerate(lines):
        key, sep, value = line.partition("=")
        if sep and key in ("home", "python", "uid", "seal", "landlock", "demote"):
            if i >= start:
                values[key] = value
            continue
        kind, _, what = line.partition(": ")
        if kind == "rewardpath":
            risks.append(f"the reward folder's path held a link or file of the agent's (made a folder again): {what}")
        elif kind == "git":
            risks.append(f"git: {what}")
        elif kind == "link":
            risks.append(f"{LINK_RISK}: {what}")
        elif kind == "agentpath":
            risks.append(f"{AGENT_PATH_RISK}: {what}")
        elif kind == "conftest":
            risks.append(f"conftest.py in the workdir (pytest loads it when the tests run from there): {what}")
        elif kind == "pth":
            risks.append(f"{PTH_RISK}: {what}")
        elif kind == "toolconfig":
            risks.append(f"{TOOL_CONFIG_RISK}: {what}")
        elif kind == "imageenv":
            risks.append(f"{IMAGE_ENV_RISK}: {what}")
        elif kind == "agentprog":
            risks.append(f"{AGENT_PROGRAM_RISK}: {what}")
        elif kind == "agentmod":
            risks.append(f"{AGENT_MODULE_RISK}: {what}")
        elif kind == "module":
            name = posixpath.basename(posixpath.dirname(what)) if what.endswith("/__init__.py") else \
                posixpath.basename(what)[:-3]
            if name in sys.stdlib_module_names:
                risks.append(f"the workdir's {name!r} has a standard-library module's name (the tests import "
                             "the standard library's)")
    return values, risks


def _image_machine(sandbox: Sandbox) -> str:
    """The machine name of the sandbox's image (``uname -m``'s, which is qemu's for the two the guest agent's
    preparation knows: x86_64, aarch64), as the image store has it; "" where unknown."""
    from sandfleet.images.emulation import QEMU_CPU

    try:
        arch = resolve_image(sandbox.spec.image).arch
    except Exception:  # (a service's image, a name not stored here: the preparation looks at the image)
        return ""
    return QEMU_CPU.get(arch, "")


async def _prepare(task: Task, sandbox: Sandbox, user: str, *, fresh: bool = False, envs: Sequence[str] = (),
                   ) -> tuple[dict[str, str], list[str]] | VerifierOutcome:
    """Clear the test and reward folders, sanitize the workdir's git repositories, make the
    tests' HOME and Python guard: (values, risks), or a 0 outcome when the sandbox the agent
    left can't take them (``verifier_setup_failed``). The image's venvs in the workdir are
    judged by the record taken before the agent's first command (rollout/envrecord.py): in the
    agent's own sandbox the preparation walks them; a fresh one (``fresh``) is given ``envs``,
    what changed as listed in the agent's."""
    isolated = sandbox.backend in ISOLATED_BACKENDS
    owner = uid_of(user) if isolated else ""
    agent = uid_of(sandbox.spec.user) if isolated and sandbox.spec.user else ""
    dirs = [p[:2] + _guest(sandbox, p[2:]) for p in _cleared_paths(task)]
    dirs.append("w:" + _guest(sandbox, task.workdir))
    script = sanitize_git_script() + PREPARE
    seal = await asyncio.to_thread(seal_library) if isolated else None
    # where the kernel has no Landlock, the seal makes the code under test this user of its own
    # (the tests then run as root): only where commands really run as the user they ask for
    settings = current_settings()
    demote = owner if (owner.isdigit() and owner != "0" and sandbox.backend in USER_BACKENDS
                       and not settings.seal_uid_off) else ""
    split = "1" if demote and settings.seal_split else ""  # beside Landlock too (SANDFLEET_SEAL_SPLIT)
    homes = {}
    seal_risks: list[str] = []
    if seal is not None:  # the reward folders kept from every program but the tests' own
        # the tests' HOME kept too (the config of the tests' own tools: git's, curl's), beside the
        # first reward folder (whose parent the code under test can't add to anyway); the code under
        # test gets a HOME of its own
        token = secrets.token_hex(8)
        rewards = [d[2:] for d in dirs if d.startswith("r:")]
        if rewards and owner:
            # the Python guard's folder beside it, kept too: in /tmp the seal's hand-over gave it to the
            # code under test on gVisor (a path the tests' environment names), and root's files there
            # were root's code's to change on microvm (round XI's guard-on-pythonpath)
            homes = {"TESTS_HOME": f"{posixpath.dirname(rewards[0])}/.sandfleet-tests-home.{token}",
                     "PY_DIR": f"{posixpath.dirname(rewards[0])}/.sandfleet-tests-python.{token}",
                     "CODE_HOME": f"/tmp/sandfleet-code-home.{token}"}
        # (g: the Python guard's folder, kept like k:, and put first on every tests' program's PYTHONPATH)
        kept = [f"r:{homes['TESTS_HOME']}", f"g:{homes['PY_DIR']}", f"h:{homes['CODE_HOME']}"] if homes else []
        # the tests' folders kept too: on microvm (and for tests that run as root) every command is
        # root, so only this keeps the running test.sh and the graders from the code under test;
        # on bwrap and gvisor they are root's against a user of the tests' (and this is a second wall)
        kept += [f"k:{d[2:]}" for d in dirs if d.startswith("t:")]
        # where the code under test runs as root (the tests root, or every command: a microVM), the image's code
        # too: /usr, and the loader's preload list (stop 75's tests-plant-*: a root program of the workdir's that
        # the tests ran wrote into them, and the tests' later programs ran it as their own)
        if owner == "0" or sandbox.backend not in RUNS_AS_USER:
            kept += IMAGE_CODE_KEPT
        # the reward files themselves: a descriptor on one that a kept program inherited writes nowhere
        files = sorted({f"f:{_guest(sandbox, p)}" for p in (task.verifier.reward_text_path,
                                                          task.verifier.reward_json_path)})
        entries = [d for d in dirs if d[:2] in ("t:", "r:", "w:")] + kept + ([f"u:{demote}"] if demote else [])
        entries += ["s:1"] if split else []
        try:
            seal = with_paths(seal, entries + files)
        except ValueError:
            try:  # the reward files' entries go first: the folders are the rule itself
                seal = with_paths(seal, entries)
                seal_risks.append(f"{SEAL_RISK}: the reward files' descriptors (their paths did not fit)")
            except ValueError as e:
                log.warning("the seal goes without its folders: %s", e)
                seal_risks.append(f"{SEAL_RISK}: {e}; no folder is kept from the code under test")
                demote, homes, split = "", {}, ""
    # the PATH the tests will have (its workdir entries are left out then, and were never the question);
    # where commands run as their user (on microvm every command is root: the root agent's case), and
    # where the agent ran (not a fresh sandbox of --verify separate, whose folders are the image's)
    tests_path = ({**BASE_ENV, **sandbox.spec.env, **task.verifier.env}.get("PATH", "")
                  if sandbox.backend in USER_BACKENDS and not fresh else "")
    record = recorded(sandbox) if not fresh else None
    env_args, env_since = walk_entries(record) if record is not None else (list(envs), {})
    env = {"PY_GUARD": PY_GUARD, "SH_GUARD": SH_GUARD, "NODE_GUARD": NODE_GUARD, "PERL_GUARD": PERL_GUARD, **env_since,
           "SEAL_ARCH": os.uname().machine if seal else "", "IMAGE_ARCH": _image_machine(sandbox),
           "SEAL_SIZE": str(len(seal)) if seal else "",
           "DEMOTE": demote, "SPLIT": split, "AGENT_USER": agent, "TESTS_PATH": tests_path, **homes}
    # the guest agent's `prepare` does the script's steps in one process (agent/prepare.c); exit 75
    # (or an agent without it) leaves them to the script, exit 1 is the preparation's own failure
    native = helper_path(sandbox.backend)
    res, by = None, "script"
    if native is not None:
        try:
            res = await sandbox.exec([native, "prepare", owner, *dirs, *env_args], cwd="/", timeout=PREPARE_TIMEOUT_S,
                                     user="root",
                                     env={**env, "SANDFLEET_GIT_SCRIPT": sanitize_git_script()}, stdin=seal or b"")
        except (SandboxDiedError, SandboxClosedError):
            raise
        except GuestError as e:
            log.debug("the guest agent's prepare could not start (%s): the script prepares", e)
        # past its time it is not left to the script, which does the same steps slower (a flood of the
        # agent's links took gVisor's prepare past 120 s, and the script another 120: round XVIII)
        if res is not None and res.exit_code not in (0, 1) and not res.timed_out:
            log.debug("the guest agent's prepare left it to the script (exit %s): %s", res.exit_code,
                      res.stderr.strip()[-300:])
            if record is not None and agent_is_root(sandbox):
                # the script runs the image's programs as root, and a root agent may have changed them (stop 74:
                # a `bash` first on PATH that is no ELF made the preparation leave it to the script, whose `cat`
                # was the agent's); what the agent left can't be prepared without them: its failure, a 0
                return _zero(SETUP_FAILED, "could not prepare the test and reward folders without the image's "
                             "programs, which the agent (root) may have changed: "
                             f"{res.stderr.strip()[-300:]}")
            res = None
        by = "agent" if res is not None else by
    if res is None:
        res = await sandbox.exec(["bash", "-c", script, "prepare", owner, *dirs, *env_args], cwd="/",
                                 timeout=PREPARE_TIMEOUT_S,
                                 user="root", env=env, stdin=seal or b"")
    if res.timed_out:
        return _zero(SETUP_FAILED, "could not prepare the test and reward folders: the preparation ran past "
                     f"its {PREPARE_TIMEOUT_S:g} s ({by})")
    values, risks = _notes(res.stdout)
    values["by"] = by
    risks += seal_risks
    if res.exit_code != 0 or "home" not in values or "python" not in values:
        return _zero(SETUP_FAILED, f"could not prepare the test and reward folders (exit {res.exit_code}): "
                     f"{res.output.strip()[-300:]}")
    return values, risks


async def _upload(task: Task, sandbox: Sandbox) -> VerifierOutcome | None:
    """Upload the tests as root; a 0 outcome when the sandbox can't take them (a full disk)."""
    try:
        await stage_uploads(sandbox, task.verifier.uploads, user="root")
    except (GuestError, OSError) as e:
        if isinstance(e, SandboxDiedError | SandboxClosedError):
            raise
        return _zero(SETUP_FAILED, f"could not upload the tests: {type(e).__name__}: {e}")
    return None


async def _reward_files_provenance(sandbox: Sandbox, paths: Sequence[str], uid: str) -> str | None:
    """Why a reward file can't be the tests' own, or None. The reward folder was made empty
    and root's before the tests (PREPARE), on a path only root may change, so a file in it
    that the tests' user (``uid``, not root) did not make -- owned by another uid (planted by
    the agent and moved in, so that test.sh's write was refused) -- or that its owner made
    read-only (so that test.sh could not overwrite it) is not what the test script decided."""
    # find's lstat, not stat(1): gVisor refuses coreutils' statx (EINVAL), and a check that
    # prints nothing must not pass: each file that exists gives a line, or the check fails
    script = ('for f; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
              'find "$f" -maxdepth 0 -printf "%U %m %p\\n" || echo "? ? $f"; fi; done')
    # the guest agent's `stat` prints the same lines, one process of its own (agent/prepare.c)
    agent = helper_path(sandbox.backend)
    res = await sandbox.exec([agent, "stat", *paths], cwd="/", user="root", timeout=30) if agent else None
    if res is None or res.exit_code != 0:
        res = await sandbox.exec(["sh", "-c", script, "stat", *paths], cwd="/", user="root", timeout=30)
    for line in res.stdout.splitlines():
        if line.startswith("? ? "):
            return f"{line[4:]}: its owner and mode could not be read"
        owner, mode, name = (line.split(" ", 2) + ["", ""])[:3]
        if owner.isdigit() and owner != uid:
            return (f"{name} is owned by uid {owner}, not by the tests' user (uid {uid}): the test script did "
                    "not make it, and could not overwrite it")
        if mode.isdigit() and not int(mode, 8) & 0o200:
            return f"{name} was made read-only (mode {mode}): the test script could not have written it"
    return None


async def _run_tests(task: Task, sandbox: Sandbox, recorder: SpanRecorder, *, fresh: bool = False,
                     envs: Sequence[str] = ()) -> VerifierOutcome:
    plan = task.verifier
    user = sandbox.spec.user if plan.same_shell else verifier_user(task)
    isolated = sandbox.backend in ISOLATED_BACKENDS
    with recorder.span("other_sandbox", what="stop agent"):
        await stop_everything_of(sandbox, sandbox.spec.user)
    with recorder.span("other_sandbox", what="clear tests and rewards") as span:
        prepared = await _prepare(task, sandbox, user, fresh=fresh, envs=envs)
        if not isinstance(prepared, VerifierOutcome):
            span["by"] = prepared[0]["by"]  # the guest agent's prepare, or the script
    if isinstance(prepared, VerifierOutcome):
        return prepared
    values, risks = prepared
    # no Landlock: the tests as root, each program of the code under test as `user` (the seal's)
    demoted = bool(values.get("demote")) and not plan.same_shell
    run_as = "root" if demoted else user
    with recorder.span("other_sandbox", what="upload tests"):
        failed = await _upload(task, sandbox)
        if failed is None:
            await write_guard_caches(sandbox, values["python"])
    if failed is not None:
        return failed
    if plan.same_shell:  # the agent's shell session: its variables, by design (TB1)
        env = dict(plan.env)
        risks.append(SAME_SHELL_RISK)
    else:
        env = {**plan.env, "HOME": values["home"], "PYTHONNOUSERSITE": "1"}
        if plan.reward in OUTPUT_REWARDS:  # each pytest of the tests writes its outcomes there (the guard)
            env["SANDFLEET_WITNESS_FD"] = str(WITNESS_FD)
        base = {**sandbox.spec.env, **env}
        tests_dirs = [_guest(sandbox, d[2:]) for d in _cleared_paths(task) if d.startswith("t:")]
        env.update(python_env(base, values["python"], _guest(sandbox, task.workdir), tests_dirs))
        env.update(git_env(base))
        if demoted and values["demote"].isdigit():  # the tests' temporary folders shared with the code
            env["SANDFLEET_SHARED_TMP_UID"] = values["demote"]  # under test, as on bwrap (testguard)
        # what the tests' own programs read by themselves (the loader, bash, the interpreters, the tools)
        # from the image's environment: nothing the agent could write, unless the task's [verifier.env]
        # names it (kept, flagged); round XVII's ld-library-path-image and bash-env-home
        for name, (left, bad) in implicit_env(base, task.workdir, sandbox.spec.env.get("HOME", "/home/agent")).items():
            if name in plan.env:
                risks.append(f"{IMPLICIT_ENV_RISK}: {name} kept by [verifier.env]: {', '.join(bad)}")
            else:
                env[name] = base[name] = left
                risks.append(f"{IMPLICIT_ENV_RISK}: left out of {name}: {', '.join(bad)}")
        if values.get("seal"):  # the tests' programs each in a Landlock domain of their own
            env["LD_PRELOAD"] = " ".join(filter(None, [values["seal"], base.get("LD_PRELOAD", "")]))
            if values.get("landlock", "").isdigit() and int(values["landlock"]) < 1 and not demoted:
                risks.append(NO_LANDLOCK_RISK)
        # the tests' bash sources a file of the agent's apart, as the code under test (round XXII)
        env.update(shell_env(base, values["python"]))
        # and a Node or Perl grader's exit status is the tests' (round XXIII)
        env.update(lang_env(base, values["python"]))
        kept = workdir_path_entries(base.get("PATH"), task.workdir)
        if kept and "PATH" in plan.env:  # the task's own choice: kept, flagged
            risks.append(f"{WORKDIR_PATH_RISK}: {', '.join(kept)}")
        elif kept:
            env["PATH"] = without_workdir(base.get("PATH", ""), task.workdir)
    sourced = sourced_from_workdir(task)
    if sourced:
        risks.append(f"{SOURCED_RISK}: {'; '.join(sourced[:5])}")
    shared = shared_tmp_writes(task)
    if shared:
        risks.append(f"{SHARED_TMP_RISK}: {'; '.join(shared[:5])}")
    kept_data = tests_data_writes(task)
    if kept_data:
        risks.append(f"{TESTS_DATA_RISK}: {'; '.join(kept_data[:5])}")
    argv = await _test_command(task, sandbox, user)
    _verifier_allowlist(task, sandbox)
    with recorder.span("verifier") as span:
        # the first process of a pid namespace of its own: when it exits, the kernel kills
        # every process it left (a daemon of the code under test) before the exec returns
        pid_namespace = isolated
        parsed = plan.reward in OUTPUT_REWARDS
        res = await sandbox.exec(argv, cwd=task.workdir, env=env, timeout=plan.timeout_s, user=run_as,
                                 network=not _no_network(task, sandbox), pid_namespace=pid_namespace,
                                 max_output=OUTPUT_PARSED_MAX if parsed else DEFAULT_MAX_OUTPUT)
        span["exit_code"] = res.exit_code
        if parsed and res.truncated:
            risks.append(f"{OUTPUT_CUT_RISK} ({OUTPUT_PARSED_MAX >> 20} MiB a stream)")
        if res.timed_out:
            span["timed_out"] = True
    output = res.output[-OUTPUT_KEEP_CHARS:]
    outcome = VerifierOutcome(0.0, exit_code=res.exit_code, timed_out=res.timed_out, output=output, risks=risks)
    with recorder.span("other_sandbox", what="stop tests"):
        await stop_everything_of(sandbox, run_as)
    if res.timed_out:  # whatever is on disk: the tests did not finish
        outcome.reason, outcome.error = "verifier_timeout", f"the tests ran past their {plan.timeout_s:g} s limit"
        return outcome
    if res.detached and plan.allow_detached:
        risks.append(f"{DETACHED_RISK} ({res.detached}; the task allows it)")
    elif res.detached:  # the warden saw a daemon of the tests' tree: whatever it wrote decides nothing
        outcome.reason, outcome.error = "tests_detached", (
            f"{res.detached} process(es) of the tests outlived the program that started them while the tests ran "
            "(a daemon: fork and exit, setsid, a double fork): what such a process writes is not the tests' "
            "decision. A task whose tests start a service on purpose declares [verifier] allow_detached = true; "
            f"verifier exit code {res.exit_code}, output tail:\n{output[-2000:]}")
        return outcome
    if res.signal is not None and pid_namespace:  # test.sh killed: nothing it left is a decision
        outcome.reason = "tests_killed"
        outcome.error = (f"the test script was killed by signal {res.signal} before it ended; "
                         f"output tail:\n{output[-2000:]}")
        return outcome
    with recorder.span("other_sandbox", what="read reward"):
        text = json_text = status_text = witness_text = None
        try:
            if plan.reward == "reward-file":
                paths = [plan.reward_json_path, plan.reward_text_path]
                # root writes any file all the same (and on microvm the tests are root)
                check = sandbox.backend in USER_BACKENDS and not is_root(run_as)
                why = await _reward_files_provenance(sandbox, [_guest(sandbox, p) for p in paths],
                                                     values.get("uid", uid_of(user))) if check else None
                if why is not None:
                    raise BadRewardFile(why)
                json_text = await read_reward_file(sandbox, plan.reward_json_path)
                text = await read_reward_file(sandbox, plan.reward_text_path)
            if plan.reward in OUTPUT_REWARDS:  # what the tests' own status and pytest's outcomes say (round XIX)
                kept = [SWEBENCH_STATUS_FILE] if plan.reward == "swebench" else []
                if not plan.same_shell:
                    kept.append(witness_path(plan))
                check = sandbox.backend in USER_BACKENDS and not is_root(run_as)
                why = await _reward_files_provenance(sandbox, [_guest(sandbox, p) for p in kept],
                                                     values.get("uid", uid_of(user))) if check else None
                if why is not None:
                    raise BadRewardFile(why)
                if plan.reward == "swebench":
                    status_text = await read_reward_file(sandbox, SWEBENCH_STATUS_FILE)
                if not plan.same_shell:
                    witness_text = await read_reward_file(sandbox, witness_path(plan), max_bytes=WITNESS_MAX_BYTES)
        except BadRewardFile as e:
            outcome.reason, outcome.error = "bad_reward_file", str(e)
            return outcome
    named = named_reward_files(plan) if plan.reward == "reward-file" else None
    for path, content in ((plan.reward_json_path, json_text), (plan.reward_text_path, text)):
        if named is not None and content is not None and path not in named:
            outcome.reason = "reward_conflict"
            outcome.error = f"{path} was written, but no test file names it: not by the tests"
            return outcome
    try:
        reward = reward_from(plan, output=res.output, reward_text=text, reward_json=json_text,
                             test_status=status_text, witness=witness_text, exit_code=res.exit_code)
    except RolloutError as e:
        if e.reason == "parser":  # the task's configuration, not the agent
            raise
        killed = e.reason == "no_reward_file" and res.signal is not None  # test.sh itself was killed
        outcome.reason = "tests_killed" if killed else e.reason
        outcome.error = f"{e}; verifier exit code {res.exit_code}, output tail:\n{output[-2000:]}"
        return outcome
    outcome.reward, outcome.details = reward.value, reward.details
    return outcome


# -- --verify separate


def carried_paths(task: Task) -> list[str]:
    """What a separate verifier receives (one path not inside another), as sandbox paths:
    for a task that declares its separate verifier, Harbor's artifacts and /logs/artifacts;
    else (``--verify separate``) the workdir and the declared artifacts."""
    out: list[str] = []
    wanted = set(task.verifier.carried) if task.verifier.mode == "separate" else {task.workdir, *task.artifacts}
    for path in sorted(wanted, key=len):
        if not any(path == p or path.startswith(p.rstrip("/") + "/") for p in out):
            out.append(path)
    return out


def _relative(name: str, roots: Sequence[str], what: str) -> str:
    norm = posixpath.normpath(name.lstrip("/")) if name else "."
    if norm.startswith("..") or norm == "." or "\x00" in norm:
        raise RolloutError(f"workdir archive: {what} {name!r} leads outside", reason="verifier_transfer")
    if not any(norm == r or norm.startswith(r + "/") for r in roots):
        raise RolloutError(f"workdir archive: {what} {name!r} is outside {', '.join(roots)}",
                           reason="verifier_transfer")
    return norm


def clean_archive(data: bytes, paths: Sequence[str]) -> bytes:
    """Re-pack a tar of ``paths`` (member names relative to /) keeping only folders, regular
    files, links inside ``paths``, and refusing any member that leaves them or passes through
    a symbolic link: what the fresh sandbox unpacks can only land where a copy of those
    folders would."""
    roots = [p.strip("/") for p in paths]
    links: set[str] = set()
    out = io.BytesIO()

    def through_link(name: str) -> bool:
        """Whether a folder on ``name``'s way is a link: one look-up per level, so that the
        archive's cost is its members times their depth (a list scanned per member made a
        workdir of 25,000 links take 45 s of the host's CPU, and 60,000 minutes)."""
        at = name.find("/")
        while at >= 0:
            if name[:at] in links:
                return True
            at = name.find("/", at + 1)
        return False

    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as src, \
                tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as dst:
            for m in src:
                name = _relative(m.name, roots, "member")
                if through_link(name) or name in links:
                    raise RolloutError(f"workdir archive: {m.name!r} passes through a link",
                                       reason="verifier_transfer")
                if m.islnk():
                    m.linkname = _relative(m.linkname, roots, "hard link target")
                    if through_link(m.linkname):
                        raise RolloutError(f"workdir archive: {m.linkname!r} passes through a link",
                                           reason="verifier_transfer")
                elif m.issym():
                    links.add(name)
                elif not (m.isreg() or m.isdir()):
                    continue  # FIFOs and devices are not carried
                m.name = name
                if m.sparse is not None:  # holes stay holes: only the data regions are copied
                    _add_sparse(dst, src, m)
                else:
                    dst.addfile(m, src.extractfile(m) if m.isreg() else None)
    except tarfile.TarError as e:
        raise RolloutError(f"workdir archive is malformed: {e}", reason="verifier_transfer") from None
    return out.getvalue()


class _SparseData(io.RawIOBase):
    """A sparse member's data as GNU sparse 1.0 stores it: the map, padded, then each region."""

    def __init__(self, head: bytes, src: IO[bytes], regions: Sequence[tuple[int, int]]):
        self._parts: list[tuple[IO[bytes] | None, int, int]] = [(None, 0, len(head))]
        self._head = head
        self._parts += [(src, off, n) for off, n in regions]
        self._at = 0  # within the current part

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._next(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def _next(self, size: int) -> bytes:
        while self._parts:
            fileobj, off, n = self._parts[0]
            if self._at >= n:
                self._parts.pop(0)
                self._at = 0
                continue
            want = min(size, n - self._at, 1 << 20)
            if fileobj is None:
                data = self._head[self._at:self._at + want]
            else:
                fileobj.seek(off + self._at)
                data = fileobj.read(want)
                if not data:
                    raise tarfile.ReadError("a sparse member's data ends early")
            self._at += len(data)
            return data
        return b""


def _add_sparse(dst: tarfile.TarFile, src: tarfile.TarFile, m: tarfile.TarInfo) -> None:
    """Write ``m`` (a sparse member of ``src``) to ``dst`` in GNU sparse format 1.0, which GNU
    tar extracts with its holes: a 100 GiB file of holes is a few bytes here and there."""
    sparse: list[tuple[int, int]] = list(m.sparse or [])  # type: ignore[arg-type]
    regions = [(int(at), int(size)) for at, size in sparse if size]
    ends = [*regions, (m.size, 0)]  # a last empty region at the real size, as GNU tar writes it
    head = (f"{len(ends)}\n" + "".join(f"{at}\n{size}\n" for at, size in ends)).encode()
    head += b"\0" * (-len(head) % tarfile.BLOCKSIZE)
    out = copy.copy(m)
    out.type = tarfile.REGTYPE
    out.name = posixpath.join(posixpath.dirname(m.name), "GNUSparseFile.0", posixpath.basename(m.name))
    out.size = len(head) + sum(size for _, size in regions)
    out.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": m.name,
                       "GNU.sparse.realsize": str(m.size)}
    data = src.extractfile(m)
    assert data is not None
    dst.addfile(out, io.BufferedReader(_SparseData(head, data, regions)))


# The allocated bytes of the paths (hard links once): what a transfer costs, known before
# any data is read.
ALLOCATED = 'du -s -c -B1 -- "$@" 2>/dev/null | tail -n 1 | cut -f1'


async def pack_outputs(task: Task, sandbox: Sandbox) -> bytes:
    """A tar, made as root, of the workdir and declared artifacts the agent left. Sparse
    files stay sparse; more than ``TRANSFER_MAX_BYTES`` allocated raises ``RolloutError``
    (``transfer_too_large``) before any data is read."""
    paths = carried_paths(task)
    root = _guest(sandbox, "/")
    rel = [posixpath.relpath(_guest(sandbox, p), root) for p in paths]
    size = await sandbox.exec(["sh", "-c", f"cd \"$0\" && {ALLOCATED}", root, *rel], cwd="/", user="root",
                              timeout=120)
    allocated = size.stdout.strip()
    if not allocated.isdigit():
        raise RolloutError(f"could not measure the workdir: {size.output.strip()[-300:]}", reason="transfer_failed")
    if int(allocated) > TRANSFER_MAX_BYTES:
        raise RolloutError(f"the workdir and artifacts take {int(allocated)} bytes, over the "
                           f"{TRANSFER_MAX_BYTES}-byte bound", reason="transfer_too_large")
    res = await sandbox.exec(
        ["tar", "-c", "--sparse", "--ignore-failed-read", "--numeric-owner", "-C", root, "--", *rel],
        cwd="/", user="root", timeout=600, max_output=TRANSFER_MAX_BYTES,
    )  # fmt: skip
    if res.truncated:
        raise RolloutError(f"the workdir's archive is larger than {TRANSFER_MAX_BYTES} bytes",
                           reason="transfer_too_large")
    if res.exit_code != 0:
        raise RolloutError(f"could not copy the workdir out: {res.stderr.strip()[-300:]}", reason="transfer_failed")
    # off the event loop: tens of thousands of members take seconds, and other rollouts wait
    return await asyncio.to_thread(clean_archive, res.stdout_bytes, rel)


async def unpack_outputs(task: Task, sandbox: Sandbox, archive: bytes) -> None:
    """Replace the workdir and declared artifacts of a fresh sandbox with ``archive``."""
    root = _guest(sandbox, "/")
    targets = [_guest(sandbox, p) for p in carried_paths(task)]
    script = ('set -e; root=$1; shift; for d; do if [ -d "$d" ] && [ ! -L "$d" ]; then '
              'find "$d" -mindepth 1 -delete; else rm -rf -- "$d"; fi; done; '
              'tar -x --no-same-owner -p -C "$root"; '
              'if [ -n "$owner" ]; then for d; do if [ -e "$d" ]; then chown -R -h "$owner" -- "$d"; fi; done; fi')
    # owned by the tests' user (root's where they run as root), never with the agent's ownership:
    # a file the agent owned and made so that test.sh's write is refused does not come back so
    tests = verifier_user(task)
    owner = "" if is_root(tests) or sandbox.backend not in ISOLATED_BACKENDS else uid_of(tests)
    res = await sandbox.exec(["bash", "-c", script, "unpack", root, *targets], stdin=archive, cwd="/",
                             user="root", timeout=600, env={"owner": owner})
    if res.exit_code != 0:
        raise RolloutError(f"could not copy the workdir in: {res.output.strip()[-300:]}",
                           reason="transfer_failed")


async def run_declared_separate(task: Task, sandbox: Sandbox, recorder: SpanRecorder) -> VerifierOutcome:
    """The separate verifier a Harbor task declares: a fresh sandbox of the verifier's image
    (built from ``tests/Dockerfile`` when the task has one, else the agent's), with
    ``[verifier.environment]``'s limits and the verifier's network policy."""
    venv = task.verifier.environment
    spec = sandbox.spec
    updates: dict[str, object] = {}
    limits: dict[str, object] = {}
    if venv is not None:
        limits = {"cpus": venv.cpus, "memory_mib": venv.memory_mib, "disk_mib": venv.storage_mib}
        if venv.dockerfile is not None:
            with recorder.span("other_sandbox", what="verifier image"):
                updates["image"], updates["env"] = await verifier_image(task)
            updates["writable_dirs"] = tuple(d for d in spec.writable_dirs if d != "/tests")  # the tests are baked in
            updates["root_dirs"] = tuple(d for d in spec.root_dirs if d != "/tests")  # (each one a writable dir)
    if task.verifier.network is False:
        limits["network"] = False
    elif spec.limits.network and (task.verifier.allowed_hosts is not None or spec.limits.allow is not None):
        limits["allow"] = task.verifier.allowed_hosts  # the verifier phase's allowlist, or none
    fresh_spec = spec.model_copy(update={**updates, "limits": spec.limits.model_copy(update=limits)})

    async def start() -> Sandbox:
        return await create_sandbox(fresh_spec)

    return await run_verifier_separately(task, sandbox, recorder, start)


def verifier_build(task: Task) -> Task:
    """The task whose image is the verifier's: its ``tests/Dockerfile`` and context."""
    venv = task.verifier.environment
    if venv is None or venv.dockerfile is None:
        raise TaskError("declares no verifier image (tests/Dockerfile)", file=str(task.path))
    return task.model_copy(update={
        "name": f"{task.name}.verifier", "dockerfile": venv.dockerfile, "context_dir": venv.context_dir,
        "build_timeout_s": venv.build_timeout_s})


async def ensure_verifier_image(task: Task) -> Image:
    """The image of a task's ``tests/Dockerfile`` (built and cached like a task image), here."""
    from sandfleet.tasks.images import build_task_image

    return await asyncio.to_thread(build_task_image, verifier_build(task))


async def verifier_image(task: Task) -> tuple[str, dict[str, str]]:
    """(image name, its environment) of a task's ``tests/Dockerfile``: built here, or on the
    sandbox service in force (``--remote``), where the verifier's sandbox will run."""
    from sandfleet.tasks.images import remote_builder

    remote = remote_builder()
    if remote is not None:
        return await remote.verifier_image(task)
    image = await ensure_verifier_image(task)
    return image.hash, {str(k): str(v) for k, v in dict(image.meta.get("env") or {}).items()}  # type: ignore[call-overload]


async def run_verifier_separately(
    task: Task, sandbox: Sandbox, recorder: SpanRecorder, start: Callable[[], Awaitable[Sandbox]]
) -> VerifierOutcome:
    """Harbor's separate mode: stop the agent, carry its workdir and declared artifacts into a
    fresh sandbox of the same image (``start()`` makes it), verify there, close it. Nothing
    else the agent did -- processes, files outside those paths, a changed system -- reaches
    the tests. (A task that declares its separate verifier carries Harbor's artifacts only.)"""
    with recorder.span("other_sandbox", what="stop agent"):
        await stop_everything_of(sandbox, sandbox.spec.user)
    record = recorded(sandbox)
    envs: list[str] = []
    if record is not None and record.roots:  # what of the image's venvs the agent changed (by change times)
        with recorder.span("other_sandbox", what="list the image's venvs"):
            envs = await changed_entries(record, sandbox)
    try:
        with recorder.span("other_sandbox", what="copy out workdir"):
            archive = await pack_outputs(task, sandbox)
    except RolloutError as e:  # what the agent left can't be carried: a 0, not an abstention
        return _zero(e.reason if e.reason.startswith("transfer_") else "transfer_refused", str(e))
    with recorder.span("sandbox_start", what="verifier sandbox"):
        fresh = await start()
    try:
        with recorder.span("other_sandbox", what="copy in workdir"):
            try:
                await unpack_outputs(task, fresh, archive)
            except RolloutError as e:
                return _zero(e.reason, str(e))
        return await _run_tests(task, fresh, recorder, fresh=True, envs=envs)
    finally:
        await asyncio.shield(_close_quietly(fresh))


async def _close_quietly(sandbox: Sandbox) -> None:
    try:
        await sandbox.close()
    except Exception as e:
        log.error("closing verifier sandbox %s failed (it may have leaked): %s: %s", sandbox.id,
                  type(e).__name__, e)
