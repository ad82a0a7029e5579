"""Contention per rollout, the host_contention rule and --concurrency auto (issue 42;
docs/rollouts.md, "Contention" and "Admission"). Real sandboxes, real busy processes."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandfleet.cli import cli
from sandfleet.errors import ConfigError
from sandfleet.rollout import OraclePolicy
from sandfleet.rollout.admission import choose_concurrency, host_capacity
from sandfleet.rollout.runner import RetryPolicy
from sandfleet.rollout.verdict import CONTENTION_THRESHOLD, INFRA, POLICY, SCORED
from sandfleet.sandbox import create_sandbox, make_spec
from sandfleet.sandbox.contention import host_cpus, start_probe
from test_rollout_support import make_task, needs_bwrap, run

# -- admission -------------------------------------------------------------------------------


def test_capacity_is_what_the_cpus_hold_at_the_tasks_cpus() -> None:
    assert host_capacity([1.0], 2) == 2
    assert host_capacity([1.0, 2.0], 8) == 4  # the widest task decides
    assert host_capacity([0.5], 2) == 4
    assert host_capacity([4.0], 2) == 1  # at least one
    assert host_capacity([], 3) == 3


def test_auto_says_what_it_chose_and_a_larger_number_warns() -> None:
    n, notes = choose_concurrency("auto", [1.0], host_cpus=2)
    assert n == 2 and notes == ["concurrency auto: 2 (the host's 2 CPUs hold 2 sandboxes at cpus = 1)"]
    n, notes = choose_concurrency(None, [1.0], group=4, host_cpus=2)
    assert n == 4 and "oversubscribes" in notes[0]  # a group is admitted whole
    n, notes = choose_concurrency(8, [1.0], host_cpus=2)
    assert n == 8 and notes[0].startswith("warning: --concurrency 8 oversubscribes") and "bench run" in notes[0]
    assert choose_concurrency(2, [1.0], host_cpus=2) == (2, [])
    with pytest.raises(ConfigError):
        choose_concurrency("many", [1.0], host_cpus=2)


def test_run_and_validate_say_so(tmp_path: Path) -> None:
    task = make_task(tmp_path / "tasks", "hello")
    ncpu = host_cpus()
    r = CliRunner().invoke(cli, ["run", "--tasks", str(task.path.parent), "--agent", "noop", "--backend", "process",
                                  "--concurrency", str(ncpu + 5), "--out", str(tmp_path / "o"), "--no-limits"])
    assert f"warning: --concurrency {ncpu + 5} oversubscribes" in r.output, r.output
    r = CliRunner().invoke(cli, ["run", "--tasks", str(task.path.parent), "--agent", "noop", "--backend", "process",
                                  "--concurrency", "lots", "--out", str(tmp_path / "o2")])
    assert r.exit_code == 2 and "a number or 'auto'" in r.output


# -- the probe -------------------------------------------------------------------------------

SPIN = "import time\ne = time.time() + {s}\nwhile time.time() < e: pass\n"


@contextlib.contextmanager
def busy(k: int) -> Iterator[None]:
    """``k`` busy processes on the host, outside every sandbox, each in a session of its own:
    under the kernel's autogroup scheduling the processes of one session share one weight, and
    k of them in the test's session took no more CPU from a sandbox than one did."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], start_new_session=True) for _ in range(k)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


@needs_bwrap()
async def test_figures_of_a_phase_and_own_spinners_are_not_outside(tmp_path: Path) -> None:
    """A sandbox's figures; its own four spinners under cpus=1 wait behind each other and its
    limit (run_delay_s, throttled_s), but that is never counted as outside wait: no more than
    the CPU it lacked below one thread's worth of its limit."""
    sb = await create_sandbox(make_spec(image="host", backend="bwrap", cpus=1, ttl_s=120))
    try:
        probe = start_probe(sb)
        assert probe is not None
        spin = SPIN.format(s=2).replace("\n", "; ").replace("; while", "\nwhile")
        await sb.exec(f"for i in 1 2 3 4; do python3 -c '{spin}' & done; wait", timeout=60)
        fig = probe.stop()
    finally:
        await sb.close()
    keys = {"wall_s", "cpu_s", "run_delay_s", "throttled_s", "nr_throttled", "busy_s", "outside_runnable",
            "outside_wait_s", "outside_share", "host_psi_some_s", "cpus", "host_cpus", "samples"}
    assert keys <= set(fig) and fig["cpus"] == 1.0 and fig["samples"] >= 10
    assert fig["run_delay_s"] > 1.0, fig  # four threads on one CPU's worth: they queued (own doing)
    assert fig["outside_wait_s"] <= fig["run_delay_s"]
    assert fig["outside_wait_s"] <= max(0.0, fig["busy_s"] - fig["cpu_s"]) + 1e-3, fig
    assert fig["outside_wait_s"] < fig["run_delay_s"] / 2, fig  # most of its waiting was its own


# -- the rule, end to end --------------------------------------------------------------------

