"""The REPL server that runs inside a sandbox: stateful Python without Jupyter.

sandfleet ships this file's text as ``python3 -c <text>`` (stdlib only, Python 3.8+), as one
long-lived command whose stdin carries requests and whose stdout carries events, one JSON
object a line each way (see :mod:`sandfleet.interpreter.kernel` for the host's side).

Requests: ``{"id", "op": "run", "ctx", "code", "env"?, "cwd"?, "lang"?}``, ``{"id", "op":
"reset", "ctx"}`` (a fresh globals dict, or a fresh shell), ``{"id", "op": "drop", "ctx"}``.
``lang`` ``bash`` (on a context's first cell) makes it a bash context: a long-lived bash
(:class:`Shell`) whose cells are sourced; a failed cell's ``error`` has no name and its exit
status as value, as Jupyter's bash kernel reports it. Events carry the request's
``id`` and a ``type``: ``stdout`` / ``stderr`` (``text``), ``result`` (``text`` and the rich
forms: ``html``, ``markdown``, ``svg``, ``png``, ``jpeg``, ``latex``, ``json``, ``pdf``,
``javascript``; ``is_main_result`` for the cell's value), ``error`` (``name``, ``value``,
``traceback``) and last ``end`` (``execution_count``).

Each context is a globals dict and a working directory; cells run one at a time in the main
thread (SIGINT interrupts one: KeyboardInterrupt). The value of a cell's last expression is
its result, as in Jupyter. Python-level prints stream line by line; file descriptors 1 and 2
are pipes read by threads, so subprocesses' output streams too, and the events channel is a
private descriptor no cell writes to. matplotlib, when importable, draws with Agg, and every
figure open at a cell's end comes back as a PNG display result (then closed).
"""

import ast
import base64
import io
import json
import linecache
import os
import signal
import sys
import threading
import time
import traceback

OUT = os.dup(1)
LOCK = threading.Lock()
MARK = b"\x00\x1bsandfleet-sync\x1b\x00"
CURRENT = {"id": None}


def send(msg):
    data = (json.dumps(msg, default=str) + "\n").encode()
    with LOCK:
        view = memoryview(data)
        while view:
            view = view[os.write(OUT, view):]


def emit(kind, text):
    if text:
        send({"id": CURRENT["id"], "type": kind, "text": text, "timestamp": time.time_ns()})


class Stream(io.TextIOBase):
    """sys.stdout / sys.stderr: whole lines go out as they are written, the rest on flush."""

    encoding = "utf-8"

    def __init__(self, kind, fd):
        self.kind = kind
        self.fd = fd
        self.buf = ""

    def writable(self):
        return True

    def fileno(self):
        return self.fd

    def isatty(self):
        return False

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        self.buf += s
        cut = self.buf.rfind("\n") + 1
        if cut:
            emit(self.kind, self.buf[:cut])
            self.buf = self.buf[cut:]
        return len(s)

    def flush(self):
        if self.buf:
            emit(self.kind, self.buf)
            self.buf = ""


class Pipe:
    """A pipe on fd 1 or 2 (subprocesses' output), read by a thread; ``sync`` waits until
    all that was written before it has gone out."""

    def __init__(self, kind, fd):
        self.kind = kind
        r, w = os.pipe()
        os.dup2(w, fd)
        os.close(w)
        self.fd = fd
        self.r = r
        self.synced = threading.Event()
        threading.Thread(target=self.pump, daemon=True).start()

    def pump(self):
        pending = b""
        while True:
            chunk = os.read(self.r, 65536)
            if not chunk:
                return
            pending += chunk
            while True:
                at = pending.find(MARK)
                if at < 0:
                    break
                self.out(pending[:at])
                pending = pending[at + len(MARK):]
                self.synced.set()
            keep = 0
            for k in range(min(len(MARK) - 1, len(pending)), 0, -1):
                if pending.endswith(MARK[:k]):
                    keep = k
                    break
            self.out(pending[:len(pending) - keep])
            pending = pending[len(pending) - keep:]

    def out(self, data):
        if data:
            emit(self.kind, data.decode("utf-8", "replace"))

    def sync(self):
        self.synced.clear()
        os.write(self.fd, MARK)
        self.synced.wait(5)


