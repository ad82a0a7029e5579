"""The subset of Dockerfile that sandfleet builds, parsed into steps with line numbers.

Supported: FROM (several stages, ``AS name``, a stage starting ``FROM`` an earlier one), RUN
(shell and exec form), COPY/ADD of files from the build context (``--chown``, ``--chmod``),
``COPY --from=<stage>`` (a name or index of an earlier stage of the same Dockerfile) and
``COPY --from=<the uv image>`` (``ghcr.io/astral-sh/uv[:tag]``: its ``uv``/``uvx`` come from
the ``uv`` package, see :mod:`sandfleet.images.tools`), WORKDIR, ENV (``K V`` and
``K=V ...``), ARG (defaults, build args, ``$VAR`` / ``${VAR}`` / ``${VAR:-x}`` /
``${VAR:+x}`` substitution in later lines), USER (later RUNs run as that user), SHELL (the
shell of later shell-form RUNs). Ignored without error, as they change nothing a task's
commands see: LABEL, EXPOSE, CMD, ENTRYPOINT, HEALTHCHECK, VOLUME, STOPSIGNAL, MAINTAINER.
Everything else -- heredocs, ``RUN --mount``, ``COPY --from`` any other image, ``ADD <url>``,
ONBUILD -- raises :class:`ImageBuildError` naming the file and line (and the image).

Each instruction has one handler in :data:`HANDLERS` (keyword to function over the parse's
state, :class:`_Parse`); an instruction not in the table is refused there. To support one
more, add its handler and its row.
"""

from __future__ import annotations

import json
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NoReturn

from sandfleet.errors import ImageBuildError
from sandfleet.images.bases import BaseRef, resolve_base
from sandfleet.images.lexer import expand, split_words
from sandfleet.images.tools import TOOL_IMAGES, is_tool_image

__all__ = [
    "BaseRef",
    "Copy",
    "Dockerfile",
    "Stage",
    "Env",
    "From",
    "Run",
    "Step",
    "User",
    "Workdir",
    "parse_dockerfile",
    "resolve_base",
]


@dataclass(frozen=True)
class From:
    line: int
    image: str
    """The image reference, ARGs substituted."""
    stage: str | None = None


@dataclass(frozen=True)
class Run:
    line: int
    shell: str | None
    """Shell form: run as ``/bin/sh -c shell``."""
    argv: tuple[str, ...] | None
    """Exec form: run as is."""
    build_args: tuple[tuple[str, str], ...] = ()
    """ARGs in scope: set in the command's environment, as Docker does."""
    via: tuple[str, ...] | None = None
    """Shell form under a ``SHELL ["bash", "-c"]``: run as ``via + (shell,)``."""


@dataclass(frozen=True)
class Copy:
    line: int
    sources: tuple[str, ...]
    """Paths relative to the build context (may hold wildcards)."""
    dest: str
    """Absolute, resolved against the WORKDIR in force."""
    chown: str | None = None
    chmod: str | None = None
    add: bool = False
    """ADD: a local tar archive is unpacked into ``dest``."""
    stage: int | None = None
    """``COPY --from=<stage>``: the index of the stage the sources come from (absolute paths
    in its filesystem)."""
    image: str | None = None
    """``COPY --from=<tool image>``: the image whose files come from its package instead
    (:func:`sandfleet.images.tools.tool_image`)."""


@dataclass(frozen=True)
class Workdir:
    line: int
    path: str


@dataclass(frozen=True)
class Env:
    line: int
    values: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class User:
    line: int
    user: str


Step = From | Run | Copy | Workdir | Env | User


@dataclass(frozen=True)
class Stage:
    """One ``FROM`` and the steps up to the next."""

    index: int
    name: str | None
    """The ``AS`` name (lower case, as Docker keeps it), or None."""
    base: From
    parent: int | None
    """The earlier stage this one starts from (``FROM <stage>``), or None for an image."""
    steps: tuple[Step, ...]
    workdir: str | None
    env: dict[str, str]
    user: str | None


