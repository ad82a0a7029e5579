"""The host uid slot allocator (sandbox/uids.py): one slot of host uids per live sandbox."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.errors import ConfigError, SandboxError
from sandfleet.images.run import build_command, layer_next
from sandfleet.sandbox import create_sandbox, fork
from sandfleet.sandbox.spec import UID_STRIDE, BwrapConfig, backend_config
from sandfleet.sandbox.uids import Slot, take_slot


def _holder(slots_dir: Path, code: str) -> subprocess.Popen[str]:
    """Another process that runs ``code`` (with BwrapConfig and take_slot imported) against
    the slot files in ``slots_dir``, then keeps what it holds for a minute."""
    prog = ("import time; from sandfleet.sandbox.spec import BwrapConfig; "
            f"from sandfleet.sandbox.uids import take_slot; {code}; time.sleep(60)")
    return subprocess.Popen([sys.executable, "-c", prog], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "SANDFLEET_UID_SLOTS": str(slots_dir)})


def test_uid_slots_are_taken_once_across_processes_and_reused(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator: the lowest free slot, never one another process holds, free again once
    released or once its holder died."""
    monkeypatch.setenv("SANDFLEET_UID_SLOTS", str(tmp_path))
    cfg = BwrapConfig(uid_base=2_000_000_000, slots=4)
    child = _holder(tmp_path, "s = take_slot(BwrapConfig(uid_base=2_000_000_000, slots=4)); "
                              "print(s.index, s.base, flush=True)")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["0", "2000000000"]
        mine = [take_slot(cfg) for _ in range(3)]
        assert [s.index for s in mine] == [1, 2, 3]
        assert [s.base for s in mine] == [2_000_000_000 + i * UID_STRIDE for i in (1, 2, 3)]
        assert mine[0].owner == mine[0].base + 65537 and mine[0].guest == mine[0].base + 65536
        with pytest.raises(SandboxError, match="all 4 host uid slots"):
            take_slot(cfg)
        mine[1].release()
        again = take_slot(cfg)
        assert again.index == 2
        child.kill()
        child.wait()
        assert take_slot(cfg).index == 0, "the slot of a dead holder was not free again"
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_search_starts_where_the_last_one_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slots held by another process are scanned once per process, not on every take: the
    next search starts after the slot found last (and at a slot this process released, if
    lower); slot 0 is still taken first whenever it is free. (One uid_base per test: the
    hint is kept per uid_base for the process's life.)"""
    monkeypatch.setenv("SANDFLEET_UID_SLOTS", str(tmp_path))
    base = 2_100_000_000
    cfg = BwrapConfig(uid_base=base, slots=400)
    child = _holder(tmp_path, f"c = BwrapConfig(uid_base={base}, slots=400); "
                              "s = [take_slot(c) for _ in range(300)]; [x.release() for x in s[250:]]; "
                              "print(' '.join(str(x.index) for x in s[:250]), flush=True)")
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == [str(i) for i in range(250)]  # 0..249 held there
        a, b = take_slot(cfg), take_slot(cfg)
        assert (a.index, b.index) == (250, 251)
        a.release()  # below the hint: searched from again
        assert take_slot(cfg).index == 250
        assert take_slot(cfg).index == 252
        opened: list[str] = []
        real_open = os.open

        def counting_open(path: object, *args: object, **kw: object) -> int:
            opened.append(str(path))
            return real_open(path, *args, **kw)  # type: ignore[arg-type]

        with monkeypatch.context() as m:
            m.setattr(os, "open", counting_open)
            assert take_slot(cfg).index == 253
        assert len(opened) == 2, f"a take after the first scanned {len(opened)} slot files: {opened[:5]}..."
        child.kill()
        child.wait()
        assert take_slot(cfg).index == 0, "slot 0 free again, and taken first"
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_uid_range_past_the_last_host_uid_is_refused() -> None:
    with pytest.raises(ConfigError, match="past the last host uid"):
        backend_config({"kind": "bwrap", "uid_base": 4_000_000_000})
    assert backend_config({"kind": "bwrap", "uid_base": 4_000_000_000, "slots": 4}).slots == 4


needs_bwrap = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("bwrap"),
                                 reason="the bwrap backend needs root and bubblewrap")