# fails when its thread got less than 70 % of a CPU while it ran: slow only under contention
RATIO_TEST = r"""import time
w, c = time.perf_counter(), time.process_time()
x = 0
while time.process_time() - c < 0.3:
    x += 1
w, c = time.perf_counter() - w, time.process_time() - c
print(f"wall {w:.2f} s, cpu {c:.2f} s")
assert c / w > 0.7, "too slow"
"""
RUN = "#!/bin/bash\nmkdir -p /logs/verifier\npython3 /tests/t.py && echo 1 > /logs/verifier/reward.txt || " \
      "echo 0 > /logs/verifier/reward.txt\n"
# the code under test runs four spinners of its own (cpus = 1) while the test times it
SPINNING_TEST = ("import subprocess, sys\n"
                 "spin = [subprocess.Popen([sys.executable, '-c', 'while 1: pass']) for _ in range(4)]\n"
                 "try:\n" + "".join("    " + line + "\n" for line in RATIO_TEST.splitlines()) +
                 "finally:\n    [p.kill() for p in spin]\n")


@pytest.mark.slow
@needs_bwrap()
async def test_a_failing_verifier_under_outside_contention_is_masked(tmp_path: Path) -> None:
    """Beside four busy processes on the host, a test that fails when slow: every attempt is
    host_contention, masked and refilled in place; the evidence is in the fault."""
    task = make_task(tmp_path, "slow-when-contended", test_sh=RUN, extra_tests={"t.py": RATIO_TEST},
                     dockerfile="FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
                     verifier_extra="load_sensitive = true\n")
    # the same tests in a task that does not declare itself load-sensitive: its 0 stands
    plain = make_task(tmp_path, "undeclared", test_sh=RUN, extra_tests={"t.py": RATIO_TEST},
                      dockerfile="FROM python:3.11-slim-bookworm\nWORKDIR /app\n")
    # outside load rises per try (3, 5, then 8 busy processes a CPU): how much CPU a sandbox
    # loses to k busy processes depends on the host's scheduler and cgroup layout (CI once read
    # an outside share of 0.44 beside 6 on 2 CPUs, where 0.5 is the threshold); each try checks
    # the rule both ways, and the test needs one try where the outside took the CPU
    for i, per_cpu in enumerate((3, 5, 8)):
        with busy(max(2 * per_cpu, per_cpu * host_cpus())):
            report = await run([task, plain], OraclePolicy(), tmp_path / f"out{i}", n=1, concurrency=1,
                               retry=RetryPolicy(max_attempts=2, backoff_s=0.01))
        r = next(x for x in report.results if x.task == task.name)
        u = next(x for x in report.results if x.task == plain.name)
        # never masked: the reward it got stands (0 when its test was slow, 1 when it got its CPU)
        assert u.verdict == "scored" and u.reward in (0.0, 1.0), (u.verdict, u.reward, u.fault, u.contention)
        fig = r.contention["verifier"]
        assert fig is not None
        if r.verdict != INFRA:  # not masked: its tests passed, or the outside took less than the threshold
            assert r.verdict == SCORED and (r.reward == 1.0 or fig["outside_share"] < CONTENTION_THRESHOLD), fig
            continue
        assert fig["outside_share"] >= CONTENTION_THRESHOLD, fig
        assert ((r.fault or {}).get("cause"), r.reward, r.attempt) == ("host_contention", None, 2)
        assert r.fault is not None and r.fault["tests_reward"] == 0.0 and r.fault["contention"] == fig
        assert report.summary()["masked_causes"] == {"host_contention": 1} and report.summary()["refilled"] == 1
        return
    pytest.fail(f"beside {per_cpu} busy processes a CPU the verifier still got its CPU: {fig}")


@pytest.mark.slow
@needs_bwrap()
async def test_code_that_spins_its_own_cpu_scores_0_never_masked(tmp_path: Path) -> None:
    """The code under test spins four threads of its own in a cpus=1 sandbox, so the timing
    test fails: a 0 that stands (scored). Its own queuing shows in run_delay_s, never in
    outside_share. Where other work on a shared host is itself above the threshold, the attempt
    is tried again (up to 3 runs): its mask must then be the outside's doing."""
    # declared load-sensitive, so that only the measure keeps its own spinning from masking it
    task = make_task(tmp_path, "spins-itself", test_sh=RUN, extra_tests={"t.py": SPINNING_TEST}, verifier_timeout=120,
                     dockerfile="FROM python:3.11-slim-bookworm\nWORKDIR /app\n",
                     verifier_extra="load_sensitive = true\n")
    for i in range(3):
        report = await run([task], OraclePolicy(), tmp_path / f"out{i}", n=1, concurrency=1,
                           retry=RetryPolicy(max_attempts=1))
        r = report.results[0]
        fig = r.contention["verifier"]
        assert fig is not None and fig["run_delay_s"] > 1.0, fig  # its spinners queued: its own doing
        if r.verdict != INFRA:
            break
        assert fig["outside_runnable"] >= 0.5, fig  # masked only because the host itself was busy
    if r.verdict == INFRA:  # every try beside outside work above the threshold: nothing to show here
        pytest.skip(f"the host itself was too busy in 3 tries (outside runnable per CPU {fig['outside_runnable']})")
    assert r.verdict in (SCORED, POLICY) and r.reward == 0.0, (r.verdict, r.fault, fig)
    assert fig["outside_share"] < CONTENTION_THRESHOLD, fig
