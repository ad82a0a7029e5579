"""Validation per architecture (``sandfleet tasks validate --arch amd64,arm64 [--page-size 64k]``,
:mod:`sandfleet.cli.validate_arch`).

Each architecture is validated in turn (a foreign one under qemu-user emulation,
:func:`sandfleet.images.emulation.emulation`), and every task gets one verdict across them:
``valid on both`` (all), ``valid on only <arch>``, ``flaky on <arch> n/R`` (oracle 1 and no-op 0
in n of R repeats), or ``invalid``. ``--page-size 64k`` also lists, per task image of an
architecture whose kernels can have such pages (arm64), the ELF files whose PT_LOAD alignment a
kernel with pages that large can't map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from sandfleet.images import emulation

LARGE_PAGE_ARCHES = ("arm64", "ppc64el")
"""Architectures whose kernels may use pages larger than 4K (x86-64 has none): --page-size checks these."""


class _Verdict(Protocol):
    status: str
    reason: str
    oracle_rewards: list[float | None]
    noop_rewards: list[float | None]
    seconds: float


def good(v: _Verdict) -> int:
    """Repeats where the oracle scored 1 and the no-op 0 (as ``judge`` counts them)."""
    ones = sum(1 for r in v.oracle_rewards if r is not None and abs(r - 1.0) < 1e-9)
    zeros = sum(1 for r in v.noop_rewards if r is not None and abs(r) < 1e-9)
    return min(ones, zeros)


def classify(per_arch: dict[str, _Verdict]) -> str:
    """One task's verdict across architectures."""
    valid = [a for a, v in per_arch.items() if v.status == "valid"]
    flaky = [f"{a} {good(v)}/{len(v.oracle_rewards)}" for a, v in per_arch.items() if v.status == "flaky"]
    if len(valid) == len(per_arch):
        return "valid on both" if len(per_arch) == 2 else "valid on all"
    if flaky:
        return "flaky on " + ", ".join(flaky)
    if valid:
        return "valid on only " + ", ".join(valid)
    return "invalid"


def page_problems(task: Any, page_size: int, cache: dict[Path, dict[str, int]]) -> dict[str, int]:
    """ELF files of the task's (built, cached) image that ``page_size`` pages can't load."""
    from sandfleet.tasks.images import build_task_image

    image = build_task_image(task)
    out: dict[str, int] = {}
    seen: set[str] = set()
    for layer in image.lowers:  # top first; each layer scanned once per run
        if layer not in cache:
            cache[layer] = emulation.page_size_problems([layer], page_size)
        for path, align in cache[layer].items():
            if path not in seen:
                out[path] = align
        seen.update(cache[layer])
    return out