@dataclass(frozen=True)
class Dockerfile:
    """A parsed Dockerfile; ``steps``, ``base``, ``workdir``, ``env`` and ``user`` are the
    final stage's (what the task image is), ``stages`` all of them."""

    path: Path
    steps: tuple[Step, ...]
    base: From
    workdir: str | None
    """The last WORKDIR, or None."""
    env: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    notes: tuple[str, ...] = ()
    stages: tuple[Stage, ...] = ()

    @property
    def base_image(self) -> str:
        """The image the final stage starts from, through the stages it starts from."""
        stage = self.stages[-1] if self.stages else None
        while stage is not None and stage.parent is not None:
            stage = self.stages[stage.parent]
        return stage.base.image if stage is not None else self.base.image

    def needed_stages(self) -> list[int]:
        """Indexes of the stages the final one needs (itself included), in build order:
        BuildKit builds only those."""
        if not self.stages:
            return []
        need: set[int] = set()
        todo = [len(self.stages) - 1]
        while todo:
            i = todo.pop()
            if i in need:
                continue
            need.add(i)
            stage = self.stages[i]
            if stage.parent is not None:
                todo.append(stage.parent)
            todo += [st.stage for st in stage.steps if isinstance(st, Copy) and st.stage is not None]
        return sorted(need)


IGNORED = {
    "LABEL",
    "EXPOSE",
    "CMD",
    "ENTRYPOINT",
    "HEALTHCHECK",
    "VOLUME",
    "STOPSIGNAL",
    "MAINTAINER",
}
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""Docker's default PATH: BuildKit gives it to an image whose config sets no PATH (the
debootstrapped bases set none), so ``ENV PATH=/x:$PATH`` there gives ``/x:`` and this."""
_HEREDOC = re.compile(r"(?<!<)<<-?\s*([\"']?)[A-Za-z_][A-Za-z0-9_]*\1")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _default_args(arch: str | None) -> dict[str, str]:
    machine = arch or {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), "amd64")
    return {
        "TARGETOS": "linux",
        "TARGETARCH": machine,
        "TARGETPLATFORM": f"linux/{machine}",
        "BUILDOS": "linux",
        "BUILDARCH": machine,
        "BUILDPLATFORM": f"linux/{machine}",
    }


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join ``\\`` continuations, drop comments and blank lines; keep first line numbers."""
    out: list[tuple[int, str]] = []
    start, parts = 0, list[str]()
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not parts):
            continue  # comment lines are dropped even inside a continuation
        if not parts:
            start = number
        if raw.rstrip().endswith("\\"):
            parts.append(raw.rstrip()[:-1])
            continue
        parts.append(raw)
        out.append((start, " ".join(p.strip() for p in parts if p.strip())))
        parts = []
    if parts:
        out.append((start, " ".join(p.strip() for p in parts if p.strip())))
    return out


def _flags(rest: str, allowed: set[str], fail: _Fail) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        if name not in allowed:
            fail(f"flag --{name} is not supported")
        flags[name] = value
        rest = rest.lstrip()
    return flags, rest


class _Fail:
    def __init__(self, file: str, line: int = 0):
        self.file, self.line = file, line

    def __call__(self, message: str) -> NoReturn:
        raise ImageBuildError(message, file=self.file, line=self.line or None)


def _base_config(ref: str) -> tuple[dict[str, str], str | None]:
    """The environment and working directory the image ``ref`` starts with (what
    :func:`resolve_base` maps it to); nothing for a base it refuses (the build says why)."""
    try:
        base = resolve_base(ref, accept_older=True)
    except ImageBuildError:
        return {}, None
    return dict(base.env), base.workdir


@dataclass
class _Parse:
    """What the instructions read so far leave in force: the handlers' shared state."""

    fail: _Fail
    overrides: dict[str, str]
    """``--build-arg`` values, over every ARG default."""
    global_args: dict[str, str]
    """ARGs before the first FROM (and the predefined platform ones): FROM lines see them."""
    scope: dict[str, str] = field(default_factory=dict)
    """ARGs and ENVs visible to substitution in the stage."""
    args: dict[str, str] = field(default_factory=dict)
    """ARGs of the stage (passed to RUN)."""
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    base: From | None = None
    parent: int | None = None
    workdir: str | None = None
    user: str | None = None
    shell_argv: tuple[str, ...] | None = None
    shells: list[tuple[str, ...] | None] = field(default_factory=list)
    """Each closed stage's SHELL (a stage started from it inherits it)."""

    def close_stage(self) -> None:
        if self.base is not None:
            self.shells.append(self.shell_argv)
            self.stages.append(Stage(len(self.stages), self.base.stage, self.base, self.parent, tuple(self.steps),
                                     self.workdir, dict(self.env), self.user))


Handler = Callable[[_Parse, str, int, str], None]
"""One instruction: ``(state, keyword, line number, the rest of the line)``."""


