"""Task images built on the service host from task folders the client uploads, once per
content hash.

``GET /v1/task-images/{digest}`` answers the image a task folder (named by its content hash,
:func:`sandfleet.tasks.bundle.content_hash`) built to, or 404; ``PUT`` takes the folder as an
uncompressed tar (:func:`sandfleet.tasks.bundle.pack`), checks the hash, unpacks it under
``<cache>/service/tasks/<digest>``, loads the task and builds its image (or, with
``verifier=true``, the image of its ``tests/Dockerfile``). One build per digest even when
uploads race (a lock per digest; the losers get the winner's answer); a record under
``<cache>/service/task-images/`` keeps the answer across restarts while the image exists.
A build holds one ``--max-busy`` slot (it is CPU work) and runs in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Query, Request

from sandfleet.client.models import TaskImage
from sandfleet.errors import ConfigError, ImageError, SandfleetError, ServiceError, TaskError
from sandfleet.server.deps import ERRORS, Deadline, Owner
from sandfleet.server.metrics import Metrics
from sandfleet.server.service import SandboxService
from sandfleet.server.wire import check_tar

log = logging.getLogger(__name__)
DIGEST = re.compile(r"[0-9a-f]{64}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,127}")


@dataclass
class _Lock:
    lock: asyncio.Lock
    users: int = 0


class TaskImages:
    def __init__(self, service: SandboxService, metrics: Metrics, root: Path):
        self.service = service
        self.metrics = metrics
        self.folders = root / "tasks"
        self.records = root / "task-images"
        self._locks: dict[str, _Lock] = {}

    @staticmethod
    def check_digest(digest: str) -> None:
        if not DIGEST.fullmatch(digest):
            raise ConfigError(f"a task folder's digest is 64 lowercase hex digits (its SHA-256), not {digest[:80]!r}")

    def _record(self, digest: str, strict: bool, verifier: bool) -> Path:
        return self.records / f"{digest}{'-strict' if strict else ''}{'-verifier' if verifier else ''}.json"

    def lookup(self, digest: str, strict: bool, verifier: bool) -> TaskImage | None:
        """The image this folder built to, if recorded and still in the image cache."""
        from sandfleet.imagestore import images_dir

        try:
            info = TaskImage.model_validate_json(self._record(digest, strict, verifier).read_bytes())
        except (OSError, ValueError):
            return None
        if info.image != "host" and not (images_dir() / info.image / "image.json").is_file():
            return None  # the image was removed (sandfleet image rm): build it again
        return info.model_copy(update={"built": False})

    async def get(self, digest: str, strict: bool, verifier: bool) -> TaskImage:
        self.check_digest(digest)
        info = await asyncio.to_thread(self.lookup, digest, strict, verifier)
        if info is None:
            raise ServiceError(f"no image of task folder {digest[:12]} on this service: upload the folder (PUT)",
                               code="task_image_not_found")
        return info

    async def put(self, owner: str, digest: str, data: bytes, *, strict: bool, verifier: bool, name: str | None,
                  deadline_ms: str | None) -> TaskImage:
        self.check_digest(digest)
        if name is not None and not NAME.fullmatch(name):
            raise ConfigError(f"name must be a task name (letters, digits, ._+-), not {name[:80]!r}")
        if not data:
            raise ConfigError("the body is empty: send the task folder as an uncompressed tar")
        self.metrics.task_uploads.inc()
        slot = self._locks.setdefault(digest, _Lock(asyncio.Lock()))
        slot.users += 1
        try:
            async with slot.lock:
                known = await asyncio.to_thread(self.lookup, digest, strict, verifier)
                if known is not None:
                    return known
                return await self._build(owner, digest, data, strict, verifier, name, deadline_ms)
        finally:
            slot.users -= 1
            if not slot.users:
                del self._locks[digest]

    async def _build(self, owner: str, digest: str, data: bytes, strict: bool, verifier: bool, name: str | None,
                     deadline_ms: str | None) -> TaskImage:
        async with self.service.slot(owner, deadline_ms):  # a build is CPU work: one busy slot
            # the build goes on in its thread if the request is cancelled; the lock waits for it
            return await asyncio.shield(asyncio.to_thread(self._build_blocking, digest, data, strict, verifier, name))

    def _build_blocking(self, digest: str, data: bytes, strict: bool, verifier: bool, name: str | None) -> TaskImage:
        from sandfleet.rollout.verifier import verifier_build
        from sandfleet.tasks.bundle import unpack
        from sandfleet.tasks.images import build_task_image
        from sandfleet.tasks.loader import load_task

        check_tar(data)
        try:
            folder = unpack(digest, data, self.folders)
        except ConfigError as e:
            raise ServiceError(f"{e}: the body is not the folder {digest[:12]} names", code="digest_mismatch") from None
        except (OSError, EOFError, ValueError, tarfile.TarError) as e:
            raise ConfigError(f"could not unpack the task folder: {type(e).__name__}: {e}") from None
        try:
            task = load_task(folder)
        except TaskError as e:
            raise ServiceError(f"the uploaded folder is not a task: {_relative(e, folder)}",
                               code="not_a_task") from None
        except ImageError as e:
            self.metrics.task_builds.labels("failed").inc()
            raise ServiceError(_relative(e, folder), code="build_failed") from None
        if name is not None:
            task = task.model_copy(update={"name": name})
        if verifier:
            try:
                task = verifier_build(task)
            except TaskError as e:
                raise ServiceError(_relative(e, folder), code="not_a_task") from None
        report: dict[str, object] = {}
        try:
            image = build_task_image(task, strict=strict, report=report)
        except SandfleetError as e:  # an ImageBuildError with the step's output; or the host failed a step
            self.metrics.task_builds.labels("failed").inc()
            log.warning("image build of task folder %s (%s) failed: %s: %s", digest[:12], task.name,
                        type(e).__name__, e)
            what = "" if isinstance(e, ImageError) else f" ({type(e).__name__})"
            raise ServiceError(f"the image build failed{what}: {_relative(e, folder)}", code="build_failed") from None
        built = not image.is_host and report.get("built") is True
        self.metrics.task_builds.labels("built" if built else "cached").inc()
        env = {str(k): str(v) for k, v in dict(image.meta.get("env") or {}).items()}  # type: ignore[call-overload]
        info = TaskImage(digest=digest, image="host" if image.is_host else image.hash, env=env, arch=image.arch,
                         warnings=[str(w) for w in image.meta.get("warnings") or []],  # type: ignore[attr-defined]
                         build_s=_float(image.meta.get("build_s")), built=built)
        self.records.mkdir(parents=True, exist_ok=True)
        rec = self._record(digest, strict, verifier)
        tmp = rec.with_suffix(".tmp")
        tmp.write_text(json.dumps(info.model_dump()))
        tmp.rename(rec)
        log.info("task folder %s (%s): image %s (%s)", digest[:12], task.name, info.image,
                 "built" if built else "from the cache")
        return info


def _float(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) else None


def _relative(e: Exception, folder: Path) -> str:
    """The message without the service's own cache path."""
    return str(e).replace(str(folder), "<task>")


