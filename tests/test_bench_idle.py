"""`bench micro --idle` holds more idle sandboxes than one process's open-file limit allows
(helper processes hold the rest), and a limit it can't get past is one line, never a
traceback; nothing is left either way (issue 28: 10,000 idle sandboxes under a limit of
20,000 descriptors, about 8 per sandbox; scaled down here by lowering the limit)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.chaoskit import leaks
from conftest import backend_skip, sandbox_cgroups


def micro(state: Path, nofile: int, idle: int) -> subprocess.CompletedProcess[str]:
    """``bench micro`` under an open-file limit of ``nofile``, in a state directory and a
    cgroup parent of its own."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return subprocess.run([sys.executable, "-m", "sandfleet.cli", "bench", "micro", "--backend", "bwrap", "--json",
                           "--idle", str(idle), "-n", "2"],
                          env={**os.environ, "SANDFLEET_STATE": str(state), "SANDFLEET_CGROUP_PARENT": PARENT},
                          capture_output=True, text=True,
                          timeout=300, preexec_fn=limit)  # fmt: skip


PARENT = f"sf-test-idle-{os.getpid()}"


def cgroups_left() -> list[str]:
    return sandbox_cgroups(PARENT)


@pytest.fixture
def state() -> Iterator[Path]:
    why = backend_skip("bwrap")
    if why:
        pytest.skip(why)
    root = Path(tempfile.mkdtemp(prefix="sfidle-", dir="/tmp"))
    root.chmod(0o711)  # the sandboxes' mapped uids traverse to their state directories
    try:
        yield root / "state"
    finally:
        shutil.rmtree(root, ignore_errors=True)
        from sandfleet.sandbox import cgroups

        for mount in set(cgroups.detect().mounts.values()):
            with contextlib.suppress(OSError):
                (mount / PARENT).rmdir()


def test_idle_sandboxes_past_one_process_open_file_limit_are_held_by_helpers(state: Path) -> None:
    res = micro(state, 600, 100)  # ~8 descriptors each: about 40 fit in a process under 600
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["idle_created"] == 100
    assert out["idle_processes"] >= 3, out  # this one and at least two helpers
    assert "idle_stopped" not in out
    assert out["idle_pss_mib"] > 0 and out["idle_mem_drop_mib"] > 0
    assert 0 < out["exec_host_cpu_us_mean"] < out["exec_rtt_p50_ms"] * 1000 * 4  # (the loop's share of it)
    for k in ("idle_slab_kib", "idle_pagetables_kib", "idle_kernelstack_kib"):
        assert k in out
    # the create rate at each end of the hold, over half of it each (fewer than 2,000 held);
    # the helpers' batches count (the last 50 were made by them)
    assert out["idle_create_window"] == 50
    assert out["idle_create_per_s_first_1000"] > 0 and out["idle_create_per_s_last_1000"] > 0
    assert out["idle_create_last_to_first"] == pytest.approx(
        out["idle_create_per_s_first_1000"] / out["idle_create_per_s_last_1000"], rel=0.05)
    assert leaks([], marks=[str(state), "sandfleet.bench.idle"], state=state) == []
    assert cgroups_left() == []


def test_a_limit_the_hold_cannot_pass_is_one_line_and_leaves_nothing(state: Path) -> None:
    res = micro(state, 300, 64)  # under 300 descriptors not even one batch fits
    assert res.returncode == 1, res.stdout
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, res.stderr
    assert "held 0 of 64 idle sandboxes" in errors[0] and "open-file limit (300)" in errors[0], errors
    assert "ulimit -n" in errors[0]
    assert json.loads(res.stdout)["idle_created"] == 0
    assert leaks([], marks=[str(state), "sandfleet.bench.idle"], state=state) == []
    assert cgroups_left() == []


def test_a_helper_whose_holder_is_gone_closes_its_sandboxes_without_a_traceback(state: Path) -> None:
    """The holder killed (the global OOM killer took it once, at 9,950 held): its helpers'
    stdout is a pipe nobody reads. Each closes what it holds and exits, with no traceback."""
    from sandfleet.sandbox.spec import SandboxSpec

    r, w = os.pipe()
    os.close(r)  # the holder's end: gone before the helper says how many it holds
    spec = SandboxSpec(backend="bwrap")
    proc = subprocess.run([sys.executable, "-m", "sandfleet.bench.idle",
                           json.dumps({"want": 3, "spec": spec.model_dump(mode="json")})],
                          env={**os.environ, "SANDFLEET_STATE": str(state), "SANDFLEET_CGROUP_PARENT": PARENT},
                          stdin=subprocess.DEVNULL, stdout=w, stderr=subprocess.PIPE, text=True,
                          timeout=120)  # fmt: skip
    os.close(w)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert leaks([], marks=[str(state), "sandfleet.bench.idle"], state=state) == []
    assert cgroups_left() == []
