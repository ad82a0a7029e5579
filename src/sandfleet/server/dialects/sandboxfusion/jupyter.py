"""SandboxFusion's ``POST run_jupyter`` on sandfleet: the cells run in order in one stateful
Python (a :class:`~sandfleet.interpreter.Kernel`, no Jupyter) in a fresh sandbox of the
service's ``--fusion-image``, closed when the call ends.

The request is SandboxFusion's ``RunJupyterRequest``: ``cells``, ``cell_timeout`` (seconds
per cell, 0 for none), ``total_timeout`` (all cells, default 45), ``kernel`` (``python3``
only), ``files`` (base64, written into the working directory first) and ``fetch_files``
(read back, base64). The answer is its ``RunJupyterResponse``: ``cells``, one per cell run,
each ``{stdout, stderr, display, error}``, where ``display`` is the cell's results as MIME
bundles (``text/plain``, ``image/png``, ``text/html``, ...; the cell's value and its
figures) and ``error`` is ``[{ename, evalue, traceback: [lines]}]`` or empty. Every cell
runs, whatever an earlier one raised; a cell past its timeout is interrupted
(KeyboardInterrupt) and no further cell runs. ``driver`` is the whole run: ``Finished``, or
``TimeLimitExceeded`` after a timeout. ``status`` is ``Success`` when every cell ran without
an error, ``Failed`` otherwise, ``SandboxError`` when the sandbox could not be made or was lost.
"""

from __future__ import annotations

import base64
import json
import logging
import posixpath
import time
from typing import TYPE_CHECKING, Any

from fastapi import Request
from pydantic import ValidationError

import sandfleet.server.dialects.sandboxfusion.api as sf
from sandfleet.errors import SandfleetError, ServiceError
from sandfleet.interpreter import Kernel, KernelError
from sandfleet.sandbox.base import DEFAULT_MAX_OUTPUT
from sandfleet.sandbox.spec import Limits, SandboxSpec
from sandfleet.server.dialects.sandboxfusion.api import SandboxFusion
from sandfleet.server.dialects.sandboxfusion.models import RunJupyter, problem
from sandfleet.server.wire import problem_for

if TYPE_CHECKING:
    from sandfleet.server.service import Entry

log = logging.getLogger(__name__)
DEFAULT_TOTAL_S = 45.0
MIME = {"text": "text/plain", "html": "text/html", "markdown": "text/markdown", "svg": "image/svg+xml",
        "png": "image/png", "jpeg": "image/jpeg", "latex": "text/latex", "json": "application/json",
        "javascript": "application/javascript", "pdf": "application/pdf"}


def mime_bundle(result: dict[str, Any]) -> dict[str, Any]:
    return {MIME[k]: v for k, v in result.items() if k in MIME and v is not None}


async def run_jupyter(fusion: SandboxFusion, request: Request) -> dict[str, Any]:
    owner = fusion.owner(request)
    request.state.fusion_language = "python"
    if fusion.service.draining:
        raise sf.FusionError(503, "the service is shutting down; no new work is taken", {"Retry-After": "1"})
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError:
        raise sf.FusionError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise sf.FusionError(400, "the body is not a JSON object")
    max_t = fusion.service.config.max_ttl_s
    try:
        req = RunJupyter.model_validate(body)
    except ValidationError as err:
        raise sf.FusionError(400, problem(err, RunJupyter, {"cell_timeout": (0.0, max_t),
                                                            "total_timeout": (0.001, max_t)})) from None
    cells = req.cells
    if (req.kernel or "python3") != "python3":
        raise sf.FusionError(400, f"kernel {req.kernel!r} is not supported by sandfleet (python3)")
    cell_t = sf._number("cell_timeout", req.cell_timeout, 0.0, low=0.0, high=max_t)
    total_t = sf._number("total_timeout", req.total_timeout, DEFAULT_TOTAL_S, low=0.001, high=max_t)
    files, fetch = sf._files(req), req.fetch_files or []
    spec = SandboxSpec(image=fusion.image, workdir=sf.WORKDIR, labels={"dialect": "sandbox-fusion"},
                       limits=Limits(memory_mib=sf.DEFAULT_MEMORY_MIB, ttl_s=min(max_t, total_t + sf.GRACE_S)))
    try:
        e = await fusion.service.create(owner, spec, key=None, deadline_ms=None)
    except SandfleetError as err:
        known = problem_for(err)
        if isinstance(err, ServiceError) and known is not None and known.status_code not in (410, 503):
            raise sf.FusionError(known.status_code, known.message, dict(known.headers or {})) from None
        if known is not None and known.status_code == 400:
            raise sf.FusionError(400, known.message) from None
        return _error(f"the sandbox could not be made: {err}")
    return await fusion.in_sandbox(request, owner, e, _cells(fusion, owner, e, cells, cell_t, total_t, files, fetch))


async def _cells(fusion: SandboxFusion, owner: str, e: Entry, cells: list[str], cell_t: float, total_t: float,
                 files: dict[str, bytes], fetch: list[str]) -> dict[str, Any]:
    sb = e.sb
    t0 = time.perf_counter()
    out: list[dict[str, Any]] = []
    timed_out = failed = False
    kernel = Kernel(sb, cwd=sf.WORKDIR)
    try:
        async with fusion.service.busy(owner, None, e):
            dirs = sorted({posixpath.dirname(p) for p in files} - {sf.WORKDIR})
            if dirs:
                await sb.exec(["mkdir", "-p", "--", *dirs], cwd=sf.WORKDIR)
            for path, data in files.items():
                await sb.write_file(path, data)
            await kernel.start()
            for code in cells:
                left = total_t - (time.perf_counter() - t0)
                limit = min(cell_t, left) if cell_t > 0 else left
                if limit <= 0:
                    timed_out = True
                    break
                t1 = time.perf_counter()
                ex = await kernel.run(code, timeout=limit)
                err = ex.error
                out.append({"stdout": "".join(ex.stdout), "stderr": "".join(ex.stderr),
                            "display": [mime_bundle(r) for r in ex.results],
                            "error": [] if err is None else [{"ename": err["name"], "evalue": err["value"],
                                                              "traceback": err["traceback"].splitlines()}]})
                failed = failed or err is not None
                if err is not None and time.perf_counter() - t1 >= limit:
                    timed_out = True
                    break
            got = {}
            for p in fetch:
                try:
                    got[p] = base64.b64encode(await sb.read_file(sf._path(p), max_bytes=DEFAULT_MAX_OUTPUT)).decode()
                except SandfleetError as err2:
                    log.debug("sandbox-fusion: fetch_files %s: %s", p, err2)
    except KernelError as err3:
        return _error(f"the kernel could not run in the sandbox: {err3}")
    except SandfleetError as err4:
        if isinstance(err4, ServiceError):
            raise
        return _error(f"the sandbox failed during the call: {err4}")
    finally:
        await kernel.close()
    driver = {"status": "TimeLimitExceeded" if timed_out else "Finished",
              "execution_time": round(time.perf_counter() - t0, 6), "cpu_time": None,
              "return_code": None if timed_out else 0, "stdout": "", "stderr": ""}
    return {"status": "Failed" if failed or timed_out else "Success", "message": "", "driver": driver,
            "cells": out, "executor_pod_name": None, "files": got}


def _error(message: str) -> dict[str, Any]:
    return {"status": "SandboxError", "message": message, "driver": None, "cells": [], "executor_pod_name": None,
            "files": {}}
