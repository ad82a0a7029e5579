"""The host uid slot allocator (sandbox/uids.py): one slot of host uids per live sandbox."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sandfleet.errors import ConfigError, SandboxError
from sandfleet.sandbox.spec import UID_STRIDE, BwrapConfig, backend_config
from sandfleet.sandbox.uids import take_slot


def test_uid_slots_are_taken_once_across_processes_and_reused(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The allocator: the lowest free slot, never one another process holds, free again once
    released or once its holder died."""
    monkeypatch.setenv("SANDFLEET_UID_SLOTS", str(tmp_path))
    cfg = BwrapConfig(uid_base=2_000_000_000, slots=4)
    hold = ("import sys, time; from sandfleet.sandbox.spec import BwrapConfig; "
            "from sandfleet.sandbox.uids import take_slot; "
            "s = take_slot(BwrapConfig(uid_base=2_000_000_000, slots=4)); "
            "print(s.index, s.base, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "SANDFLEET_UID_SLOTS": str(tmp_path)})
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


def test_a_uid_range_past_the_last_host_uid_is_refused() -> None:
    with pytest.raises(ConfigError, match="past the last host uid"):
        backend_config({"kind": "bwrap", "uid_base": 4_000_000_000})
    assert backend_config({"kind": "bwrap", "uid_base": 4_000_000_000, "slots": 4}).slots == 4
