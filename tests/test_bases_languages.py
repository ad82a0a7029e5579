"""The official language images approximated from Debian's packages, built and validated
for real: rust, node, gcc, eclipse-temurin and buildpack-deps:jammy (each base is a
debootstrap with the language's packages: minutes each, so opt-in: marker ``bases``,
SANDFLEET_BASES_TESTS=1, run by ``scripts/test-integrations.sh bases``). golang is in the
default slow pass (tests/test_bases_build.py)."""

from __future__ import annotations

import os
import shutil
import textwrap
from pathlib import Path

import pytest

from sandfleet.rollout.validate import validate_tasks
from sandfleet.tasks import load_task

pytestmark = [
    pytest.mark.bases,
    pytest.mark.skipif(os.environ.get("SANDFLEET_BASES_TESTS") != "1",
                       reason="builds a Debian base per language (minutes each): SANDFLEET_BASES_TESTS=1, "
                              "scripts/test-integrations.sh bases"),
    pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"), reason="needs root and bwrap"),
]


def task(root: Path, name: str, base: str, solve: str, check: str) -> Path:
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('schema_version = "1.4"\n[agent]\ntimeout_sec = 600\n'
                                      "[verifier]\ntimeout_sec = 300\n")
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "environment" / "Dockerfile").write_text(f"FROM {base}\nWORKDIR /app\n")
    (folder / "solution" / "solve.sh").write_text("set -e\ncd /app\n" + textwrap.dedent(solve))
    (folder / "tests" / "test.sh").write_text(
        f"if {{ {check}; }} > /dev/null 2>&1; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n")
    return folder


RUST_CHECK = ('[ "$(/app/out)" = "Hello, world!" ] && [ "$CARGO_HOME" = /usr/local/cargo ] '
              '&& rustc -V | grep -q "^rustc 1.85"')
JAVA_CHECK = '[ "$(cat /app/out)" = 21 ] && [ -x "$JAVA_HOME/bin/java" ] && [ "$JAVA_HOME" = /opt/java/openjdk ]'
CASES = {
    "rust": ("rust:1.85-slim", """\
        cargo new --vcs none hello
        cd hello && cargo build --offline --release && cp target/release/hello /app/out
        """, RUST_CHECK, "Rust 1.85"),
    "node": ("node:20-slim", """\
        node -e 'require("fs").writeFileSync("/app/out", process.version)'
        """, 'grep -q "^v20\\." /app/out && [ "$NODE_VERSION" = 20 ] && npm --version', "Node.js 20"),
    "gcc": ("gcc:13-bookworm", """\
        cat > m.c <<'C'
        #include <stdio.h>
        int main(void) { printf("%d\\n", __GNUC__); return 0; }
        C
        gcc -O2 -o out m.c
        """, '[ "$(/app/out)" = 14 ] && make --version', "GCC 14"),
    "java": ("eclipse-temurin:21-jdk-noble", """\
        cat > M.java <<'J'
        public class M { public static void main(String[] a) { System.out.println(Runtime.version().feature()); } }
        J
        javac M.java && java -cp . M > /app/out
        """, JAVA_CHECK, "Java 21"),
    "jammy": ("buildpack-deps:jammy", "git --version > /app/out && gcc --version >> /app/out\n",
              'grep -q "^git version" /app/out && grep -q "^12" /etc/debian_version', None),
}


@pytest.mark.parametrize("name", sorted(CASES))
async def test_language_base_validates(tmp_path: Path, name: str) -> None:
    base, solve, check, got = CASES[name]
    t = load_task(task(tmp_path, name, base, solve, check))
    v = (await validate_tasks([t], repeats=1, backend="bwrap"))[name]
    assert v.status == "valid", v.reason
    assert v.oracle_rewards == [1.0] and v.noop_rewards == [0.0]
    assert v.coverage == "approximated" and v.warnings, v
    if got:
        assert v.base_got == [got], v.base_got
