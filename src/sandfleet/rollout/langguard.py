"""The tests' Node.js and Perl guards (docs/security.md, "Graders in other languages: round XXIII").

A grader that loads the agent's code runs it in its own process, where no seal tells the two apart,
and the tests then read that process's exit status. The Python guard (:mod:`testguard`) judges such
code by the Python stack; these two do the same for the other interpreters a test script commonly
runs, each loaded before the tests' program by the interpreter's own start-up option (written by the
verifier's preparation beside the Python guard, root's, and named in the tests' environment):

- Node.js (``NODE_OPTIONS=--require <guard>``): ``process.exit``/``process.reallyExit`` with status 0
  asked while a frame of the workdir's code (or of code compiled from a string) is on the stack, or
  with no file's frame on it but node's own (a timer's ``process.exit``), ends the program with 1; an exit
  status that was not 0 when ``'exit'`` was emitted, or an uncaught exception the program went on
  after (an ``uncaughtException`` handler that swallowed the tests' failed assertion), can't become
  0 in the handlers; where ``process.exitCode`` is a plain property (Node.js before 20) the code can't
  set a failure's status back to 0; ``assert`` and ``assert/strict`` are frozen (the agent's module
  can't replace ``assert.strictEqual``).
- Perl (``PERL5OPT=-M<guard>`` with its folder on ``-I``): ``exit 0`` asked by a sub of the workdir's
  file ends the program with 1; a ``die`` or a non-zero ``exit`` of the tests stays the status
  whatever an ``END`` block of the agent's sets ``$?`` to. (The seal: a tests' Perl's ``_exit(0)``,
  ``POSIX::_exit``, reports no success.)

Neither guard does anything in a program whose main script is the workdir's: its status is its own.
"""

from __future__ import annotations

from collections.abc import Mapping

NODE_GUARD_NAME = "sandfleet-node.js"
PERL_GUARD_NAME = "sandfleet_guard.pm"

