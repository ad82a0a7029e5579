"""The service's kernels: one stateful Python (:class:`~sandfleet.interpreter.Kernel`) per
sandbox, started on its first cell, shared by ``POST /v1/sandboxes/{id}/run_code`` and the
E2B code interpreter, so both see one state."""

from __future__ import annotations

from sandfleet.errors import ConfigError
from sandfleet.interpreter import Kernel
from sandfleet.server.service import Entry, SandboxService

DEFAULT_BASH = "default-bash"
"""The context of ``run_code(code, language="bash")`` with the default context: one bash per
sandbox (the E2B code interpreter's name for it too)."""


class Kernels:
    def __init__(self, service: SandboxService):
        self.service = service
        self.kernels: dict[str, Kernel] = {}
        self.languages: dict[str, dict[str, str]] = {}
        """Per sandbox, the language of each context ``/v1`` made (its first cell's)."""

    def context(self, e: Entry, context: str, language: str) -> str:
        """The context a ``/v1`` cell of ``language`` runs in: ``context``, or for a bash cell
        of the default context, :data:`DEFAULT_BASH`. ConfigError (400) for a cell of the other
        language than its context's."""
        if language == "bash" and context == "default":
            context = DEFAULT_BASH
        known = self.languages.setdefault(e.sb.id, {})
        was = known.setdefault(context, language)
        if was != language:
            raise ConfigError(f"context {context!r} of sandbox {e.sb.id} runs {was}, not {language}: its first "
                              "cell chose; use another context for the other language")
        return context

    def get(self, e: Entry) -> Kernel:
        """The sandbox's kernel (made, not started, on first use); a closed sandbox's are
        dropped here (its kernel ended with it)."""
        for gone in [sid for sid in self.kernels if sid not in self.service.live]:
            del self.kernels[gone]
            self.languages.pop(gone, None)
        k = self.kernels.get(e.sb.id)
        if k is None:
            k = self.kernels[e.sb.id] = Kernel(e.sb, cwd=e.spec.workdir)
        return k
