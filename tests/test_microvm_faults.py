"""A microVM's memory hog (test_sandbox_faults.py's, for the microvm backend): the limit is the guest's RAM
and its own kernel's OOM killer ends the command, so nothing of it is about this host's limits or load,
and it runs among the slow pass's workers rather than in the serial part, where it took 27-53 s under TCG
(issue 43)."""

from __future__ import annotations

import pytest

from conftest import backend_skip
from sandfleet.sandbox import create_sandbox
from test_sandbox_faults import hog_is_oom_killed

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(backend_skip("microvm")),
                                                   reason=str(backend_skip("microvm")))]


async def test_memory_hog_is_oom_killed_in_the_guest() -> None:
    sb = await create_sandbox(backend="microvm", ttl_s=300, memory_mib=256, pids=128)
    try:
        await hog_is_oom_killed(sb)
    finally:
        await sb.close()
