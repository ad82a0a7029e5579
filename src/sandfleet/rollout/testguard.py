"""What the verifier puts around the tests so that the agent's workdir can't raise the reward
(docs/security.md, "Reward integrity"). Each piece runs in the sandbox as its root:

- :data:`SANITIZE_GIT`: every git repository under the workdir keeps only an allowlist of
  config keys (no ``core.fsmonitor``, hooks path, pager, drivers, aliases, includes, credential
  helpers, ...), its hooks folders are emptied, and a ``.git`` file, link or ``commondir``
  that leads out of the workdir is removed. :func:`git_env` adds command-line config that
  switches off what a repository could still ask for.
- :data:`PY_GUARD`: a ``sitecustomize`` in a root-owned folder put first on the tests'
  ``PYTHONPATH``. It installs a meta-path finder that resolves a top-level module found in
  a trusted ``sys.path`` entry (the standard library, site-packages; not the workdir, not
  the cwd) from there first, so a workdir ``json.py`` never replaces the standard library's,
  while a workdir module no trusted entry has still imports. It then runs the image's own
  ``sitecustomize``, if any.

(The test command itself runs as the first process of a pid namespace of its own, which the
guest agent makes before its seccomp filter: when it exits, the kernel kills every process
it left before the exec returns; ``Sandbox.exec(pid_namespace=True)``.)
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

GIT_ALLOWED = (
    "core.repositoryformatversion core.filemode core.bare core.logallrefupdates core.ignorecase "
    "core.precomposeunicode core.symlinks core.autocrlf core.eol core.safecrlf core.worktree "
    "core.sharedrepository core.quotepath core.checkstat core.trustctime core.untrackedcache "
    "core.splitindex core.commitgraph core.multipackindex core.sparsecheckout core.sparsecheckoutcone "
    "core.abbrev core.compression core.bigfilethreshold extensions.objectformat extensions.worktreeconfig "
    "extensions.refstorage extensions.partialclone extensions.preciousobjects extensions.noop "
    "user.name user.email init.defaultbranch index.version index.sparse gc.auto "
    "remote.*.url remote.*.pushurl remote.*.fetch remote.*.push remote.*.tagopt remote.*.promisor "
    "remote.*.partialclonefilter branch.*.remote branch.*.merge branch.*.rebase branch.*.pushremote "
    "submodule.*.url submodule.*.active submodule.*.branch"
)
"""The git config keys a repository of the agent keeps (``*``: any subsection): none runs a
program."""

GIT_OVERRIDES = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.pager", "cat"),
    ("protocol.ext.allow", "never"),
    ("credential.helper", ""),
    ("safe.bareRepository", "explicit"),
    ("safe.directory", "*"),
    ("gc.autoDetach", "false"),
)
"""Command-line config (``GIT_CONFIG_COUNT``, git >= 2.31) of the tests: it wins over any
repository's config. ``safe.bareRepository=explicit``: a bare repository is never found by
walking up from the cwd (a folder of the workdir laid out as one, whose config nobody
sanitized, is not a repository to the tests' git). ``gc.autoDetach=false``: an automatic gc
runs in the foreground, not as a daemon the verifier's warden would count. ``safe.directory=*``:
every repository the tests reach was sanitized here, so git works for them whoever owns it (on
microvm the tests run as root over a workdir of another uid: git refused it as of "dubious
ownership")."""

# The git config filter: only allowlisted keys with plain values (no quotes, backslashes or
# comments), each re-emitted under a header written here. What it can't parse is dropped, so
# whatever the input, the output holds allowlisted keys only.
_GIT_AWK = r"""
BEGIN { n = split(allow, a, " "); for (i = 1; i <= n; i++) ok[a[i]] = 1 }
{
  t = $0; sub(/^[ \t]+/, "", t); sub(/[ \t\r]+$/, "", t)
  if (t == "" || t ~ /^[#;]/) next
  if (substr(t, 1, 1) == "[") {
    sec = ""; name = ""
    if (t ~ /^\[[A-Za-z0-9-]+\]$/) { sec = tolower(substr(t, 2, length(t) - 2)) }
    else if (t ~ /^\[[A-Za-z0-9-]+ "[^"\\]*"\]$/) {
      sp = index(t, " "); sec = tolower(substr(t, 2, sp - 2)); name = substr(t, sp + 2, length(t) - sp - 3)
    }
    next
  }
  raw = t; sub(/[ \t]*=.*/, "", raw)
  if (sec == "" || t !~ /^[A-Za-z][A-Za-z0-9-]*([ \t]*=[ \t]*[^"\\;#]*)?$/) { printf "%s ", raw > "/dev/stderr"; next }
  eq = index(t, "=")
  if (eq) { key = substr(t, 1, eq - 1); val = substr(t, eq + 1) } else { key = t; val = "true" }
  sub(/[ \t]+$/, "", key); sub(/^[ \t]+/, "", val); key = tolower(key)
  full = (name == "") ? sec "." key : sec ".*." key
  if (!(full in ok)) { printf "%s.%s ", sec, key > "/dev/stderr"; next }
  if (name == "") print "[" sec "]"; else print "[" sec " \"" name "\"]"
  print "\t" key " = " val
}
"""

SANITIZE_GIT = r"""
gitlike() {
  [ -e "$1/HEAD" ] || [ -L "$1/HEAD" ] || [ -e "$1/commondir" ] || [ -L "$1/commondir" ] ||
  [ -e "$1/objects" ] || [ -L "$1/objects" ] || [ -e "$1/refs" ] || [ -L "$1/refs" ]
}
sanitize_git() {
  w=$1
  [ -d "$w" ] && [ ! -L "$w" ] || return 0
  # one walk of the tree finds all three kinds (each list is worked through in this order)
  # (a pipe into the loop, which runs in this shell: lastpipe; not <(...), which needs /dev/fd,
  # and a microvm guest had none: the walk found nothing and nothing was sanitized there)
  local pointers=() configs=() hooks=() e lp
  lp=$(shopt -p lastpipe); set +m; shopt -s lastpipe
  find "$w" \( \( -name .git -o -name commondir \) \( -type f -o -type l \) -printf 'P%p\0' \) -o \
       \( \( -name config -o -name config.worktree \) \( -type f -o -type l \) -printf 'C%p\0' \) -o \
       \( -name hooks \( -type d -o -type l \) -printf 'H%p\0' \) 2>/dev/null |
  while IFS= read -r -d '' e; do
    case $e in P*) pointers+=("${e#?}") ;; C*) configs+=("${e#?}") ;; H*) hooks+=("${e#?}") ;; esac
  done
  $lp
  # pointers that lead out of the workdir: a .git file or link, a worktree's commondir
  for f in "${pointers[@]}"; do
    if [ -L "$f" ]; then t=$(readlink -m -- "$f")
    else
      IFS= read -r t < "$f" || true
      case ${f##*/} in .git) t=${t#gitdir: } ;; esac
      case $t in /*) ;; *) t=${f%/*}/$t ;; esac
      t=$(readlink -m -- "$t")
    fi
    case $t in "$w"|"$w"/*) ;; *) rm -f -- "$f"; echo "removed $f (leads to $t)" ;; esac
  done
  # every config of a folder git could read as a git folder, found the way git finds them (a
  # HEAD of any kind, a dangling link included; objects or refs, as a worktree's common
  # folder has without a HEAD; a commondir), not only folders with a HEAD: allowlisted keys only
  for f in "${configs[@]}"; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    d=${f%/*}
    [ "${f##*/}" = config.worktree ] || gitlike "$d" || continue
    tmp=$(mktemp -- "$d/.sandfleet-config.XXXXXXXX") || continue
    if [ -L "$f" ]; then printf '[core]\n\trepositoryformatversion = 0\n' > "$tmp"; dropped="(a link)"
    else dropped=$(awk -v allow="$GIT_ALLOWED" "$GIT_AWK" < "$f" 2>&1 > "$tmp") || { : > "$tmp"; dropped="(all)"; }; fi
    [ -z "$dropped" ] || echo "sanitized $f, removed: $(printf '%s' "${dropped% }" | head -c 400)"
    chmod 0644 -- "$tmp"; mv -f -T -- "$tmp" "$f"
  done
  # hooks folders of git folders: emptied (a link is replaced by an empty folder)
  for h in "${hooks[@]}"; do
    gitlike "${h%/*}" || continue
    if [ -L "$h" ] || [ -n "$(find "$h" -mindepth 1 -maxdepth 1 ! -name '*.sample' -print -quit)" ]; then
      echo "emptied $h"
    fi
    rm -rf -- "$h"; mkdir -m 0755 -- "$h"
  done
}
"""


def sanitize_git_script() -> str:
    """The bash function :data:`SANITIZE_GIT` with its allowlist and filter bound."""
    from shlex import quote

    return f"GIT_ALLOWED={quote(GIT_ALLOWED)}\nGIT_AWK={quote(_GIT_AWK)}\n{SANITIZE_GIT}"


def git_env(env: Mapping[str, str]) -> dict[str, str]:
    """``GIT_CONFIG_COUNT``/``KEY_n``/``VALUE_n`` adding :data:`GIT_OVERRIDES` after any
    command-line config ``env`` already has."""
    try:
        start = max(0, int(env.get("GIT_CONFIG_COUNT", "0")))
    except ValueError:
        start = 0
    out = {"GIT_CONFIG_COUNT": str(start + len(GIT_OVERRIDES))}
    for i, (key, value) in enumerate(GIT_OVERRIDES, start):
        out[f"GIT_CONFIG_KEY_{i}"], out[f"GIT_CONFIG_VALUE_{i}"] = key, value
    return out


PY_GUARD = r'''"""sandfleet's verifier guard (docs/security.md): a module of the agent's workdir never
replaces a standard-library or installed one. Made by root; read-only for the tests."""


def _sandfleet_guard():
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.realpath(__file__))
    untrusted = [p.rstrip("/") for p in os.environ.get("SANDFLEET_UNTRUSTED", "").split(":") if p]

    def trusted(entry):
        if not isinstance(entry, str) or entry in ("", "."):
            return False
        real = os.path.realpath(entry)
        if real == here:
            return False
        return not any(real == u or real.startswith(u + "/") for u in untrusted)

    # site runs before the cwd or script folder is put first on sys.path: none of them is here
    paths = [p for p in sys.path if trusted(p)]
    builtin = set(sys.builtin_module_names)
    try:
        from _imp import is_frozen
    except ImportError:
        def is_frozen(name):
            return False

    sealed = []

    def seal_rewards():
        """This program loads code of the workdir: the seal's rule (agent/seal.c,
        sandfleet_seal_rewards) keeps the reward folders from it, unless it is a grader."""
        if sealed:
            return
        sealed.append(1)
        try:
            import ctypes

            lib = ctypes.CDLL(None)
            rc = lib.sandfleet_seal_rewards()
        except (ImportError, OSError, AttributeError):  # no seal loaded
            return
        if rc == 2:  # no Landlock, the tests root: from here on this program is the tests' user,
            # in every thread (glibc's setresuid does them all)
            lib.sandfleet_seal_uid.restype = ctypes.c_long
            uid = lib.sandfleet_seal_uid()
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
            except (OSError, ValueError):
                os.write(2, b"sandfleet: could not run the code under test as the tests' user; stopped\n")
                os._exit(126)
        if rc in (1, 2):  # kept: the code under test's own HOME, not the tests'
            lib.sandfleet_seal_code_home.restype = ctypes.c_char_p
            home = lib.sandfleet_seal_code_home()
            if home:
                os.environ["HOME"] = os.fsdecode(home)

    def audit(event, args):
        if event != "compile" or sealed or len(args) < 2 or not isinstance(args[1], (str, bytes)):
            return
        name = os.fsdecode(args[1])
        if name and not name.startswith("<") and untrusted_path(name):  # a workdir file (runpy.run_path)
            seal_rewards()

    class SandfleetTrustedFirst:
        """Top-level modules that a trusted sys.path entry has: from there, first."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is not None or "." in name or name in builtin or is_frozen(name):
                return None
            spec = PathFinder.find_spec(name, paths)
            if spec is None:
                if not sealed and PathFinder.find_spec(name, [p for p in sys.path if not trusted(p)]) is not None:
                    seal_rewards()  # found in the workdir (or the cwd): the import goes on from there
                return None
            if spec.loader is None:  # a namespace package: of the trusted portions only
                portions = list(spec.submodule_search_locations or ())
                if not portions:
                    return None
                spec.submodule_search_locations = portions  # fixed: not recomputed from sys.path
            return spec

        @classmethod
        def invalidate_caches(cls):
            return None

    sys.meta_path.insert(0, SandfleetTrustedFirst)
    sys.addaudithook(audit)

    def untrusted_path(p):
        real = os.path.realpath(str(p))
        return real == here or any(real == u or real.startswith(u + "/") for u in untrusted)

    find_distributions = PathFinder.find_distributions

    def trusted_distributions(*args, **kwargs):
        """Distributions for a scan of them all (entry points: pytest's plugins) come from
        trusted entries only; one asked for by name (its version) is found anywhere."""
        context = args[0] if args else kwargs.get("context")
        named = getattr(context, "name", None) is not None
        for dist in find_distributions(*args, **kwargs):
            where = getattr(dist, "_path", None)
            if named or where is None or not untrusted_path(where):
                yield dist

    PathFinder.find_distributions = staticmethod(trusted_distributions)
    spec = PathFinder.find_spec("sitecustomize", paths)  # the image's own, if any
    if spec is not None and spec.loader is not None:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


try:
    _sandfleet_guard()
except Exception as e:  # never break the tests' Python
    import sys

    print("sandfleet sitecustomize: %s: %s" % (type(e).__name__, e), file=sys.stderr)
del _sandfleet_guard
'''


def python_env(env: Mapping[str, str], guard_dir: str, workdir: str) -> dict[str, str]:
    """``PYTHONPATH`` with the guard folder first (then what ``env`` had), and the workdir
    named untrusted."""
    old = env.get("PYTHONPATH", "")
    return {"PYTHONPATH": guard_dir + (":" + old if old else ""),
            "SANDFLEET_UNTRUSTED": posixpath.normpath(workdir)}
