#!/usr/bin/env python3
"""Build the bundled SWE-bench-format instances (examples/swebench) from published sdists.

GitHub is out of reach here, so each instance is made from two releases of a pure-Python
project whose sdists carry their tests: the repository at ``base_commit`` is the older sdist,
unpacked and committed with a fixed identity and date (so its commit id is reproducible, and
the task's Dockerfile checks it); ``patch`` is the hunk of the newer release that fixes one bug
its changelog names; ``test_patch`` is the test the newer release added for it. Every instance
is checked before it is written: its FAIL_TO_PASS tests fail without the fix and pass with it,
and its PASS_TO_PASS tests pass in both, on two runs each, as graded by the swebench package's
own parser and report (sandfleet.tasks.swebench.grade_log).

Usage: .venv/bin/python scripts/swebench-sdist-instances.py [OUT [LOGS [ID,...]]]
(default examples/swebench and tests/fixtures/swebench-logs, every instance)
Needs: pip download from the host's configured index, git, the swebench extra.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandfleet.tasks.swebench import (
    DEFAULT_TEST_CMD,
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    SWEbenchInstance,
    grade_log,
    load_instances,
    write_task,
)

ROOT = Path(__file__).resolve().parent.parent
PYTEST = "9.2.0"
PYYAML = "6.0.3"
GIT_ENV = {"GIT_AUTHOR_NAME": "sandfleet", "GIT_AUTHOR_EMAIL": "sandfleet@localhost",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_NAME": "sandfleet",
           "GIT_COMMITTER_EMAIL": "sandfleet@localhost", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


@dataclass
class Spec:
    instance_id: str
    repo: str
    project: str
    old: str
    new: str
    changelog: str
    statement: str
    fix: list[tuple[str, str, str]]
    """(file, old text, new text) edits of the old release: the isolated fix."""
    tests: list[tuple[str, str, str]]
    """The same for the test the new release added."""
    pythonpath: str = "."
    unstable: dict[str, str] | None = None
    """Tests left out of PASS_TO_PASS, and why (their outcome depends on the environment)."""


SPECS = [
    Spec(
        "pypa__packaging-687", "pypa/packaging", "packaging", "23.1", "23.2",
        "23.2 - 2023-10-01: * Enforce that the entire marker string is parsed (:issue:`687`)",
        "`packaging.markers.Marker` accepts a marker string with trailing garbage: "
        "`Marker('(python_version == \"2.7\") with random text')` parses without error, keeping "
        "only the part before the garbage. A marker must be parsed completely; anything left over "
        "is an `InvalidMarker` error.",
        fix=[("src/packaging/_parser.py",
              "def parse_marker(source: str) -> MarkerList:\n"
              "    return _parse_marker(Tokenizer(source, rules=DEFAULT_RULES))\n",
              "def parse_marker(source: str) -> MarkerList:\n"
              "    return _parse_full_marker(Tokenizer(source, rules=DEFAULT_RULES))\n\n\n"
              "def _parse_full_marker(tokenizer: Tokenizer) -> MarkerList:\n"
              "    retval = _parse_marker(tokenizer)\n"
              "    tokenizer.expect(\"END\", expected=\"end of marker expression\")\n"
              "    return retval\n")],
        tests=[("tests/test_markers.py",
                "            '(python_version == \"2.7\" and os_name == \"linux\"',\n        ],\n",
                "            '(python_version == \"2.7\" and os_name == \"linux\"',\n"
                "            '(python_version == \"2.7\") with random text',\n        ],\n")],
        pythonpath="src",
    ),
    Spec(
        "pypa__packaging-23.2-invalid-version", "pypa/packaging", "packaging", "23.1", "23.2",
        "23.2 - 2023-10-01: * Make ``utils.parse_sdist_filename()`` and ``utils.parse_wheel_filename()`` "
        "raise ``InvalidSdistFilename`` and ``InvalidWheelFilename``, respectively, when the version "
        "component of the name is invalid",
        "`packaging.utils.parse_sdist_filename('foo-1.x.tar.gz')` and "
        "`parse_wheel_filename('foobar-1.x-py3-none-any.whl')` raise `InvalidVersion` instead of the "
        "documented `InvalidSdistFilename` / `InvalidWheelFilename` when the version part is invalid.",
        fix=[("src/packaging/utils.py",
              "    name = canonicalize_name(name_part)\n    version = Version(parts[1])\n",
              "    name = canonicalize_name(name_part)\n\n    try:\n        version = Version(parts[1])\n"
              "    except InvalidVersion as e:\n        raise InvalidWheelFilename(\n"
              "            f\"Invalid wheel filename (invalid version): {filename}\"\n        ) from e\n\n"),
             ("src/packaging/utils.py",
              "    name = canonicalize_name(name_part)\n    version = Version(version_part)\n",
              "    name = canonicalize_name(name_part)\n\n    try:\n        version = Version(version_part)\n"
              "    except InvalidVersion as e:\n        raise InvalidSdistFilename(\n"
              "            f\"Invalid sdist filename (invalid version): {filename}\"\n        ) from e\n\n")],
        tests=[("tests/test_utils.py",
                "        (\"foo#bar-1.0-py3-none-any.whl\"),  # Invalid name (`#`)\n",
                "        (\"foo#bar-1.0-py3-none-any.whl\"),  # Invalid name (`#`)\n"
                "        (\"foobar-1.x-py3-none-any.whl\"),  # Invalid version (`1.x`)\n"),
               ("tests/test_utils.py",
                "@pytest.mark.parametrize((\"filename\"), [(\"foo-1.0.xz\"), (\"foo1.0.tar.gz\")])\n",
                "@pytest.mark.parametrize(\n    (\"filename\"),\n    [\n"
                "        (\"foo-1.0.xz\"),  # Incorrect extension\n"
                "        (\"foo1.0.tar.gz\"),  # Missing separator\n"
                "        (\"foo-1.x.tar.gz\"),  # Invalid version\n    ],\n)\n")],
        pythonpath="src",
    ),
    Spec(
        "andialbrecht__sqlparse-694", "andialbrecht/sqlparse", "sqlparse", "0.4.3", "0.4.4",
        "Release 0.4.4 (Apr 18, 2023), Bug Fixes: * Revert a change from 0.4.0 that changed IN to be a "
        "comparison (issue694). The primary expectation is that IN is treated as a keyword and not as a "
        "comparison operator.",
        "sqlparse lexes `IN` as a comparison operator (`Token.Operator.Comparison`) since 0.4.0, so "
        "`sqlparse.parse('in(1, 2)')[0].tokens[0].ttype` is `Comparison`. `IN` must be a keyword "
        "(`Token.Keyword`), as in the SQL standards' lists of reserved words.",
        fix=[("sqlparse/keywords.py", "        (r'(NOT\\s+)?(IN)\\b', tokens.Operator.Comparison),\n", "")],
        tests=[("tests/test_grouping.py",
                "    assert p.tokens[0].ttype == T.Comparison\n", "    assert p.tokens[0].ttype == T.Keyword\n"),
               ("tests/test_grouping.py",
                "def test_in_comparison():\n    # issue566\n    p = sqlparse.parse('a in (1, 2)')[0]\n"
                "    assert len(p.tokens) == 1\n    assert isinstance(p.tokens[0], sql.Comparison)\n"
                "    assert len(p.tokens[0].tokens) == 5\n    assert p.tokens[0].left.value == 'a'\n"
                "    assert p.tokens[0].right.value == '(1, 2)'\n\n\n", "")],
    ),
    Spec(
        "Python-Markdown__markdown-1406", "Python-Markdown/markdown", "Markdown", "3.5.1", "3.5.2",
        "[3.5.2] -- 2024-01-10, Fixed: * Fix edge-case crash in `InlineProcessor` with `AtomicString` (#1406).",
        "When an inline processor's `handleMatch` returns a `markdown.util.AtomicString` (a `str`) "
        "instead of an element, the inline treeprocessor crashes (`AttributeError: 'AtomicString' "
        "object has no attribute ...`): it treats every node that is not a plain, non-atomic string "
        "as an element. A returned `AtomicString` must be inserted as text, unparsed.",
        fix=[("markdown/treeprocessors.py",
              "                    if not isString(node):  # it's Element\n",
              "                    if not isinstance(node, str):  # it's Element\n"),
             ("markdown/treeprocessors.py",
              "        if node is None:\n            return data, True, end\n\n        if not isString(node):\n",
              "        if node is None:\n            return data, True, end\n\n"
              "        if not isinstance(node, str):\n")],
        tests=[("tests/test_apis.py", "from markdown.__main__ import parse_options\n",
                "from markdown.__main__ import parse_options\nfrom markdown import inlinepatterns\n"),
               ("tests/test_apis.py",
                "    def setUp(self):\n        md = markdown.Markdown()\n"
                "        self.inlineprocessor = md.treeprocessors['inline']\n",
                "    def setUp(self):\n        self.md = markdown.Markdown()\n"
                "        self.inlineprocessor = self.md.treeprocessors['inline']\n"),
               ("tests/test_apis.py",
                "            '*to*</span> *test*</span> *with*</p></div>'\n        )\n\n\nclass TestConfigParsing",
                "            '*to*</span> *test*</span> *with*</p></div>'\n        )\n\n"
                "    def testInlineProcessorDoesntCrashWithWrongAtomicString(self):\n"
                "        \"\"\" Test that an `AtomicString` returned from a Pattern doesn't cause a crash. \"\"\"\n"
                "        tree = etree.Element('div')\n        p = etree.SubElement(tree, 'p')\n"
                "        p.text = 'a marker c'\n        self.md.inlinePatterns.register(\n"
                "            _InlineProcessorThatReturnsAtomicString(r'marker', self.md), 'test', 100\n"
                "        )\n        new = self.inlineprocessor.run(tree)\n        self.assertEqual(\n"
                "            markdown.serializers.to_html_string(new),\n"
                "            '<div><p>a &lt;b&gt;atomic&lt;/b&gt; c</p></div>'\n        )\n\n\n"
                "class _InlineProcessorThatReturnsAtomicString(inlinepatterns.InlineProcessor):\n"
                "    \"\"\" Return a simple text of `group(1)` of a Pattern. \"\"\"\n"
                "    def handleMatch(self, m, data):\n"
                "        return markdown.util.AtomicString('<b>atomic</b>'), m.start(0), m.end(0)\n\n\n"
                "class TestConfigParsing")],
    ),
    Spec(
        "Python-Markdown__markdown-1425", "Python-Markdown/markdown", "Markdown", "3.5.1", "3.5.2",
        "[3.5.2] -- 2024-01-10, Fixed: * Fix handling of bogus comments (#1425).",
        "Markdown turns text that merely starts like markup into HTML comments: `<!invalid>` renders "
        "as `<!--invalid-->` and `</#invalid>` is dropped, where both should be passed through as "
        "text (`<p>&lt;!invalid&gt;</p>`, `<p>&lt;/#invalid&gt;</p>`). Python's HTMLParser reports "
        "such \"bogus comments\" as comments; Markdown must not.",
        fix=[("markdown/htmlparser.py",
              "        self.handle_data('<!')\n        return i + 2\n\n",
              "        self.handle_data('<!')\n        return i + 2\n\n"
              "    def parse_bogus_comment(self, i: int, report: int = 0) -> int:\n"
              "        # Override the default behavior so that bogus comments get passed\n"
              "        # through unaltered by setting `report` to `0` (see #1425).\n"
              "        pos = super().parse_bogus_comment(i, report)\n"
              "        if pos == -1:  # pragma: no cover\n            return -1\n"
              "        self.handle_empty_tag(self.rawdata[i:pos], is_block=False)\n        return pos\n\n")],
        tests=[("tests/test_syntax/blocks/test_html_blocks.py",
                "    # Note: this is a change in behavior for Python-Markdown, which does *not* match the reference\n"
                "    # implementation. However, it does match the HTML5 spec. Declarations must start with either\n"
                "    # `<!DOCTYPE` or `<![`. Anything else that starts with `<!` is a comment. According to the\n"
                "    # HTML5 spec, a comment without the hyphens is a \"bogus comment\", but a comment nonetheless.\n"
                "    # See https://www.w3.org/TR/html52/syntax.html#markup-declaration-open-state.\n"
                "    # If we wanted to change this behavior, we could override `HTMLParser.parse_bogus_comment()`.\n"
                "    def test_bogus_comment(self):\n        self.assertMarkdownRenders(\n"
                "            '<!*foo*>',\n            '<!--*foo*-->'\n        )\n",
                "    def test_bogus_comment(self):\n        self.assertMarkdownRenders(\n"
                "            '<!invalid>',\n            '<p>&lt;!invalid&gt;</p>'\n        )\n\n"
                "    def test_bogus_comment_endtag(self):\n        self.assertMarkdownRenders(\n"
                "            '</#invalid>',\n            '<p>&lt;/#invalid&gt;</p>'\n        )\n")],
        unstable={t: "depends on the Python 3.11 patch release's html.parser: it passes with the host's "
                     "python3.11 and fails with the one the task image installs (with and without the fix)"
                  for t in ("tests/test_syntax/blocks/test_html_blocks.py::TestHTMLBlocks::test_raw_missing_close_bracket",
                            "tests/test_syntax/blocks/test_html_blocks.py::TestHTMLBlocks::test_unclosed_comment_")},
    ),
]


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed in {cwd}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr


def download(project: str, version: str, into: Path) -> Path:
    run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
         f"{project}=={version}", "-d", str(into)], cwd=into)
    found = [p for p in into.iterdir() if p.name.lower().startswith(f"{project.lower()}-{version}.")]
    if len(found) != 1:
        raise SystemExit(f"expected one sdist of {project} {version} in {into}, found {found}")
    return found[0]


def unpack_commit(sdist: Path, repo: Path, message: str) -> str:
    """The sdist's tree as a git repository with one commit; its id (reproducible)."""
    repo.mkdir(parents=True)
    run(["tar", "-xzf", str(sdist), "--no-same-owner", "--strip-components=1", "-C", str(repo)], cwd=repo)
    run(["git", "init", "-q", "."], cwd=repo)
    run(["git", "add", "-A", "-f"], cwd=repo)
    run(["git", "-c", "core.hooksPath=/dev/null", "commit", "-q", "-m", message], cwd=repo, env=GIT_ENV)
    return run(["git", "rev-parse", "HEAD"], cwd=repo).strip()