class Context:
    def __init__(self, name, cwd, lang="python"):
        self.name = name
        self.cwd = cwd
        self.lang = lang
        self.globals = fresh()
        self.shell = None
        """A bash context's :class:`Shell`, started on its first cell."""

    def reset(self):
        self.globals = fresh()
        if self.shell is not None:
            self.shell.close()
            self.shell = None


class Shell:
    """A bash context: one long-lived ``bash`` (its variables, functions and working directory
    last from cell to cell), whose output goes to fds 1 and 2 like a subprocess's. A cell is a
    file it sources (stdin /dev/null); the cell's exit status comes back on a pipe of its own.
    SIGINT (an interrupt) returns from the cell, and the shell goes on."""

    def __init__(self, cwd):
        import fcntl
        import subprocess  # here, not at the top: only bash contexts pay for it (a kernel's start does not)

        r, w = os.pipe()
        self.w = fcntl.fcntl(w, fcntl.F_DUPFD, 200)  # out of a cell's way (exec 3>...)
        os.close(w)
        self.r = r
        self.buf = b""
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE, cwd=cwd,
                                     pass_fds=(self.w,), start_new_session=True)
        os.close(self.w)
        self.send("trap 'return 130' INT\n")

    def send(self, text):
        stdin = self.proc.stdin
        if stdin is None:
            raise OSError("bash has no stdin")
        stdin.write(text.encode())
        stdin.flush()

    def run(self, code, env):
        """The cell's exit status, or (None, bash's own) when the cell ended the shell."""
        import shlex
        import tempfile

        fd, path = tempfile.mkstemp(prefix=".sandfleet-cell-", suffix=".sh")
        with os.fdopen(fd, "w") as f:
            f.write(code if code.endswith("\n") else code + "\n")
        lines, restore = [], []
        for i, (k, v) in enumerate(env.items()):
            if not str(k).isidentifier():
                continue
            lines.append(f"__sf_old_{i}=${{{k}+x}}${{{k}-}}; export {k}={shlex.quote(str(v))}")
            restore.append(f'if [ -n "$__sf_old_{i}" ]; then export {k}="${{__sf_old_{i}#x}}"; else unset {k}; fi; '
                           f"unset __sf_old_{i}")
        # the status pipe closed for the cell: a job it leaves behind never holds it open
        lines.append(f". {shlex.quote(path)} </dev/null {self.w}>&-")
        lines.append("__sf_rc=$?")
        lines += restore
        lines.append(f"rm -f {shlex.quote(path)}; printf '%s\\n' \"$__sf_rc\" >&{self.w}; unset __sf_rc")
        try:
            self.send("\n".join(lines) + "\n")
        except OSError:
            pass  # gone: read_status says so
        while True:
            try:
                return self.read_status()
            except KeyboardInterrupt:
                try:
                    os.killpg(self.proc.pid, signal.SIGINT)
                except OSError:
                    pass

    def read_status(self):
        while b"\n" not in self.buf:
            chunk = os.read(self.r, 64)
            if not chunk:
                return None, self.proc.wait()
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return int(line), None

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        os.close(self.r)


def run_bash(ctx, code, env):
    """One cell of a bash context: an ``error`` event (Jupyter's bash kernel's: no name, the exit
    status as value) when its last command failed."""
    if ctx.shell is None:
        ctx.shell = Shell(ctx.cwd)
    status, died = ctx.shell.run(code, env)
    if status is None:
        ctx.shell.close()
        ctx.shell = None
        emit("stderr", f"bash exited (status {died}): this context's next cell starts a fresh shell\n")
        status = died if died else 1
    return status


def fresh():
    g = {"__name__": "__main__", "__builtins__": __builtins__, "display": display}
    return g


FORMS = (("_repr_html_", "html"), ("_repr_markdown_", "markdown"), ("_repr_svg_", "svg"), ("_repr_png_", "png"),
         ("_repr_jpeg_", "jpeg"), ("_repr_latex_", "latex"), ("_repr_json_", "json"), ("_repr_pdf_", "pdf"),
         ("_repr_javascript_", "javascript"))


def bundle(value):
    """The forms of a value, as Jupyter's display formatter would give them."""
    out = {"text": repr(value)}
    fig = figure_png(value)
    if fig is not None:
        out["png"] = fig
    for method, key in FORMS:
        fn = getattr(value, method, None)
        if not callable(fn) or isinstance(value, type):
            continue
        try:
            data = fn()
        except Exception:
            continue
        if isinstance(data, tuple):
            data = data[0]
        if data is None:
            continue
        if isinstance(data, bytes):
            data = base64.b64encode(data).decode()
        out[key] = data
    return out