def _arg(p: _Parse, keyword: str, number: int, rest: str) -> None:
    for word in split_words(rest, p.scope if p.base else p.global_args):
        name, eq, default = word.partition("=")
        if not _NAME.match(name):
            p.fail(f"bad ARG name {name!r}")
        if p.base is None:
            p.global_args[name] = p.overrides.get(name, default if eq else "")
            continue
        if name in p.overrides:
            value = p.overrides[name]
        elif eq:
            value = default
        else:
            value = p.global_args.get(name, "")
        p.args[name] = value
        if name not in p.env:
            p.scope[name] = value


def _from(p: _Parse, keyword: str, number: int, rest: str) -> None:
    p.close_stage()
    words = split_words(rest, p.global_args)
    if not words or words[0].startswith("--"):
        p.fail("FROM needs an image (flags such as --platform are not supported)")
    stage = None
    if len(words) == 3 and words[1].upper() == "AS":
        stage = words[2].lower()
        if any(st.name == stage for st in p.stages):
            p.fail(f"stage name {stage!r} is used twice")
    elif len(words) != 1:
        p.fail(f"can't parse FROM {rest!r}")
    p.base = From(number, words[0], stage)
    p.parent = _stage_index(words[0], p.stages, by_number=False)
    p.steps, p.args = [p.base], {}
    if p.parent is not None:  # a stage's image config carries over; its ARGs don't
        before = p.stages[p.parent]
        p.env, p.workdir, p.user, p.shell_argv = dict(before.env), before.workdir, before.user, p.shells[p.parent]
    else:  # the named image's own config: a language image's PATH, GOPATH, WORKDIR /go
        (p.env, p.workdir), p.user, p.shell_argv = _base_config(words[0]), None, None
    p.scope = {"PATH": DEFAULT_PATH, **p.env}  # a base without PATH gets Docker's default


def _run(p: _Parse, keyword: str, number: int, rest: str) -> None:
    _, rest = _flags(rest, set(), p.fail)
    argv = _exec_form(rest)
    in_scope = tuple(p.args.items())
    if argv is not None:
        p.steps.append(Run(number, None, tuple(argv), in_scope))
    else:
        p.steps.append(Run(number, rest, None, in_scope, p.shell_argv))


def _shell(p: _Parse, keyword: str, number: int, rest: str) -> None:
    chosen = _exec_form(rest)
    if not chosen:
        p.fail("SHELL needs a JSON array, e.g. SHELL [\"/bin/bash\", \"-c\"]")
    p.shell_argv = tuple(chosen or ())


def _copy(p: _Parse, keyword: str, number: int, rest: str) -> None:
    """COPY and ADD."""
    flags, rest = _flags(rest, {"chown", "chmod", "link", "from"}, p.fail)
    source_stage = image = None
    if "from" in flags:
        source = expand(flags["from"], p.scope)
        source_stage = _stage_index(source, p.stages, by_number=True)
        if source_stage is None:
            image = source
            if not is_tool_image(source):
                p.fail(f"{keyword} --from={source}: copying from the image {source!r} is not supported "
                       f"(sandfleet can't pull images; it builds the stages of this Dockerfile and maps "
                       f"only the uv image, {', '.join(TOOL_IMAGES)}, to its package)")
        if keyword == "ADD":
            p.fail("ADD --from is not supported; use COPY --from")
    listed = _exec_form(rest)
    words = [expand(w, p.scope) for w in listed] if listed else split_words(rest, p.scope)
    if len(words) < 2:
        p.fail(f"{keyword} needs a source and a destination")
    for src in words[:-1]:
        if re.match(r"^[a-z][a-z0-9+.-]*://|^git@", src):
            p.fail(f"{keyword} of a URL ({src}) is not supported; download it in a RUN")
        if "from" in flags:
            continue  # a path in the other stage or image
        if src.startswith("/") or ".." in PurePosixPath(src).parts:
            p.fail(f"{keyword} source {src!r} is outside the build context")
    dest = _absolute(words[-1], p.workdir, keep_slash=True)
    chown = expand(flags["chown"], p.scope) if "chown" in flags else None
    p.steps.append(Copy(number, tuple(words[:-1]), dest, chown, flags.get("chmod"), keyword == "ADD",
                        source_stage, image))


def _workdir(p: _Parse, keyword: str, number: int, rest: str) -> None:
    p.workdir = _absolute(expand(rest, p.scope), p.workdir)
    p.steps.append(Workdir(number, p.workdir))