NODE_GUARD = r"""// sandfleet's guard of the tests' Node.js (docs/security.md, round XXIII): NODE_OPTIONS --require.
// Made by root, read-only for the tests. The exit status of a tests' program is the tests' own.
'use strict';
(function sandfleetGuard() {
  const fs = require('fs');
  const path = require('path');
  const url = require('url');
  const list = (v) => (v || '').split(':').filter(Boolean).map((p) => p.replace(/\/+$/, '') || '/');
  const untrusted = list(process.env.SANDFLEET_UNTRUSTED).filter((p) => p !== '/');
  const testsDirs = list(process.env.SANDFLEET_TESTS_DIRS).filter((p) => p !== '/');
  const realpath = fs.realpathSync;
  const writeSync = fs.writeSync;
  const capture = Error.captureStackTrace;
  const real = (f) => { try { return realpath(f); } catch (e) { return path.resolve(f); } };
  const under = (f, dirs) => dirs.some((d) => f === d || f.startsWith(d + '/'));
  const verdicts = new Map();
  const codeFile = (f) => {
    let v = verdicts.get(f);
    if (v === undefined) {
      const r = real(f);
      v = !under(r, testsDirs) && (under(r, untrusted) || /^\/(tmp|var\/tmp|dev\/shm)\//.test(r) ||
                                   r.startsWith('/memfd:'));
      if (verdicts.size < 4096) verdicts.set(f, v);
    }
    return v;
  };
  const mainArg = process.argv[1];
  if (mainArg && codeFile(path.resolve(mainArg))) return; // the workdir's program: its status is its own
  const say = (what) => {
    const m = 'sandfleet: ' + what + ' (docs/security.md, "Graders in other languages")\n';
    try { writeSync(2, m); } catch (e) { /* */ }
  };
  // the stack's frames: [file, compiled from a string]; null when it can't be read (then: the code's)
  function frames() {
    const holder = {};
    const prep = Error.prepareStackTrace;
    const limit = Error.stackTraceLimit;
    try {
      Error.stackTraceLimit = Infinity;
      Error.prepareStackTrace = (_, sites) => sites;
      capture(holder, frames);
      const sites = holder.stack;
      if (!Array.isArray(sites)) return null;
      return sites.map((s) => [s.getFileName() || '', !!s.isEval()]);
    } catch (e) {
      return null;
    } finally {
      try { Error.prepareStackTrace = prep; Error.stackTraceLimit = limit; } catch (e) { /* */ }
    }
  }
  // what runs now is the code under test's: a frame of the workdir's (or compiled from a string), or no frame
  // of a file at all but node's own (a timer that calls process.exit itself). A file's frame that is not the
  // workdir's is the tests' or the system's (their main script, a tests' folder's file, their -e one-liner,
  // npm's own modules: npm ends by process.exit from a callback of its own)
  function byCode() {
    const fr = frames();
    if (fr === null) return true;
    let tests = false;
    for (const [name, evaled] of fr) {
      if (name === __filename) continue;
      if (evaled) return true;
      if (!name || name.startsWith('node:')) continue;
      if (name.startsWith('[eval')) { tests = true; continue; }
      let file = name;
      if (name.startsWith('file://')) { try { file = url.fileURLToPath(name); } catch (e) { return true; } }
      if (!file.startsWith('/')) continue;
      if (codeFile(file)) return true;
      tests = true;
    }
    return !tests;
  }
  const zero = (c) => c === undefined || c === null || Number(c) === 0;
  // process.NAME as an accessor that keeps this guard outermost: a library that wraps it (signal-exit's
  // process.emit = ...) sets what the guard calls; a call back into the guard from there (the wrapper
  // calling the function it saved, the guard) goes to the real one
  const outermost = (name, guard) => {
    const real_ = process[name];
    if (typeof real_ !== 'function') return;
    let inner = real_;
    let depth = 0;
    const guarded = function () {
      if (depth > 0) return real_.apply(this, arguments);
      depth++;
      try { return guard.call(this, inner, arguments); } finally { depth--; }
    };
    try {
      Object.defineProperty(process, name, {
        get: () => guarded, set: (f) => { if (typeof f === 'function') inner = f; },
        configurable: false, enumerable: true });
    } catch (e) { /* */ }
  };
  for (const name of ['exit', 'reallyExit']) {
    outermost(name, function (inner, args) {
      const code = args[0];
      if (zero(code === undefined ? process.exitCode : code) && byCode()) {
        say('the code under test ended the tests\' node program with status 0 (process.' + name + '); it exits 1');
        return inner.call(process, 1);
      }
      return inner.apply(process, args);
    });
  }
  // process.exitCode where it is a plain property (Node.js before 20; 20 made it an accessor of its own, not
  // configurable): the code under test can't set a failure's status back to 0 (a callback it left to run
  // after the grader's last line)
  const desc = Object.getOwnPropertyDescriptor(process, 'exitCode');
  if (!desc || desc.configurable) {
    let code = desc ? desc.value : undefined;
    const get = desc && desc.get;
    const set = desc && desc.set;
    try {
      Object.defineProperty(process, 'exitCode', {
        get: get ? function () { return get.call(process); } : () => code,
        set: (v) => {
          const now = get ? get.call(process) : code;
          if (zero(v) && !zero(now) && byCode()) {
            say('the code under test set the tests\' failed status (' + now + ') back to 0; it stays ' + now);
            return;
          }
          if (set) set.call(process, v); else code = v;
        },
        configurable: false, enumerable: true });
    } catch (e) { /* */ }
  }
  let uncaught = false;
  process.on('uncaughtExceptionMonitor', () => { uncaught = true; });
  outermost('emit', function (inner, args) {
    if (args[0] !== 'exit') return inner.apply(this, args);
    const before = process.exitCode;
    const r = inner.apply(this, args);
    if (zero(process.exitCode) && (uncaught || !zero(before) || !zero(args[1]))) {
      const status = uncaught ? 1 : (Number(before) || Number(args[1]) || 1);
      say('the tests\' node program failed (' + (uncaught ? 'an uncaught exception' : 'status ' + status) +
          ') and its exit handlers made it 0; it exits ' + status);
      process.exitCode = status;
    }
    return r;
  });
  for (const name of ['assert', 'assert/strict']) {
    try { Object.freeze(require(name)); } catch (e) { /* */ }
  }
})();
"""
"""The Node.js guard (Node 12 or later: ``uncaughtExceptionMonitor`` from 13.7, ignored before)."""

