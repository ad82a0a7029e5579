"""The service's kernels: one stateful Python (:class:`~sandfleet.interpreter.Kernel`) per
sandbox, started on its first cell, shared by ``POST /v1/sandboxes/{id}/run_code`` and the
E2B code interpreter, so both see one state."""

from __future__ import annotations

from sandfleet.interpreter import Kernel
from sandfleet.server.service import Entry, SandboxService


class Kernels:
    def __init__(self, service: SandboxService):
        self.service = service
        self.kernels: dict[str, Kernel] = {}

    def get(self, e: Entry) -> Kernel:
        """The sandbox's kernel (made, not started, on first use); a closed sandbox's are
        dropped here (its kernel ended with it)."""
        for gone in [sid for sid in self.kernels if sid not in self.service.live]:
            del self.kernels[gone]
        k = self.kernels.get(e.sb.id)
        if k is None:
            k = self.kernels[e.sb.id] = Kernel(e.sb, cwd=e.spec.workdir)
        return k