def display(*values):
    """Show values as display results (not the cell's own result)."""
    for v in values:
        send({"id": CURRENT["id"], "type": "result", "is_main_result": False, **bundle(v)})


def figure_png(value):
    mpl = sys.modules.get("matplotlib.figure")
    if mpl is None or not isinstance(value, mpl.Figure):
        return None
    buf = io.BytesIO()
    value.savefig(buf, format="png", bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def show_figures():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        try:
            send({"id": CURRENT["id"], "type": "result", "is_main_result": False, "text": repr(fig),
                  "png": figure_png(fig)})
        except Exception as err:
            emit("stderr", f"a figure could not be drawn: {type(err).__name__}: {err}\n")
    plt.close("all")


def run(ctx, code, count):
    name = f"<cell {count}>"
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ctx.globals)
    if last is not None:
        value = eval(compile(last, name, "eval"), ctx.globals)
        if value is not None:
            ctx.globals["_"] = value
            return value
    return None


def report(err):
    tb = err.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
        tb = tb.tb_next  # the REPL's own frames are no part of the cell's traceback
    lines = traceback.format_exception(type(err), err, tb)
    if isinstance(err, SyntaxError):
        lines = traceback.format_exception_only(type(err), err)
    send({"id": CURRENT["id"], "type": "error", "name": type(err).__name__, "value": str(err),
          "traceback": "".join(lines)})


def settle(pipes):
    """Everything the cell printed goes out before its result, error or end."""
    sys.stdout.flush()
    sys.stderr.flush()
    for p in pipes:
        p.sync()


def main():
    os.environ.setdefault("MPLBACKEND", "Agg")
    stdin = os.fdopen(os.dup(0), "rb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a cell that reads stdin gets EOF, not the next request
    pipes = [Pipe("stdout", 1), Pipe("stderr", 2)]
    sys.stdin = open(os.devnull)
    sys.stdout = Stream("stdout", 1)
    sys.stderr = Stream("stderr", 2)
    contexts: dict = {}
    count = 0
    send({"id": None, "type": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
    while True:
        try:
            line = stdin.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError:
            continue
        CURRENT["id"] = req.get("id")
        op = req.get("op")
        name = str(req.get("ctx") or "default")
        if op in ("reset", "drop"):
            if op == "drop":
                gone = contexts.pop(name, None)
                if gone is not None:
                    gone.reset()
            elif name in contexts:
                contexts[name].reset()
            send({"id": CURRENT["id"], "type": "end", "execution_count": count})
            continue
        ctx = contexts.get(name)
        if ctx is None:
            ctx = contexts[name] = Context(name, req.get("cwd") or os.getcwd(),  # noqa: PTH109 (stdlib os only)
                                           req.get("lang") or "python")
        env = req.get("env") or {}
        if ctx.lang == "bash":
            count += 1
            try:
                status = run_bash(ctx, str(req.get("code") or ""), env)
            except Exception as err:  # bash could not start (none in the image, ...)
                settle(pipes)
                report(err)
            else:
                settle(pipes)
                if status:
                    send({"id": CURRENT["id"], "type": "error", "name": "", "value": str(status), "traceback": ""})
            send({"id": CURRENT["id"], "type": "end", "execution_count": count})
            continue
        saved = {k: os.environ.get(k) for k in env}
        count += 1
        try:
            try:
                os.environ.update({str(k): str(v) for k, v in env.items()})
                os.chdir(ctx.cwd)
                value = run(ctx, str(req.get("code") or ""), count)
                settle(pipes)
                show_figures()
                if value is not None:
                    send({"id": CURRENT["id"], "type": "result", "is_main_result": True, **bundle(value)})
            except BaseException as err:  # the cell's, KeyboardInterrupt and SystemExit included
                settle(pipes)
                report(err)
            finally:
                ctx.cwd = os.getcwd()  # noqa: PTH109
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        except KeyboardInterrupt:
            report(KeyboardInterrupt())
        send({"id": CURRENT["id"], "type": "end", "execution_count": count})


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
