"""A sandbox's directory is removed so that a remover killed half-way leaves nothing the reaper
must wait on (stop 55's CI: ``test_sigkilled_at_20_random_points_each_rollout_counts_once`` found
``sf-bwrap-...`` holding only ``agent.log``, a run SIGKILLed while it deleted a closed sandbox's
directory in place; without ``meta.json`` the reaper keeps such a directory as one that may be
starting)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from sandfleet.sandbox.state import GONE_PREFIX


def _in_state(state: Path, code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "SANDFLEET_STATE": str(state), "SANDFLEET_CGROUP_PARENT": f"sf-test-removal-{os.getpid()}"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_remover_killed_half_way_leaves_no_marker_and_the_next_reap_takes_the_rest(tmp_path: Path) -> None:
    state = tmp_path / "state"
    d = state / "sf-bwrap-000000000000"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"id": d.name, "backend": "bwrap", "owner_pid": 1, "owner_start": -1}))
    (d / "agent.log").write_text("")
    many = d / "many"
    many.mkdir()
    for i in range(60_000):  # long enough to delete that the kill lands half-way
        (many / str(i)).touch()
    remover = _in_state(state, f"""
        from pathlib import Path
        from sandfleet.sandbox.state import remove_sandbox_dir
        remove_sandbox_dir(Path({str(d)!r}))
    """)
    deadline = time.monotonic() + 60
    while not any(state.glob(GONE_PREFIX + "*")) and remover.poll() is None and time.monotonic() < deadline:
        time.sleep(0.0005)
    remover.send_signal(signal.SIGKILL)
    remover.communicate()
    gone = list(state.glob(GONE_PREFIX + "*"))
    assert len(gone) == 1 and (gone[0] / "many").exists(), "the remover was not caught half-way"
    assert not d.exists()  # no marker name left: nothing the reaper takes for a starting sandbox
    lister = _in_state(state, """
        import json
        from sandfleet.sandbox.state import list_sandboxes, reap_leftovers
        print(json.dumps([[m["id"] for m in list_sandboxes()], reap_leftovers()]))
    """)
    out, err = lister.communicate(timeout=120)
    assert lister.returncode == 0, err
    listed, reaped = json.loads(out)
    assert listed == [] and reaped == [gone[0].name]
    assert list(state.iterdir()) == []
