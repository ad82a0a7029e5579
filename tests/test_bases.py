"""Base references as published tasks write them (issue 31): mirror prefixes, digest pins,
point tags, bullseye, the official language images approximated from Debian's packages."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandfleet.errors import ImageBuildError
from sandfleet.images.bases import resolve_base, split_ref
from sandfleet.images.debootstrap import suite_available


@pytest.mark.parametrize(
    ("ref", "name", "tag", "digest"),
    [
        ("debian:bookworm-slim", "debian", "bookworm-slim", None),
        ("docker.io/library/debian:12", "debian", "12", None),
        ("index.docker.io/library/python:3.11-slim", "python", "3.11-slim", None),
        ("public.ecr.aws/docker/library/debian:bookworm-slim@sha256:abc", "debian", "bookworm-slim", "sha256:abc"),
        ("mirror.gcr.io/library/golang:1.22", "golang", "1.22", None),
        ("mirror.gcr.io/node:20", "node", "20", None),
        ("registry.example.org:5000/library/rust:1.85", "rust", "1.85", None),
        ("localhost:5000/debian", "debian", "latest", None),
        ("ghcr.io/foo/bar:1", "ghcr.io/foo/bar", "1", None),
        ("myorg/debian:12", "myorg/debian", "12", None),
    ],
)
def test_split_ref_strips_mirror_prefixes(ref: str, name: str, tag: str, digest: str | None) -> None:
    assert split_ref(ref) == (name, tag, digest)


@pytest.mark.parametrize("prefix", ["", "docker.io/library/", "index.docker.io/library/",
                                    "public.ecr.aws/docker/library/", "mirror.gcr.io/", "myreg.example:443/library/"])
def test_a_mirror_reference_resolves_like_the_bare_name(prefix: str) -> None:
    for bare in ("debian:bookworm-slim", "python:3.13-slim", "golang:1.24", "ubuntu:24.04"):
        a, b = resolve_base(bare), resolve_base(prefix + bare)
        fields = ("suite", "packages", "substituted", "env", "kind", "asked", "got", "python")
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
        assert b.image == prefix + bare


def test_a_digest_pin_is_warned_and_refused_by_strict() -> None:
    ref = "public.ecr.aws/docker/library/debian:bookworm-slim@sha256:" + "ab" * 32
    base = resolve_base(ref)
    assert base.suite == "bookworm" and base.substituted and base.kind == "digest pin not honoured"
    assert base.note is not None and "digest pin @sha256:abab" in base.note and "without the registry" in base.note
    with pytest.raises(ImageBuildError, match="digest pin .* refused by --strict-bases"):
        resolve_base(ref, strict=True)
    pinned_python = resolve_base("python:3.12-slim@sha256:" + "cd" * 32)  # both notes kept
    assert pinned_python.note is not None and "Python 3.12" in pinned_python.note and "digest" in pinned_python.note


@pytest.mark.parametrize(("ref", "suite", "python"), [
    ("debian:12.7", "bookworm", None), ("debian:12.7-slim", "bookworm", None), ("debian:13.0-slim", "trixie", None),
    ("python:3.11.9-slim", "bookworm", "3.11"), ("python:3.13.1-slim-trixie", "trixie", "3.13"),
])
def test_point_tags_map_to_their_release(ref: str, suite: str, python: str | None) -> None:
    base = resolve_base(ref, strict=True)
    assert (base.suite, base.python, base.substituted) == (suite, python, False)


def _mirror_with(tmp: Path, suites: tuple[str, ...]) -> Iterator[str]:
    for s in suites:
        (tmp / "debian" / "dists" / s).mkdir(parents=True)
        (tmp / "debian" / "dists" / s / "Release").write_text(f"Suite: {s}\n")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/debian"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_bullseye_is_built_where_the_mirror_has_it_else_bookworm_stands_in(tmp_path: Path) -> None:
    for mirror in _mirror_with(tmp_path, ("bookworm", "trixie")):  # a mirror that dropped bullseye
        reachable = functools.partial(suite_available, mirror=mirror)
        assert reachable("bookworm") and not reachable("bullseye")
        for ref in ("debian:11", "debian:bullseye-slim", "debian:11.9"):
            base = resolve_base(ref, reachable=reachable)
            assert base.suite == "bookworm" and base.substituted and base.kind == "debian bullseye -> bookworm"
            assert base.note is not None and "bullseye can't be bootstrapped" in base.note
            with pytest.raises(ImageBuildError, match="refused by --strict-bases"):
                resolve_base(ref, strict=True, reachable=reachable)
    for mirror in _mirror_with(tmp_path / "full", ("bullseye", "bookworm")):
        reachable = functools.partial(suite_available, mirror=mirror)
        base = resolve_base("debian:bullseye-slim", strict=True, reachable=reachable)
        assert (base.suite, base.substituted) == ("bullseye", False)


@pytest.mark.parametrize(("ref", "suite", "packages", "asked", "got", "env"), [
    ("golang:1.22-bookworm", "trixie", ("golang-go", "git"), "Go 1.22", "Go 1.24",
     {"GOPATH": "/go", "GOTOOLCHAIN": "local"}),
    ("golang:1.19", "bookworm", ("golang-go",), "Go 1.19", "Go 1.19", {"GOLANG_VERSION": "1.19"}),
    ("rust:1.85-slim", "trixie", ("rustc", "cargo", "gcc"), "Rust 1.85", "Rust 1.85",
     {"CARGO_HOME": "/usr/local/cargo", "RUSTUP_HOME": "/usr/local/rustup"}),
    ("rust:1.63", "bookworm", ("rustc", "cargo", "build-essential"), "Rust 1.63", "Rust 1.63", {}),
    ("gcc:13-bookworm", "trixie", ("build-essential",), "GCC 13", "GCC 14", {}),
    ("gcc:12", "bookworm", ("build-essential",), "GCC 12", "GCC 12", {}),
    ("node:20-slim", "trixie", ("nodejs", "npm"), "Node.js 20", "Node.js 20", {"NODE_VERSION": "20"}),
    ("node:18-bookworm", "bookworm", ("nodejs", "npm"), "Node.js 18", "Node.js 18", {}),
    ("eclipse-temurin:17", "bookworm", ("openjdk-17-jdk",), "Java 17", "Java 17", {"JAVA_HOME": "/opt/java/openjdk"}),
    ("eclipse-temurin:25-jdk-noble", "trixie", ("openjdk-25-jdk",), "Java 25", "Java 25", {}),
    ("eclipse-temurin:21-jre-jammy", "trixie", ("openjdk-21-jdk-headless",), "Java 21", "Java 21", {}),
    ("openjdk:17-jdk-slim", "bookworm", ("openjdk-17-jdk-headless",), "Java 17", "Java 17",
     {"JAVA_HOME": "/usr/local/openjdk-17"}),
    ("openjdk:11", "bookworm", ("openjdk-17-jdk",), "Java 11", "Java 17", {}),
])
def test_language_images_are_approximated_from_debian_packages(ref: str, suite: str, packages: tuple[str, ...],
                                                               asked: str, got: str, env: dict[str, str]) -> None:
    base = resolve_base(ref)
    assert base.suite == suite and base.substituted and set(packages) <= set(base.packages)
    assert (base.asked, base.got) == (asked, got)
    assert base.note is not None and f"asked {asked}, got {got}" in base.note
    assert env.items() <= dict(base.env).items()
    assert base.kind.startswith(ref.split(":")[0] + " -> Debian " + suite)
    with pytest.raises(ImageBuildError, match="refused by --strict-bases"):
        resolve_base(ref, strict=True)


def test_language_images_keep_the_official_conventions() -> None:
    go = resolve_base("golang:1.24")
    assert go.workdir == "/go" and {"/go/src", "/go/bin"} <= set(go.dirs)
    assert dict(go.env)["PATH"].startswith("/go/bin:/usr/local/go/bin:")
    assert ("/usr/local/go", "/usr/lib/go") in go.links
    assert dict(resolve_base("rust:1.85").env)["PATH"].startswith("/usr/local/cargo/bin:")
    java = resolve_base("eclipse-temurin:21")
    assert dict(java.env)["PATH"].startswith("/opt/java/openjdk/bin:")
    assert ("/opt/java/openjdk", "/usr/lib/jvm/java-21-openjdk-{arch}") in java.links


@pytest.mark.parametrize(("ref", "asked", "newest"), [
    ("golang:1.26", "Go 1.26", "Go 1.24 in Debian trixie"), ("rust:1.90-slim", "Rust 1.90", "Rust 1.85"),
    ("node:22", "Node.js 22", "Node.js 20"), ("gcc:15", "GCC 15", "GCC 14"),
    ("eclipse-temurin:26", "Java 26", "Java 25"),
])
def test_a_version_debian_cant_give_is_refused_unless_accepted(ref: str, asked: str, newest: str) -> None:
    with pytest.raises(ImageBuildError) as info:
        resolve_base(ref, file="Dockerfile", line=1)
    message = str(info.value)
    assert f"{asked} is newer than any Debian release ships" in message and newest in message
    assert "--accept-older-versions" in message and message.startswith("Dockerfile:1: ")
    base = resolve_base(ref, accept_older=True)
    assert base.substituted and base.note is not None and "an older version than asked" in base.note
    assert base.asked == asked and base.got is not None and base.got in newest


def test_buildpack_deps_jammy_gets_bookworms_set() -> None:
    jammy = resolve_base("buildpack-deps:jammy")
    assert jammy.suite == "bookworm" and jammy.substituted
    assert jammy.packages == resolve_base("buildpack-deps:bookworm").packages
    assert resolve_base("buildpack-deps:noble-curl").suite == "trixie"
    for bad, why in (("golang:1.22-alpine", "Alpine"), ("node:20-windowsservercore", "Windows"),
                     ("rust:nightly", "unknown variant")):
        with pytest.raises(ImageBuildError, match=why):
            resolve_base(bad)


def harbor(root: Path, name: str, dockerfile: str) -> Path:
    folder = root / name
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('schema_version = "1.4"\n[agent]\ntimeout_sec = 60\n'
                                      '[verifier]\ntimeout_sec = 60\n')
    (folder / "instruction.md").write_text("Do it.\n")
    (folder / "environment" / "Dockerfile").write_text(dockerfile)
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (folder / "solution" / "solve.sh").write_text("true\n")
    return folder


def test_validate_coverage_groups_a_folder_of_tasks(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from sandfleet.cli.validate import validate

    bases = {"plain": "debian:bookworm-slim", "point": "debian:12.7", "py": "docker.io/library/python:3.11.9-slim",
             "ubuntu-a": "ubuntu:24.04", "ubuntu-b": "public.ecr.aws/docker/library/ubuntu:24.04",
             "go-a": "golang:1.22-bookworm", "go-b": "golang:1.23", "java": "eclipse-temurin:17",
             "pinned": "debian:bookworm-slim@sha256:" + "ef" * 32, "go-new": "golang:1.26", "alp": "alpine:3.20"}
    for name, ref in bases.items():
        harbor(tmp_path, name, f"FROM {ref}\nWORKDIR /app\n")
    harbor(tmp_path, "multi", "FROM rust:1.85 AS build\nRUN true\nFROM debian:trixie\nCOPY --from=build /x /x\n")
    (tmp_path / "broken").mkdir()  # a task that does not load: refused too
    (tmp_path / "broken" / "task.toml").write_text("[agent\n")
    (tmp_path / "broken" / "instruction.md").write_text("Do it.\n")
    report = tmp_path / "coverage.json"
    result = CliRunner().invoke(validate, [str(tmp_path), "--coverage", "--report", str(report)])
    assert result.exit_code == 0, result.output
    cov = json.loads(report.read_text())
    assert cov["counts"] == {"exact": 3, "approximated": 7, "refused": 2 + 1}, cov
    assert cov["approximated"]["golang -> Debian trixie golang-go"] == ["go-a", "go-b"]
    assert cov["approximated"]["ubuntu:24.04 -> Debian trixie"] == ["ubuntu-a", "ubuntu-b"]
    assert cov["approximated"]["rust -> Debian trixie rustc + cargo"] == ["multi"]
    assert cov["approximated"]["digest pin not honoured"] == ["pinned"]
    assert cov["refused"]["Go 1.26 is newer than any Debian release ships"] == ["go-new"]
    assert cov["refused"]["exists only in a registry"] == ["alp"]
    assert cov["per_task"]["go-a"]["asked"] == ["Go 1.22"] and cov["per_task"]["go-a"]["got"] == ["Go 1.24"]
    assert "base coverage of 13 task(s): 3 exact, 7 approximated, 3 refused" in result.output
    assert "approximated   2  golang -> Debian trixie golang-go: go-a, go-b" in result.output
    older = CliRunner().invoke(validate, [str(tmp_path), "--coverage", "--accept-older-versions",
                                          "--strict-bases", "--report", str(report)])
    cov = json.loads(report.read_text())
    assert older.exit_code == 0 and cov["counts"] == {"exact": 3, "approximated": 0, "refused": 10}, older.output
    assert cov["refused"]["refused by --strict-bases: golang -> Debian trixie golang-go"] == ["go-a", "go-b", "go-new"]
