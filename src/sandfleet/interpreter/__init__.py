"""Stateful Python in a sandbox, without Jupyter: :class:`Kernel` runs cells in a REPL
server (:mod:`.repl`) that it starts in the sandbox on first use.

    kernel = Kernel(sb)
    await kernel.run("x = 1")
    assert (await kernel.run("x += 1; x")).text == "2"
"""

from sandfleet.interpreter.kernel import Execution, Kernel, KernelError

__all__ = ["Execution", "Kernel", "KernelError"]
