"""arm64 on this host: the 64K-page check on fixture binaries, binfmt registration (F flag,
removed after), the cross-compiled guest agent, the per-arch verdicts, and (slow) a
busybox-static arm64 rootfs running a command in a sandbox."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from sandfleet.images import emulation
from sandfleet.tasks.archreport import classify

SOURCE = "int main(void) { return 0; }\n"
on_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="emulates arm64 on an x86_64 host")


def _emulation_missing() -> str | None:
    if os.geteuid() != 0:
        return "binfmt_misc registration needs root"
    if not shutil.which("qemu-aarch64-static"):
        return "qemu-user-static not installed (apt-get install qemu-user-static)"
    try:
        emulation.mount_binfmt()
    except emulation.HostUnsupportedError as e:
        return str(e)
    return None


needs_emulation = pytest.mark.skipif(_emulation_missing() is not None, reason=str(_emulation_missing()))


def _link(tmp: Path, cc: str, align: int, name: str, static: bool = False) -> Path:
    src = tmp / "t.c"
    src.write_text(SOURCE)
    out = tmp / name
    cmd = [cc, "-O2", *(["-static"] if static else []), f"-Wl,-z,max-page-size={align}",
           f"-Wl,-z,common-page-size={align}", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Fixture binaries linked at 4096 and at 65536: this host's, and arm64's where a cross
    compiler is installed."""
    tmp = tmp_path_factory.mktemp("elf")
    out = {}
    if shutil.which("gcc"):
        out["host-4k"] = _link(tmp, "gcc", 4096, "host-4k")
        out["host-64k"] = _link(tmp, "gcc", 65536, "host-64k")
    if shutil.which("aarch64-linux-gnu-gcc"):
        out["arm64-4k"] = _link(tmp, "aarch64-linux-gnu-gcc", 4096, "arm64-4k", static=True)
        out["arm64-64k"] = _link(tmp, "aarch64-linux-gnu-gcc", 65536, "arm64-64k", static=True)
    if not out:
        pytest.skip("no C compiler to link the fixture binaries")
    return out


def test_pt_load_alignment_is_read_from_the_elf_headers(binaries: dict[str, Path], tmp_path: Path) -> None:
    for name, path in binaries.items():
        aligns = emulation.load_alignments(path)
        assert aligns, name
        assert min(aligns) == (4096 if name.endswith("-4k") else 65536), (name, aligns)
    (tmp_path / "script.sh").write_text("#!/bin/sh\n")
    (tmp_path / "short").write_bytes(b"\x7fELF\x02\x01")
    assert emulation.load_alignments(tmp_path / "script.sh") is None
    assert emulation.load_alignments(tmp_path / "short") is None


def test_page_size_64k_flags_only_the_binaries_linked_at_4096(binaries: dict[str, Path], tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    for name, path in binaries.items():
        shutil.copy(path, root / "usr" / "bin" / name)
    (root / "usr" / "bin" / "link").symlink_to("host-4k" if "host-4k" in binaries else next(iter(binaries)))
    (root / "proc").mkdir()
    shutil.copy(next(iter(binaries.values())), root / "proc" / "skipped")
    bad = emulation.page_size_problems([root], emulation.parse_page_size("64k"))
    assert bad == {f"/usr/bin/{n}": 4096 for n in binaries if n.endswith("-4k")}
    assert emulation.page_size_problems([root], emulation.parse_page_size("4k")) == {}
    # a higher layer's copy hides the lower one's
    top = tmp_path / "top"
    (top / "usr" / "bin").mkdir(parents=True)
    for name in binaries:
        if name.endswith("-4k"):
            shutil.copy(binaries[name.replace("-4k", "-64k")], top / "usr" / "bin" / name)
    assert emulation.page_size_problems([top, root], 65536) == {}


@pytest.mark.parametrize(("text", "n"), [("64k", 65536), ("4K", 4096), ("16384", 16384)])
def test_page_size_values(text: str, n: int) -> None:
    assert emulation.parse_page_size(text) == n


@pytest.mark.parametrize("text", ["64", "3k", "big", "0"])
def test_bad_page_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="page size"):
        emulation.parse_page_size(text)


def test_per_arch_verdicts() -> None:
    def v(status: str, good: int, r: int = 3) -> SimpleNamespace:
        return SimpleNamespace(status=status, reason="", oracle_rewards=[1.0] * good + [0.0] * (r - good),
                               noop_rewards=[0.0] * r, seconds=1.0)

    assert classify({"amd64": v("valid", 3), "arm64": v("valid", 3)}) == "valid on both"
    assert classify({"amd64": v("valid", 3), "arm64": v("invalid", 0)}) == "valid on only amd64"
    assert classify({"amd64": v("valid", 3), "arm64": v("flaky", 2)}) == "flaky on arm64 2/3"
    assert classify({"amd64": v("invalid", 0), "arm64": v("invalid", 0)}) == "invalid"


