"""The tests' shell guard (docs/security.md, "Code the tests' shell sources: round XXII").

A test script that sources a file the agent could have written (``source /app/.env``, ``.
./config.sh``, a virtual environment's ``activate``) used to run the agent's text inside the
tests' own process, where no seal can tell the two apart: an ``EXIT`` trap that writes 1, a
function named like the program the tests decide by, a loop forked from the tests' shell. The
guard is the ``BASH_ENV`` of the tests' environment (a file the verifier's preparation writes,
root's, beside the Python guard), so every non-interactive bash of the tests reads it first. It
turns ``source`` and ``.`` into a gate:

- a file whose real path lies in a tests' folder, or in the image's system folders (``/usr``,
  ``/etc``, ``/opt``, ``/lib*``, ``/bin``, ``/sbin``) with every folder on the way and the file
  root's and written by no one else, is the tests' own and is sourced as before, in their shell;
- any other file (the workdir's, a temporary folder's, a home's, a process substitution's pipe)
  runs in a bash of its own, marked the code under test (``SANDFLEET_SEAL_NATIVE=1``: the seal
  keeps the reward folders from it and what it starts), with the tests' environment (what a
  program of the code under test gets: not their shell's variables or functions); what it
  leaves comes back as data: its scalar variables (set, exported, unset) that the tests' own
  files name (a word of a file in a tests' folder: a variable no tests' file names is one only a
  program reads by itself, a tool's configuration such as ``PYTEST_PLUGINS``), and ``PATH``,
  ``VIRTUAL_ENV`` and ``PYTHONPATH`` (an activate's); never the shell's own, the loader's,
  sandfleet's, the tests' ``HOME``, git's or Python's start-up variables, nor those through which
  a program loads code (:data:`IMPLICIT_ENV`), and ``PYTHONPATH`` keeps the Python guard's
  folder first. Its status is the ``source``'s. Its functions, aliases, traps, options, working
  folder and processes stay in its own process.

``eval`` is a gate too (round XXIII): text that a workdir file holds (a line of 16 characters or more
found in one, or every line, where all are shorter, a whole line of one) runs apart the same way; any
other text (``eval "$(pyenv init -)"``) runs in the tests' shell as before.

What it can't reach: a ``#!/bin/sh`` script (dash reads no start-up file when not interactive),
``builtin source``/``command .``/``builtin eval``, the agent's text transformed before an ``eval``, a
bash given ``-p``, ``--posix`` or an environment without ``BASH_ENV``.
"""

from __future__ import annotations

from sandfleet.tasks.scan import IMPLICIT_ENV

GUARD_NAME = "sandfleet-bash.sh"
"""The guard's file name in the Python guard's folder (the preparation's ``PY_DIR``)."""

DENIED = sorted({
    # the shell's own
    "BASH", "BASHOPTS", "BASHPID", "CDPATH", "COLUMNS", "COPROC", "DIRSTACK", "EMACS", "ENV", "EPOCHREALTIME",
    "EPOCHSECONDS", "EUID", "EXECIGNORE", "FCEDIT", "FIGNORE", "FUNCNAME", "FUNCNEST", "GLOBIGNORE", "GLOBSORT",
    "GROUPS", "HISTCMD",
    "HISTCONTROL", "HISTFILE", "HISTFILESIZE", "HISTIGNORE", "HISTSIZE", "HISTTIMEFORMAT", "HOSTNAME", "HOSTTYPE",
    "IFS", "IGNOREEOF", "INPUTRC", "INSIDE_EMACS", "LINENO", "LINES", "MACHTYPE", "MAIL", "MAILCHECK", "MAILPATH",
    "OLDPWD", "OPTARG", "OPTERR", "OPTIND", "OSTYPE", "PIPESTATUS", "POSIXLY_CORRECT", "PPID", "PROMPT_COMMAND",
    "PROMPT_DIRTRIM", "PS0", "PS1", "PS2", "PS3", "PS4", "PWD", "RANDOM", "SECONDS", "SHELL", "SHELLOPTS",
    "SHLVL", "SRANDOM", "TIMEFORMAT", "TMOUT", "UID", "auto_resume", "histchars", "_",
    # what the verifier set for the tests: their HOME, no user site, their temporary folder
    "HOME", "PYTHONNOUSERSITE", "TMPDIR",
    *IMPLICIT_ENV,
})
"""Variable names a file sourced apart never sets in the tests' shell (with every name that
starts ``BASH_``, ``LD_``, ``GIT_``, ``SANDFLEET_``, ``COMP_``, ``READLINE_``, ``__sandfleet``, and
``PYTHON`` but for :data:`PYTHON_KEPT`)."""

