"""What the image builder builds: a Dockerfile in its context, and the image's name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BuildSpec:
    """What the builder builds: a Dockerfile in its context, the image's name, and what to
    record beside it. It knows nothing of tasks (``sandfleet.tasks.images.build_spec`` makes
    one from a task)."""

    dockerfile: Path
    context: Path
    """The build context: what COPY and ADD read (nothing outside it)."""
    name: str
    """The image's name (``sandfleet image ls``); a task's image is ``task-<task>``."""
    workdir: str = "/"
    """The final working directory when the Dockerfile sets none (made there; given to the
    non-root ``agent`` when the Dockerfile names no USER)."""
    timeout_s: float = 600.0
    """Limit of the whole build (every RUN step together)."""
    meta: Mapping[str, object] = field(default_factory=dict)
    """Recorded in the image's metadata beside what the build reports (a task's name)."""
