"""A task's environment image: the build spec made from the task, built here by the image
builder (:mod:`sandfleet.images.build`, which knows no task), or on a sandbox service's own
host by a backend that builds images itself (``--remote``: :class:`BuildsImages`).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from sandfleet.errors import ImageBuildError
from sandfleet.images.build import build_image
from sandfleet.images.spec import BuildSpec
from sandfleet.imagestore import Image, host_image
from sandfleet.sandbox import backend_in_use
from sandfleet.sandbox.spec import BwrapConfig
from sandfleet.tasks.model import Task


@runtime_checkable
class BuildsImages(Protocol):
    """A backend that builds task images on its own host, from the task folder (a sandbox
    service: ``sandfleet.client.ServiceClient``): the image must exist where the sandboxes run."""

    async def task_image(self, task: Task, *, strict: bool = False) -> str:
        """The name to put in a SandboxSpec for the task's environment on that host."""
        ...

    async def verifier_image(self, task: Task) -> tuple[str, dict[str, str]]:
        """The image of the task's ``tests/Dockerfile`` on that host, and its environment."""
        ...


def remote_builder() -> BuildsImages | None:
    """The backend in force (:func:`sandfleet.sandbox.use_backend`: ``--remote``) when it builds
    task images itself, else None: what a caller of :func:`ensure_task_image` passes as its
    ``builder`` to build where the sandboxes will run."""
    backend = backend_in_use()
    return backend if isinstance(backend, BuildsImages) else None


def build_spec(task: Task) -> BuildSpec | None:
    """What the builder builds for ``task``: its Dockerfile in its context, named
    ``task-<name>``. None when the task has no Dockerfile (it runs on the host image)."""
    if task.dockerfile is None:
        if task.docker_image:
            raise ImageBuildError(f"task {task.name} names only a registry image "
                                  f"({task.docker_image}) and no environment/Dockerfile; sandfleet "
                                  "can't pull images: add the Dockerfile that builds it")
        return None
    return BuildSpec(dockerfile=task.dockerfile, context=task.context_dir or task.dockerfile.parent,
                     name=f"task-{task.name}", workdir=task.workdir, timeout_s=task.build_timeout_s,
                     meta={"task": task.name})


def build_task_image(task: Task, config: BwrapConfig | None = None, *, strict: bool = False,
                     report: dict[str, object] | None = None, accept_older: bool = False) -> Image:
    """Build (or find in the cache) the image of a task, here; blocking. The host image for a
    task without a Dockerfile. The keywords are :func:`sandfleet.images.build.build_image`'s."""
    spec = build_spec(task)
    if spec is None:
        return host_image()
    return build_image(spec, config, strict=strict, report=report, accept_older=accept_older)


async def ensure_task_image(task: Task, *, strict: bool = False, accept_older: bool = False,
                            builder: BuildsImages | None = None) -> str:
    """The name to put in a SandboxSpec for this task's environment, building it if needed:
    by ``builder`` on its own host when one is given (a sandbox service, which builds it from
    the uploaded task folder: pass :func:`remote_builder`), else here."""
    if builder is not None:
        if accept_older:
            raise ImageBuildError("--accept-older-versions is not passed to a sandbox service (--remote): "
                                  "build the image there with `sandfleet image build --accept-older-versions`")
        return await builder.task_image(task, strict=strict)
    image = await asyncio.to_thread(build_task_image, task, strict=strict, accept_older=accept_older)
    return "host" if image.is_host else image.hash