PYTHON_KEPT = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED", "PYTHONIOENCODING",
               "PYTHONUTF8", "PYTHONWARNINGS")
"""Python's variables a sourced file may set (``PYTHONPATH`` with the guard's folder kept first)."""

SH_GUARD = r'''# sandfleet's guard of the tests' bash (docs/security.md, round XXII): their BASH_ENV. Made by root,
# read-only for the tests. A file the tests source that is not theirs runs in a bash of its own, as the
# code under test, and only its variables come back, as data.
# source <(...): its text first, before bash closes the pipe of a writer that ended
__sandfleet_text= __sandfleet_pipe=
[ "${1-}" != --sandfleet-source ] || [ ! -p "${2-}" ] ||
  { __sandfleet_pipe=1; IFS= read -r -d '' __sandfleet_text < "$2" || :; }
# eval TEXT (round XXIII): text a workdir file holds runs apart, as a file sourced from there; other text here
if [ "${1-}" = --sandfleet-eval ] && declare -F __sandfleet_gate >/dev/null; then
  shift
  [ "${1-}" != -- ] || shift
  __sandfleet_text="$*"
  if __sandfleet_held "$__sandfleet_text"; then
    __sandfleet_pipe=1
    __sandfleet_apart eval-text
    __sandfleet_pipe=
    return "$__sandfleet_rc"
  fi
  set --
  builtin eval "$__sandfleet_text"
  return
fi
if [ "${1-}" = --sandfleet-source ] && declare -F __sandfleet_gate >/dev/null; then
  shift
  [ "${1-}" != -- ] || shift
  if __sandfleet_gate "$@"; then
    shift
    builtin source "$__sandfleet_file" "$@"
  else
    return "$__sandfleet_rc"
  fi
  return
fi
__sandfleet_self=${BASH_SOURCE[0]}
__sandfleet_pydir=${__sandfleet_self%/*}
shopt -s expand_aliases
alias source="builtin source ${__sandfleet_self@Q} --sandfleet-source" \
      .="builtin source ${__sandfleet_self@Q} --sandfleet-source" \
      eval="builtin source ${__sandfleet_self@Q} --sandfleet-eval"

# TEXT (an eval's): held by a file of the workdir (SANDFLEET_UNTRUSTED, its .git aside): a line of 16
# characters or more anywhere in one, or, where every line is shorter, each line a whole line of one (the
# rule the seal's one-liner walk has for a -c's code, round XXI; a text built from short lines, round XXIII)
__sandfleet_held() {
  local LC_ALL=C __sandfleet_w=${SANDFLEET_UNTRUSTED-} __sandfleet_l
  local -a __sandfleet_long=() __sandfleet_short=()
  local -A __sandfleet_want=() __sandfleet_got=()
  [ -n "$__sandfleet_w" ] && [ "$__sandfleet_w" != / ] && [ -d "$__sandfleet_w" ] || return 1
  while IFS= read -r __sandfleet_l; do
    [[ $__sandfleet_l == *[![:space:]]* ]] || continue
    if [ "${#__sandfleet_l}" -ge 16 ]; then __sandfleet_long+=("$__sandfleet_l")
    else __sandfleet_short+=("$__sandfleet_l"); fi
  done <<< "$1"
  if [ "${#__sandfleet_long[@]}" != 0 ]; then
    printf '%s\n' "${__sandfleet_long[@]}" |
      command -p grep -rqsF --exclude-dir=.git -f /dev/stdin -- "$__sandfleet_w" 2>/dev/null
    return
  fi
  [ "${#__sandfleet_short[@]}" != 0 ] || return 1
  for __sandfleet_l in "${__sandfleet_short[@]}"; do __sandfleet_want[$__sandfleet_l]=1; done
  while IFS= read -r __sandfleet_l; do __sandfleet_got[$__sandfleet_l]=1; done < <(
    printf '%s\n' "${__sandfleet_short[@]}" |
      command -p grep -rhoxsF --exclude-dir=.git -f /dev/stdin -- "$__sandfleet_w" 2>/dev/null)
  [ "${#__sandfleet_got[@]}" = "${#__sandfleet_want[@]}" ]
}

# FILE [ARGS]: 0 where FILE is the tests' own (__sandfleet_file: its real path, to source here), else 1
# after running it apart (__sandfleet_rc: its status)
__sandfleet_gate() {
  local __sandfleet_n=${1-} __sandfleet_p= __sandfleet_d __sandfleet_r
  if [ -z "$__sandfleet_n" ]; then __sandfleet_file=; return 0; fi  # bash's own error, in place
  if [ -n "${__sandfleet_pipe-}" ]; then  # a pipe's text (the guard read it): never the tests' own file
    __sandfleet_apart "$@"
    return 1
  fi
  if [[ $__sandfleet_n != */* ]] && shopt -q sourcepath; then  # bash's search: PATH, then the cwd
    while IFS= read -r -d : __sandfleet_d; do
      if [ -f "${__sandfleet_d:-.}/$__sandfleet_n" ]; then __sandfleet_p=${__sandfleet_d:-.}/$__sandfleet_n; break; fi
    done <<< "$PATH:"
  fi
  [ -n "$__sandfleet_p" ] || __sandfleet_p=$__sandfleet_n
  [[ $__sandfleet_p == /* ]] || __sandfleet_p=./$__sandfleet_p
  __sandfleet_r=$(command -p readlink -f "$__sandfleet_p" 2>/dev/null)
  if __sandfleet_image_changed "$__sandfleet_p" "$__sandfleet_r"; then  # (round XXVI: a venv's activate)
    printf '%s%s\n' "sandfleet: $__sandfleet_p, a file of the image's virtual environment in the workdir, " \
      "was changed by the agent; it is not sourced" >&2
    __sandfleet_rc=126
    return 1
  fi
  if [ -n "$__sandfleet_r" ] && __sandfleet_own "$__sandfleet_r"; then
    __sandfleet_file=$__sandfleet_r
    return 0
  fi
  shift
  __sandfleet_apart "$__sandfleet_p" "$@"
  return 1
}

# PATH REAL: the file as named (made absolute by name) or where it leads is a file of the image's venv in the
# workdir that the agent changed since the record, or lies below one (a link on its way), or the venv is the
# agent's whole: the guard folder's image-envs (rollout/envrecord.py; agent/seal.c's image_env)
__sandfleet_image_changed() {
  local __sandfleet_l=$__sandfleet_pydir/image-envs __sandfleet_rec __sandfleet_a __sandfleet_x __sandfleet_q
  [ -f "$__sandfleet_l" ] || return 1
  local -a __sandfleet_c=()
  while IFS= read -r -d '' __sandfleet_rec; do
    case $__sandfleet_rec in c*|a*) __sandfleet_c+=("${__sandfleet_rec#?}") ;; esac
  done < "$__sandfleet_l"
  __sandfleet_a=$1
  [[ $__sandfleet_a == /* ]] || __sandfleet_a=$PWD/$__sandfleet_a
  __sandfleet_a=$(command -p realpath -s -m -- "$__sandfleet_a" 2>/dev/null) || __sandfleet_a=$1
  for __sandfleet_x in "${__sandfleet_c[@]}"; do
    for __sandfleet_q in "$__sandfleet_a" "${2-}"; do
      [ -n "$__sandfleet_q" ] || continue
      case $__sandfleet_q/ in "$__sandfleet_x"/*) return 0 ;; esac
    done
  done
  return 1
}

# REAL: the tests' own: in a tests' folder, or in the system's folders, root's and written by no one else
__sandfleet_own() {
  local __sandfleet_r=$1 __sandfleet_d __sandfleet_w=${SANDFLEET_UNTRUSTED-} __sandfleet_up __sandfleet_line
  if [ -n "$__sandfleet_w" ] && [ "$__sandfleet_w" != / ]; then
    case $__sandfleet_r/ in "${__sandfleet_w%/}"/*) return 1 ;; esac
  fi
  while IFS= read -r -d : __sandfleet_d; do
    [ -n "$__sandfleet_d" ] || continue
    case $__sandfleet_r in "${__sandfleet_d%/}"/*) return 0 ;; esac
  done <<< "${SANDFLEET_TESTS_DIRS-}:"
  case $__sandfleet_r in
    /usr/*|/etc/*|/opt/*|/lib/*|/lib32/*|/lib64/*|/libx32/*|/bin/*|/sbin/*) ;;
    *) return 1 ;;
  esac
  local -a __sandfleet_ups=("$__sandfleet_r")
  __sandfleet_up=${__sandfleet_r%/*}
  while [ -n "$__sandfleet_up" ]; do __sandfleet_ups+=("$__sandfleet_up"); __sandfleet_up=${__sandfleet_up%/*}; done
  __sandfleet_ups+=(/)
  while IFS= read -r __sandfleet_line; do  # "uid mode": root's, no group or other write
    case $__sandfleet_line in
      "0 "*) (( (8#${__sandfleet_line#0 } & 8#022) == 0 )) || return 1 ;;
      *) return 1 ;;
    esac
  done < <(command -p find "${__sandfleet_ups[@]}" -maxdepth 0 -printf '%U %m\n' 2>/dev/null || echo x)
  return 0
}

# FILE [ARGS]: FILE sourced in a bash of its own, the code under test (where FILE was a pipe the guard read,
# __sandfleet_pipe: its text, __sandfleet_text, from a file in its place); its scalar variables back as data
__sandfleet_apart() {
  local __sandfleet_out= __sandfleet_before __sandfleet_tmp=() __sandfleet_df= __sandfleet_tx
  __sandfleet_before=$(compgen -e)
  # it gets what a program of the code under test gets: the environment, not the tests' shell variables
  # or functions (round XXII's settings-read-answer: the tests' expected answer in a variable). Files
  # right in /tmp, named by the bash apart: where the seal makes it a user of its own (gVisor), it hands
  # them over (a pipe's /dev/fd path it could not open); the dump a file, not a pipe: a process the
  # sourced file leaves running would hold a pipe open
  if __sandfleet_df=$(command -p mktemp /tmp/sandfleet-source.XXXXXXXX 2>/dev/null); then
    __sandfleet_tmp+=("$__sandfleet_df")
  fi
  if [ -n "${__sandfleet_pipe-}" ] &&
     __sandfleet_tx=$(command -p mktemp /tmp/sandfleet-source.XXXXXXXX 2>/dev/null); then
    __sandfleet_tmp+=("$__sandfleet_tx")
    printf '%s' "${__sandfleet_text-}" > "$__sandfleet_tx"
    set -- "$__sandfleet_tx" "${@:2}"
  fi
  SANDFLEET_SEAL_NATIVE=1 "$BASH" -c '
      trap __sandfleet_dump EXIT
      __sandfleet_f=$1
      shift
      builtin source "$__sandfleet_f" "$@"
      __sandfleet_rc=$?
      __sandfleet_dump
      exit "$__sandfleet_rc"' sandfleet-source "$@" 3>"${__sandfleet_df:-/dev/null}"
  __sandfleet_rc=$?
  if [ -n "$__sandfleet_df" ]; then IFS= read -r -d '' __sandfleet_out < "$__sandfleet_df" || :; fi
  [ "${#__sandfleet_tmp[@]}" = 0 ] || command -p rm -f -- "${__sandfleet_tmp[@]}"
  __sandfleet_take "$__sandfleet_out" "$__sandfleet_before"
  return 0
}

# (in the bash apart) each scalar variable to fd 3: KIND LENGTH ":" NAME "=" VALUE, kind x (exported) or s
__sandfleet_dump() {
  [ -z "${__sandfleet_dumped-}" ] || return 0
  __sandfleet_dumped=1
  local LC_ALL=C IFS=$' \t\n' __sandfleet_n __sandfleet_a __sandfleet_k __sandfleet_e
  for __sandfleet_n in $(compgen -v); do
    case $__sandfleet_n in __sandfleet*) continue ;; esac
    [ "${!__sandfleet_n+set}" = set ] || continue
    __sandfleet_a=${!__sandfleet_n@a}
    case $__sandfleet_a in *[aAn]*) continue ;; esac
    case $__sandfleet_a in *x*) __sandfleet_k=x ;; *) __sandfleet_k=s ;; esac
    __sandfleet_e="$__sandfleet_n=${!__sandfleet_n}"
    printf '%s%s:%s' "$__sandfleet_k" "${#__sandfleet_e}" "$__sandfleet_e" >&3 2>/dev/null || return 0
  done
  printf e >&3 2>/dev/null
  return 0
}

# NAME: a variable a file sourced apart may set in the tests' shell
__sandfleet_settable() {
  [[ $1 =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || return 1
  case $1 in
    __sandfleet*|SANDFLEET_*|BASH_*|LD_*|GIT_*|COMP_*|READLINE_*) return 1 ;;
    @DENIED@) return 1 ;;
    @PYTHON_KEPT@) return 0 ;;
    PYTHON*) return 1 ;;
  esac
  return 0
}

# DUMP BEFORE (the names exported before): the apart bash's variables that changed, set here
# (PYTHONPATH with the guard's folder first), and those it unset unset here: only names the tests' own
# files hold (a word of a file in a tests' folder), and PATH, VIRTUAL_ENV, PYTHONPATH (an activate's).
# A variable no tests' file names is one only a program reads by itself: a tool's configuration
# (PYTEST_PLUGINS, CC, GOFLAGS, MAKEFILES ...)
__sandfleet_take() {
  local LC_ALL=C __sandfleet_s=$1 __sandfleet_k= __sandfleet_len __sandfleet_e __sandfleet_n __sandfleet_v
  local __sandfleet_c __sandfleet_i __sandfleet_d
  local -A __sandfleet_seen=() __sandfleet_named=([PATH]=1 [VIRTUAL_ENV]=1 [PYTHONPATH]=1)
  local -a __sandfleet_ns=() __sandfleet_vs=() __sandfleet_ks=() __sandfleet_gone=() __sandfleet_dirs=()
  while [ -n "$__sandfleet_s" ]; do
    __sandfleet_k=${__sandfleet_s:0:1}
    [ "$__sandfleet_k" = e ] && break
    __sandfleet_s=${__sandfleet_s:1}
    __sandfleet_len=${__sandfleet_s%%:*}
    [[ $__sandfleet_len =~ ^[0-9]{1,9}$ ]] || return 0
    __sandfleet_s=${__sandfleet_s#*:}
    __sandfleet_e=${__sandfleet_s:0:__sandfleet_len}
    __sandfleet_s=${__sandfleet_s:__sandfleet_len}
    __sandfleet_n=${__sandfleet_e%%=*}
    __sandfleet_v=${__sandfleet_e#*=}
    __sandfleet_settable "$__sandfleet_n" || continue
    __sandfleet_seen[$__sandfleet_n]=1
    if [ "$__sandfleet_n" = PYTHONPATH ] && [[ :$__sandfleet_v: != :"$__sandfleet_pydir":* ]]; then
      __sandfleet_v=$__sandfleet_pydir${__sandfleet_v:+:$__sandfleet_v}
    fi
    if [ "${!__sandfleet_n+set}" = set ]; then
      case ${!__sandfleet_n@a} in *[aAnr]*) continue ;; *x*) __sandfleet_c=x ;; *) __sandfleet_c=s ;; esac
      [ "${!__sandfleet_n}" != "$__sandfleet_v" ] || [ "$__sandfleet_c" != "$__sandfleet_k" ] || continue
    fi
    __sandfleet_ns+=("$__sandfleet_n") __sandfleet_vs+=("$__sandfleet_v") __sandfleet_ks+=("$__sandfleet_k")
  done
  if [ "$__sandfleet_k" = e ]; then  # (a dump cut short: nothing it left out is taken for unset)
    while IFS= read -r __sandfleet_n; do
      [ -n "$__sandfleet_n" ] && [ -z "${__sandfleet_seen[$__sandfleet_n]-}" ] || continue
      __sandfleet_settable "$__sandfleet_n" && [ "$__sandfleet_n" != PYTHONPATH ] || continue
      [ "${!__sandfleet_n+set}" = set ] || continue
      case ${!__sandfleet_n@a} in *[aAnr]*) continue ;; esac
      __sandfleet_gone+=("$__sandfleet_n")
    done <<< "$2"
  fi
  [ "$(( ${#__sandfleet_ns[@]} + ${#__sandfleet_gone[@]} ))" != 0 ] || return 0
  while IFS= read -r -d : __sandfleet_d; do
    [ -z "$__sandfleet_d" ] || [ ! -d "$__sandfleet_d" ] || __sandfleet_dirs+=("$__sandfleet_d")
  done <<< "${SANDFLEET_TESTS_DIRS-}:"
  if [ "${#__sandfleet_dirs[@]}" != 0 ]; then
    while IFS= read -r __sandfleet_n; do __sandfleet_named[$__sandfleet_n]=1; done < <(
      printf '%s\n' "${__sandfleet_ns[@]}" "${__sandfleet_gone[@]}" |
        command -p grep -rhoswIF -f /dev/stdin -- "${__sandfleet_dirs[@]}" 2>/dev/null)
  fi
  for __sandfleet_i in "${!__sandfleet_ns[@]}"; do
    __sandfleet_n=${__sandfleet_ns[$__sandfleet_i]}
    [ -n "${__sandfleet_named[$__sandfleet_n]-}" ] || continue
    printf -v "$__sandfleet_n" '%s' "${__sandfleet_vs[$__sandfleet_i]}" 2>/dev/null || continue
    if [ "${__sandfleet_ks[$__sandfleet_i]}" = x ]; then export "$__sandfleet_n"; else export -n "$__sandfleet_n"; fi
  done
  for __sandfleet_n in "${__sandfleet_gone[@]}"; do
    [ -z "${__sandfleet_named[$__sandfleet_n]-}" ] || unset -v "$__sandfleet_n"
  done
  return 0
}

if [ -n "${SANDFLEET_BASH_ENV-}" ]; then  # the image's or the task's own BASH_ENV, through the gate
  source "$SANDFLEET_BASH_ENV"
fi
'''.replace("@DENIED@", "|".join(DENIED)).replace("@PYTHON_KEPT@", "|".join(PYTHON_KEPT))
"""The guard itself (bash 4.4 or later: ``${var@Q}``, ``${var@a}``)."""


def shell_env(env: dict[str, str], guard_dir: str) -> dict[str, str]:
    """``BASH_ENV`` naming the guard in ``guard_dir``, and the BASH_ENV ``env`` had (the image's or
    the task's, kept by the verifier's rules) for the guard to source through its gate."""
    out = {"BASH_ENV": f"{guard_dir.rstrip('/')}/{GUARD_NAME}"}
    if env.get("BASH_ENV"):
        out["SANDFLEET_BASH_ENV"] = env["BASH_ENV"]
    return out