def _shifted_slots(cfg: BwrapConfig) -> list[Slot]:
    """Slots taken up to the first one that is not the canonical range."""
    held = [take_slot(cfg)]
    while not held[-1].shifted:
        held.append(take_slot(cfg))
    return held


@needs_bwrap
async def test_a_snapshot_taken_in_one_slot_forks_into_others() -> None:
    """Layers are stored in the canonical range whatever slot wrote them, and every slot
    sees them as its own uids: the agent's file stays the agent's, writable, in each fork."""
    cfg = BwrapConfig()
    sb = await create_sandbox(backend="bwrap", ttl_s=120)
    try:
        r = await sb.exec("mkdir -p /work/d && echo one > /work/d/note && stat -c %u /work/d/note")
        assert r.stdout.strip() == "1000", r
        snap = await sb.snapshot()
        try:
            assert snap.layer is not None and (snap.layer / "work/d/note").stat().st_uid == cfg.uid_base + 1000
            forks = await fork(snap, 2)
            try:
                slots = [sb.slot, *(f.slot for f in forks)]  # type: ignore[attr-defined]
                assert len({s.base for s in slots}) == 3 and any(s.shifted for s in slots), slots
                for f in forks:
                    r = await f.exec("stat -c %u /work/d/note && echo two >> /work/d/note && cat /work/d/note")
                    assert r.exit_code == 0 and r.stdout.split() == ["1000", "one", "two"], r
            finally:
                for f in forks:
                    await f.close()
        finally:
            snap.delete()
    finally:
        await sb.close()


@needs_bwrap
def test_a_build_step_in_another_slot_stores_its_layer_canonical(tmp_path: Path) -> None:
    """An image-build RUN step runs as its own slot's uids; what it leaves is stored canonical."""
    cfg = BwrapConfig()
    held = _shifted_slots(cfg)
    slot = held[-1]
    try:
        layer, out = tmp_path / "layer", tmp_path / "out"
        layer.mkdir()
        out.mkdir()
        os.chown(layer, cfg.uid_base, cfg.uid_base)
        step = "id -u > /id && cat /proc/self/uid_map > /map && mkdir /d && chown 1000:1000 /d && touch /d/f"
        cmd = build_command(out, layer, [Path("/")], ["/bin/sh", "-c", step], env={"PATH": "/usr/bin:/bin"},
                            cwd="/", config=cfg, slot=slot)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        after = layer_next(layer)
        assert (after / "id").read_text() == "0\n"
        assert (after / "map").read_text().split()[:3] == ["0", str(slot.base), "65536"]
        assert (after / "id").stat().st_uid == cfg.uid_base
        assert (after / "d").stat().st_uid == cfg.uid_base + 1000
        assert (after / "d/f").stat().st_uid == cfg.uid_base
    finally:
        for s in held:
            s.release()


@pytest.mark.parametrize(("args", "message"), [
    (["--userns-owner", "0"], "bad --userns-owner"),
    (["--userns-owner", "12x"], "bad --userns-owner"),
    (["--userns-max", "../../kernel/x", "1"], "bad --userns-max"),
    (["--userns-max", "inotify_instances", "-1"], "bad --userns-max"),
    (["--shift-ns", "0", "5", "1"], "bad --shift-ns range"),
    (["--shift", "/", "/tmp"], "--shift needs --shift-ns first"),
])
def test_the_launcher_names_a_bad_uid_option(args: list[str], message: str) -> None:
    from sandfleet.agent.build import agent_binary

    p = subprocess.run([str(agent_binary()), "launch", *args, "--", "/bin/true"], capture_output=True, text=True)
    assert p.returncode == 125 and message in p.stderr, (p.returncode, p.stderr)