def test_arch_names() -> None:
    assert emulation.normalize("aarch64") == "arm64" and emulation.normalize("x86_64") == "amd64"
    with pytest.raises(ValueError, match="unknown architecture"):
        emulation.normalize("vax")


@on_x86
@needs_emulation
def test_emulation_registers_with_the_f_flag_and_removes_what_it_added(binaries: dict[str, Path]) -> None:
    if "arm64-64k" not in binaries:
        pytest.skip("no aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu)")
    already = emulation.registration_for("arm64")
    with emulation.emulation("arm64") as reg:
        assert reg is not None and "F" in reg.flags
        with emulation.emulation("arm64") as inner:  # nested (and concurrent) users share it
            assert inner is not None and inner.name == reg.name
        assert emulation.registration_for("arm64") is not None  # still there for the outer block
        assert subprocess.run([str(binaries["arm64-64k"])]).returncode == 0
        from sandfleet.doctor import report

        assert any(r["name"] == reg.name and "F" in r["flags"] for r in report()["binfmt"])
    after = emulation.registration_for("arm64")
    if already is None:
        assert after is None and not any(r.ours for r in emulation.registrations())
    else:
        assert after == already  # a registration sandfleet did not make is left alone


@on_x86
@needs_emulation
def test_a_run_with_another_cache_leaving_keeps_the_registration(tmp_path: Path) -> None:
    import sys

    code = "from sandfleet.images import emulation\nwith emulation.emulation('arm64'): pass\n"
    with emulation.emulation("arm64"):
        subprocess.run([sys.executable, "-c", code], env={**os.environ, "SANDFLEET_CACHE": str(tmp_path)},
                       check=True)
        assert emulation.registration_for("arm64") is not None  # binfmt is system-wide: so are the locks


@on_x86
@needs_emulation
def test_the_cross_compiled_agent_runs_under_emulation() -> None:
    if not shutil.which("aarch64-linux-gnu-gcc"):
        pytest.skip("no aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu)")
    agent = emulation.agent_binary_for("arm64")
    head = agent.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and head[18:20] == b"\xb7\x00"  # e_machine EM_AARCH64
    assert emulation.load_alignments(agent)  # static: loads with 64K pages too
    with emulation.emulation("arm64"):
        proc = subprocess.run([str(agent), "--bogus"], capture_output=True, text=True)
    assert "usage: sandfleet-agent" in proc.stderr + proc.stdout


@pytest.mark.slow
@on_x86
@needs_emulation
async def test_busybox_arm64_rootfs_runs_a_command_in_a_sandbox() -> None:
    from sandfleet.sandbox import create_sandbox
    from test_rollout_support import needs_bwrap

    if needs_bwrap().args[0]:
        pytest.skip("needs bubblewrap as root")
    try:
        image = emulation.busybox_image("arm64")
    except emulation.HostUnsupportedError as e:
        pytest.skip(f"no arm64 busybox-static from apt: {e}")
    assert image.arch == "arm64"
    with emulation.emulation("arm64"):
        sb = await create_sandbox(image=image.hash, backend="bwrap", workdir="/tmp", user="root")
        try:
            res = await sb.exec(["/bin/sh", "-c", "echo hello from $(uname -m)"], timeout=120)
        finally:
            await sb.close()
    assert res.exit_code == 0 and res.stdout == "hello from aarch64\n", res.output


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"), reason="needs bubblewrap as root")
def test_validate_per_arch_report_on_this_hosts_arch(tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from sandfleet.cli import cli
    from test_rollout_support import make_task

    make_task(tmp_path / "suite", "good")
    report = tmp_path / "r.json"
    result = CliRunner().invoke(cli, ["tasks", "validate", str(tmp_path / "suite"), "-r", "1", "--arch",
                                      emulation.host_arch(), "--page-size", "64k", "--report", str(report)])
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    host = emulation.host_arch()
    assert data["verdict"] == {"good": "valid on all"} and data["arches"][host]["good"]["status"] == "valid"
    assert data["host_arch"] == host and data["wall_s"][host] > 0 and data["page_size"]["bytes"] == 65536
    assert "good" in result.output and f"{host}:" in result.output
    assert os.environ.get("SANDFLEET_ARCH") is None  # the target is put back