def edit(repo: Path, edits: list[tuple[str, str, str]]) -> str:
    """Apply the edits to the clean work tree; the git diff; the tree reset again."""
    for file, old, new in edits:
        path = repo / file
        text = path.read_text()
        if old == "APPEND":
            text += new
        else:
            if text.count(old) != 1:
                raise SystemExit(f"{file}: the edit's old text occurs {text.count(old)} times")
            text = text.replace(old, new)
        path.write_text(text)
    diff = run(["git", "diff"], cwd=repo)
    run(["git", "checkout", "-q", "--", "."], cwd=repo)
    return diff


def eval_log(repo: Path, spec: Spec, files: list[str], patches: list[str]) -> str:
    """What tests/eval.sh prints, for the work tree with ``patches`` applied, run here."""
    for patch in patches:
        subprocess.run(["git", "apply"], input=patch, text=True, cwd=repo, check=True)
    env = {"PYTHONPATH": str(repo / spec.pythonpath), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run([*DEFAULT_TEST_CMD.replace("python", sys.executable, 1).split(), *files], cwd=repo,
                          env={**os.environ, **env}, capture_output=True, text=True)
    run(["git", "checkout", "-q", "--", "."], cwd=repo)
    run(["git", "clean", "-q", "-fdx"], cwd=repo)
    return (f"{START_TEST_OUTPUT}\n{proc.stdout}{proc.stderr}\n{END_TEST_OUTPUT}\n"
            f"{TEST_EXIT_CODE}: {proc.returncode}\n")


def statuses(log: str) -> dict[str, str]:
    from swebench.harness.log_parsers import parse_log_pytest

    return dict(parse_log_pytest(log.split(START_TEST_OUTPUT)[1].split(END_TEST_OUTPUT)[0], None))


def dockerfile(spec: Spec, sdist: Path, sha256: str, base_commit: str) -> str:
    env = " ".join(f"{k}='{v}'" for k, v in GIT_ENV.items())
    return f"""# {spec.instance_id}: the {spec.project} {spec.old} sdist as the repository at base_commit
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir pytest=={PYTEST} pyyaml=={PYYAML}
WORKDIR /testbed
RUN pip download -q --no-deps --no-binary :all: -d /tmp/sdist {spec.project}=={spec.old} \\
 && echo "{sha256}  /tmp/sdist/{sdist.name}" | sha256sum -c - \\
 && tar -xzf /tmp/sdist/{sdist.name} --no-same-owner --strip-components=1 -C /testbed && rm -rf /tmp/sdist \\
 && git init -q . && git add -A -f \\
 && {env} git -c core.hooksPath=/dev/null commit -q -m "{spec.project} {spec.old} (sdist)" \\
 && test "$(git rev-parse HEAD)" = {base_commit}
RUN pip install --no-cache-dir --no-deps -e /testbed && git status --porcelain --ignored > /dev/null
RUN chown -R 1000:1000 /testbed
"""


def build(spec: Spec, work: Path, out: Path, logs: Path | None) -> SWEbenchInstance:
    dl = work / "dl" / f"{spec.project}-{spec.old}"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = download(spec.project, spec.old, dl)
    sha = hashlib.sha256(sdist.read_bytes()).hexdigest()
    repo = work / spec.instance_id
    base = unpack_commit(sdist, repo, f"{spec.project} {spec.old} (sdist)")
    patch, test_patch = edit(repo, spec.fix), edit(repo, spec.tests)
    files = [f for f in dict.fromkeys(f for f, _, _ in spec.tests)]
    before = [eval_log(repo, spec, files, [test_patch]) for _ in range(2)]
    after = [eval_log(repo, spec, files, [test_patch, patch]) for _ in range(2)]
    b0, a0 = statuses(before[0]), statuses(after[0])
    if statuses(before[1]) != b0 or statuses(after[1]) != a0:
        raise SystemExit(f"{spec.instance_id}: the two runs differ")
    f2p = sorted(t for t, s in a0.items() if s == "PASSED" and b0.get(t) in (None, "FAILED", "ERROR"))
    p2p = sorted(t for t, s in a0.items() if s == "PASSED" and b0.get(t) == "PASSED" and t not in (spec.unstable or {}))
    if not f2p:
        raise SystemExit(f"{spec.instance_id}: no test fails before the fix and passes after")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    inst = SWEbenchInstance(
        instance_id=spec.instance_id, repo=spec.repo, base_commit=base, patch=patch, test_patch=test_patch,
        FAIL_TO_PASS=f2p, PASS_TO_PASS=p2p, version=spec.old, problem_statement=spec.statement,
        provenance={"project": spec.project, "base_release": spec.old, "fix_release": spec.new,
                    "changelog": spec.changelog, "sdist": sdist.name, "sdist_sha256": sha,
                    "sdist_files": len(names), "built_by": "scripts/swebench-sdist-instances.py",
                    **({"left_out_of_pass_to_pass": spec.unstable} if spec.unstable else {})},
    )  # type: ignore[call-arg]
    grading = {"instance_id": inst.instance_id, "repo": inst.repo, "version": inst.version,
               "FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p}
    for log in before:
        reward, details = grade_log(log, grading)
        assert reward == 0.0 and details["fail_to_pass"] == 0.0, (spec.instance_id, details)
    for log in after:
        assert grade_log(log, grading)[0] == 1.0, spec.instance_id
    source = (f"# {spec.instance_id}\n\nBuilt offline from the published sdists of **{spec.project}** "
              f"{spec.old} (the repository at `base_commit`) and {spec.new} (the fix), by "
              f"`scripts/swebench-sdist-instances.py`.\n\n- changelog of {spec.new}: {spec.changelog}\n"
              f"- base: `{sdist.name}` (sha256 `{sha}`), unpacked and committed as `{base}` (fixed author, "
              f"date 2000-01-01)\n- patch: the isolated hunk of {spec.new} that fixes it "
              f"({', '.join(dict.fromkeys(f for f, _, _ in spec.fix))})\n- test_patch: the test {spec.new} added "
              f"({', '.join(files)})\n- FAIL_TO_PASS ({len(f2p)}) failed without the fix and passed with it, "
              f"PASS_TO_PASS ({len(p2p)}) passed in both, on two runs each (pytest {PYTEST}, "
              f"Python {sys.version.split()[0]}), graded by the swebench package.\n")
    write_task(out / spec.instance_id, inst, dockerfile(spec, sdist, sha, base), source_md=source)
    if logs is not None and len(before[0]) + len(after[0]) < 40_000:  # real logs for tests/test_swebench.py
        (logs / spec.instance_id).mkdir(parents=True, exist_ok=True)
        (logs / spec.instance_id / "before.log").write_text(before[0])
        (logs / spec.instance_id / "after.log").write_text(after[0])
    print(f"{spec.instance_id}: base {base[:12]}, F2P {len(f2p)}, P2P {len(p2p)}")  # noqa: T201
    return inst


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "examples" / "swebench"
    logs = Path(sys.argv[2]) if len(sys.argv) > 2 else ROOT / "tests" / "fixtures" / "swebench-logs"
    only = set(sys.argv[3].split(",")) if len(sys.argv) > 3 else None
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        insts = [build(spec, Path(tmp), out, logs) for spec in SPECS if only is None or spec.instance_id in only]
    jsonl = out / "instances.jsonl"
    if only is not None and jsonl.is_file():  # rebuilt some: keep the others, in order
        fresh = {i.instance_id: i for i in insts}
        insts = [fresh.get(i.instance_id, i) for i in load_instances(jsonl)]
    with open(jsonl, "w") as f:
        for inst in insts:
            f.write(json.dumps(inst.model_dump(mode="json"), ensure_ascii=False) + "\n")
    shutil.rmtree(out / "__pycache__", ignore_errors=True)


if __name__ == "__main__":
    main()