Strict = Annotated[bool, Query(description="Refuse a substituted base (--strict-bases).")]
Verifier = Annotated[bool, Query(description="The image of the task's tests/Dockerfile instead.")]
TASK_TAR_BODY = {"requestBody": {"required": True, "description": "the task folder as an uncompressed tar", "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}


def install(app: FastAPI, service: SandboxService, metrics: Metrics) -> None:
    from sandfleet.agent.build import cache_dir

    images = TaskImages(service, metrics, cache_dir() / "service")

    @app.get("/v1/task-images/{digest}", tags=["task images"], responses=ERRORS)
    async def get_task_image(digest: str, owner: Owner, strict: Strict = False,
                             verifier: Verifier = False) -> TaskImage:
        """The image the task folder with this content hash built to on this host; 404 when it
        has not been uploaded (or its image was removed)."""
        return await images.get(digest, strict, verifier)

    @app.put("/v1/task-images/{digest}", tags=["task images"], responses=ERRORS, openapi_extra=TASK_TAR_BODY)
    async def put_task_image(digest: str, request: Request, owner: Owner, strict: Strict = False,
                             verifier: Verifier = False,
                             name: Annotated[str | None, Query(description="The task's name (default: its digest).",
                                                               max_length=128)] = None,
                             deadline: Deadline = None) -> TaskImage:
        """Upload a task folder (an uncompressed tar of it, :func:`sandfleet.tasks.bundle.pack`)
        and build its image on this host, once per digest: 400 ``digest_mismatch`` when the
        folder does not hash to ``digest``, 422 ``not_a_task``, 422 ``build_failed`` (the
        message ends with the failing step's output), 413 over ``--max-body-mib``."""
        data = await request.body()
        return await images.put(owner, digest, data, strict=strict, verifier=verifier, name=name,
                                deadline_ms=deadline)