PERL_GUARD = r"""# sandfleet's guard of the tests' Perl (docs/security.md, round XXIII): PERL5OPT -Msandfleet_guard.
# Made by root, read-only for the tests. The exit status of a tests' program is the tests' own.
package sandfleet_guard;
use strict;
no warnings;
# the folders a colon list of the environment names, without their trailing '/' (never '/' itself)
sub _dirs {
  my $v = $ENV{$_[0]};
  return grep { length && $_ ne '/' } map { my $p = $_; $p =~ s{/+$}{}; $p } split /:/, (defined $v ? $v : '');
}
my @untrusted = _dirs('SANDFLEET_UNTRUSTED');
my @tests = _dirs('SANDFLEET_TESTS_DIRS');
my %verdict;
sub _code_file {
  my ($f) = @_;
  return $verdict{$f} if exists $verdict{$f};
  my $r = $f;
  if (-e $f) { require Cwd; my $a = Cwd::abs_path($f); $r = $a if defined $a; }
  my $v = ($r =~ m{^/(?:tmp|var/tmp|dev/shm)/}) ? 1 : 0;
  for my $u (@untrusted) { $v = 1 if $r eq $u || index($r, "$u/") == 0 }
  for my $t (@tests) { $v = 0 if $r eq $t || index($r, "$t/") == 0 }
  $verdict{$f} = $v;
}
my $main = $0;
return 1 if $main ne '-e' && $main ne '-E' && $main ne '-' && _code_file($main);  # the workdir's program
# a sub of the workdir's file (or compiled in one's string eval) is on the stack
sub _by_code {
  for (my $i = 1; ; $i++) {
    my @c = caller($i);
    last unless @c;
    next if $c[1] eq __FILE__ || $c[1] =~ /^\(eval/;
    return 1 if _code_file($c[1]);
  }
  return 0;
}
sub _say { my $m = "sandfleet: $_[0] (docs/security.md, \"Graders in other languages\")\n"; syswrite STDERR, $m }
our $status;  # the status the tests' program asked for: its exit's, or its failure's (a die)
*CORE::GLOBAL::exit = sub (;$) {
  my $s = @_ ? int($_[0] || 0) : 0;
  if ($s == 0 && _by_code()) {
    _say("the code under test ended the tests' perl program with exit 0; it exits 1");
    $s = 1;
  }
  $status = $s;
  CORE::exit($s);
};
*CORE::GLOBAL::die = sub { $status = 255 unless $^S; CORE::die(@_) };
$SIG{__DIE__} = sub { $status = 255 unless $^S } unless defined $SIG{__DIE__};
END {
  if (defined $status && $status && !$?) {
    _say("the tests' perl program failed (status $status) and an END block made its status 0; it exits $status");
    $? = $status;
  }
}
1;
"""
"""The Perl guard (perl 5.10 or later)."""


def lang_env(env: Mapping[str, str], guard_dir: str) -> dict[str, str]:
    """``NODE_OPTIONS`` and ``PERL5OPT`` loading the guards in ``guard_dir`` before what ``env`` had."""
    d = guard_dir.rstrip("/")
    node = f"--require {d}/{NODE_GUARD_NAME}"
    perl = f"-I{d} -Msandfleet_guard"
    out = {"NODE_OPTIONS": " ".join(filter(None, [node, env.get("NODE_OPTIONS", "")])),
           "PERL5OPT": " ".join(filter(None, [perl, env.get("PERL5OPT", "")]))}
    return out