def _env(p: _Parse, keyword: str, number: int, rest: str) -> None:
    pairs = _env_pairs(rest, p.scope, p.fail)
    for key, value in pairs:
        p.env[key] = p.scope[key] = value
    p.steps.append(Env(number, tuple(pairs)))


def _user(p: _Parse, keyword: str, number: int, rest: str) -> None:
    user = expand(rest, p.scope)
    if not user:
        p.fail("USER needs a user")
    p.user = user
    p.steps.append(User(number, user))


def _ignore(p: _Parse, keyword: str, number: int, rest: str) -> None:
    """An instruction that changes nothing a task's commands see (:data:`IGNORED`)."""


HANDLERS: dict[str, Handler] = {
    "ARG": _arg,
    "FROM": _from,
    "RUN": _run,
    "SHELL": _shell,
    "COPY": _copy,
    "ADD": _copy,
    "WORKDIR": _workdir,
    "ENV": _env,
    "USER": _user,
    **dict.fromkeys(sorted(IGNORED), _ignore),
}
"""Instruction keyword (upper case) to its handler; any other keyword is an
:class:`ImageBuildError` ("instruction X is not supported") naming the file and line."""
BEFORE_FROM = frozenset({"ARG", "FROM"})
"""The instructions allowed before the first FROM."""
HEREDOC_INSTRUCTIONS = frozenset({"RUN", "COPY", "ADD"})
"""Where Docker reads heredocs (refused: not supported)."""


def parse_dockerfile(
    path: Path, *, build_args: dict[str, str] | None = None, arch: str | None = None
) -> Dockerfile:
    """Parse ``path`` into steps. ``build_args`` override ARG defaults (``--build-arg``)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ImageBuildError(f"can't read: {e}", file=str(path)) from None
    fail = _Fail(str(path))
    for directive in re.findall(r"^#\s*escape\s*=\s*(\S+)", text, re.MULTILINE):
        if directive != "\\":
            fail(f"parser directive escape={directive} is not supported")
    overrides = dict(build_args or {})
    p = _Parse(fail, overrides, {**_default_args(arch), **overrides})
    for number, line in _logical_lines(text):
        fail.line = number
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword in HEREDOC_INSTRUCTIONS and _HEREDOC.search(rest):
            fail(f"{keyword} with a heredoc is not supported")
        if keyword not in BEFORE_FROM and p.base is None:
            fail(f"{keyword} before FROM")
        handler = HANDLERS.get(keyword)
        if handler is None:
            fail(f"instruction {keyword} is not supported")
        handler(p, keyword, number, rest)
    if p.base is None:
        raise ImageBuildError("no FROM", file=str(path))
    p.close_stage()
    return Dockerfile(path, tuple(p.steps), p.base, p.workdir, p.env, p.user, (), tuple(p.stages))


def _stage_index(ref: str, stages: list[Stage], *, by_number: bool) -> int | None:
    """The earlier stage ``ref`` names (its ``AS`` name, any case; for ``COPY --from`` also its
    index), or None when it names an image."""
    for stage in stages:
        if stage.name is not None and stage.name == ref.lower():
            return stage.index
    if by_number and ref.isdigit() and int(ref) < len(stages):
        return int(ref)
    return None


def _exec_form(rest: str) -> list[str] | None:
    if not rest.startswith("["):
        return None
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        return None  # Docker falls back to the shell form too
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def _absolute(path: str, workdir: str | None, *, keep_slash: bool = False) -> str:
    joined = PurePosixPath(workdir or "/", path)
    text = str(joined)
    return text + "/" if keep_slash and path.endswith("/") and text != "/" else text


def _env_pairs(rest: str, scope: dict[str, str], fail: _Fail) -> list[tuple[str, str]]:
    first = rest.split(None, 1)
    if not first:
        fail("ENV needs a name and a value")
    if "=" not in first[0]:  # legacy form: ENV KEY the rest of the line
        if len(first) < 2:
            fail(f"ENV {first[0]} needs a value")
        if not _NAME.match(first[0]):
            fail(f"bad ENV name {first[0]!r}")
        return [(first[0], expand(first[1], scope))]
    pairs = []
    local = dict(scope)  # Docker substitutes with the values from before this instruction
    for word in split_words(rest, local):
        key, eq, value = word.partition("=")
        if not eq or not _NAME.match(key):
            fail(f"can't parse ENV {word!r} (expected NAME=value)")
        pairs.append((key, value))
    return pairs
